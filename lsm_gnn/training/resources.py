"""What a training run holds on its machine for its whole life, and gives back at its end.

- the ``kernels=`` scope (:class:`lsm_gnn.kernels.using`: the process's mode, which the loader thread reads
  too, from the start to :meth:`RunResources.close`);
- rank 0's locks on the directories it writes (``checkpoint.dir``, ``log.dir``), taken after proving them
  writable, and the refusal of a ``last.pt``/``best.pt`` the run did not write;
- the check of the data beside training (``data.verify``, :mod:`lsm_gnn.data.verify`);
- torch's thread count for the training step (``train.threads``), set back at the end.

:class:`~lsm_gnn.training.trainer.Trainer` makes one first and closes it in :meth:`~lsm_gnn.training.trainer.Trainer.close`, or at
once when the trainer cannot be made: a failed start leaves no lock held, no thread running and no setting changed.
"""
from __future__ import annotations

import os
import tempfile

import torch

from lsm_gnn.config import Config, ConfigError
from lsm_gnn.data.verify import resolve_mode, start_verify
from lsm_gnn.kernels import using
from lsm_gnn.training.checkpoint_files import check_replaceable
from lsm_gnn.utils.fileio import RunLock


class RunResources:
    """Enters the ``kernels`` scope now; :meth:`lock_outputs` and :meth:`start_verify` take the rest."""

    def __init__(self, kernels: str):
        self._kernels = using(kernels).__enter__()  # left by close(), however the run ends or is dropped
        self.locks: list[RunLock] = []
        #: the data check's mode for this dataset (``auto`` resolved) and its checker on rank 0, else None
        self.verify_mode = "off"
        self.verify = None
        self._threads_before: int | None = None
        self._released = False

    def use_threads(self, setting: int) -> None:
        """torch's intra-op threads for the run (:func:`training_threads` of ``train.threads``); :meth:`close`
        sets the old count back."""
        if self._threads_before is None:
            threads = training_threads(setting)
            self._threads_before = torch.get_num_threads()
            torch.set_num_threads(threads)

    def lock_outputs(self, cfg: Config) -> None:
        """Rank 0, the only writer: fails now, not after an epoch of training, on a directory it cannot write,
        one another run holds, or a checkpoint file it did not write."""
        for key, directory in (("checkpoint.dir", cfg.checkpoint.dir), ("log.dir", cfg.log.dir)):
            if directory:
                check_writable_dir(directory, key)
                # A second run on the same directory is refused before it reads or writes anything there.
                self.locks.append(RunLock(directory, key))
        if cfg.checkpoint.dir:  # files a run would write over must be its own
            for name in ("last.pt", "best.pt"):
                check_replaceable(os.path.join(cfg.checkpoint.dir, name))

    def start_verify(self, dataset, mode: str, checking: bool) -> None:
        """Resolves ``data.verify`` for ``dataset`` (on every rank: an impossible mode fails everywhere) and, where
        ``checking`` (rank 0), starts the check."""
        self.verify_mode = resolve_mode(dataset, mode)
        if checking:
            self.verify = start_verify(dataset, self.verify_mode)

    def check_batch(self, batch) -> None:
        """Raises the damage found so far (stop before training on more of it), then hands ``batch`` over."""
        if self.verify is not None:
            self.verify.check()
            self.verify.offer(batch)

    def finish_verify(self) -> float:
        """Waits for the checks still queued (a run that ends normally read only data that matched); the seconds
        waited."""
        return 0.0 if self.verify is None else self.verify.finish()

    def stop_verify(self) -> None:
        if self.verify is not None:
            self.verify.close()

    def close(self) -> None:
        """Stops the check, gives up the locks and leaves the ``kernels`` scope (once; later calls do nothing):
        the mode of the newest scope still open (or the process's default) decides again. A trainer dropped
        without closing does this when it is collected, which is safe: leaving a scope never undoes another's."""
        if self._released:
            return
        self._released = True
        self.stop_verify()
        for lock in self.locks:
            lock.release()
        self.locks = []
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
        self._kernels.close()


def training_threads(setting: int) -> int:
    """torch's threads for a run's training step: ``train.threads``, or for 0 one fewer than torch's default (at
    least one), so the loader's thread has a core of its own. Measured on 2 cores, one training thread was as
    fast or faster than two in every run, compute-bound ones included (docs/benchmarks/pipeline.md, "Threads")."""
    return setting if setting else max(1, torch.get_num_threads() - 1)


def check_writable_dir(directory: str, key: str) -> None:
    """Creates ``directory`` and proves it writable, or raises a ConfigError naming ``key``."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ConfigError(f"{key}={directory} is a file, not a directory; point {key} at a directory")
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise ConfigError(f"{key}={directory} is not writable ({exc.strerror or exc}); point {key} at a "
                          "writable directory") from None
