"""What a training run holds on its machine for its whole life, and gives back at its end.

- the process's ``kernels=`` setting (the loader thread reads it too), restored to what it was before;
- rank 0's locks on the directories it writes (``checkpoint.dir``, ``log.dir``), taken after proving them
  writable, and the refusal of a ``last.pt``/``best.pt`` the run did not write;
- the check of the data beside training (``data.verify``, :mod:`lsm_gnn.data.verify`).

:class:`~lsm_gnn.trainer.Trainer` makes one first and closes it in :meth:`~lsm_gnn.trainer.Trainer.close`, or at
once when the trainer cannot be made: a failed start leaves no lock held, no thread running and no setting changed.
"""
from __future__ import annotations

import os
import tempfile

from lsm_gnn.checkpoint import check_replaceable
from lsm_gnn.config import Config, ConfigError
from lsm_gnn.data.verify import resolve_mode, start_verify
from lsm_gnn.fileio import RunLock
from lsm_gnn.kernels import kernel_setting, set_kernel_mode


class RunResources:
    """Sets ``kernels`` for the process now; :meth:`lock_outputs` and :meth:`start_verify` take the rest."""

    def __init__(self, kernels: str):
        self._kernels_before = kernel_setting()
        set_kernel_mode(kernels)
        self._kernels_set = kernels
        self.locks: list[RunLock] = []
        #: the data check's mode for this dataset (``auto`` resolved) and its checker on rank 0, else None
        self.verify_mode = "off"
        self.verify = None
        self._released = False

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

    def release(self) -> None:
        """Stops the check and gives up the locks (once; later calls do nothing). What a trainer dropped without
        :meth:`close` does when it is collected: ``kernels`` stays, since another trainer may have set it since."""
        if self._released:
            return
        self._released = True
        self.stop_verify()
        for lock in self.locks:
            lock.release()
        self.locks = []

    def close(self) -> None:
        """:meth:`release`, and ``kernels`` back to what it was if it is still the one this run set."""
        self.release()
        if self._kernels_set is not None and kernel_setting() == self._kernels_set:
            set_kernel_mode(self._kernels_before)
        self._kernels_set = None  # restored once


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
