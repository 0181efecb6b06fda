"""GPU kernels in Triton, and the switch that runs them on CPU tensors too.

Each native op is registered once with ``torch.library`` (:mod:`lsm_gnn.kernels.ops`): the C++ core for
CPU tensors, the Triton kernel for CUDA tensors. With the kernel mode ``triton`` (config key ``kernels``,
or ``LSM_GNN_KERNELS=triton``) CPU tensors go to the Triton kernels as well, run by Triton's interpreter
(``TRITON_INTERPRET=1``): the very source a GPU compiles, checked on machines without one. It is slow
(programs run one at a time) and meant for tests and small runs.

The mode is chosen for a scope, ``with using("triton"): ...`` (a trainer holds one for its life), over the
process's default (:func:`set_kernel_mode`, else ``LSM_GNN_KERNELS``). It is one setting for the whole process,
not per thread: a loader's background thread must run the kernels its trainer chose.
"""
from __future__ import annotations

import os
import sys
import threading

KERNELS_ENV = "LSM_GNN_KERNELS"
MODES = ("native", "triton")
_mode: str | None = None  # set_kernel_mode's choice; None: the environment's
# The scopes entered, oldest first: the newest still open decides. A tuple swapped whole under the lock, so
# kernel_mode() (on any thread, at every op) reads a consistent one without taking it.
_scopes: tuple = ()
_scopes_lock = threading.Lock()


def use_interpreter_without_gpu() -> None:
    """Triton decides at its own import whether its kernels (``tl.sum``, ``tl.max``... are kernels too) run
    in its interpreter; without a GPU that is the only way they can run. Called by ``import lsm_gnn``,
    before anything imports triton; a TRITON_INTERPRET already set is left alone."""
    import torch

    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def kernel_mode() -> str:
    """``native`` (C++ on CPU tensors, Triton on CUDA ones) or ``triton`` (Triton everywhere)."""
    mode = kernel_setting()
    if mode is None:
        mode = os.environ.get(KERNELS_ENV, "native").strip() or "native"
    if mode not in MODES:
        raise ValueError(f"{KERNELS_ENV}={mode!r} is not a kernel mode; use one of {', '.join(MODES)}")
    return mode


def kernel_setting() -> str | None:
    """The mode chosen in code: the newest open :class:`using` scope's, else :func:`set_kernel_mode`'s
    (None: the environment decides)."""
    for scope in reversed(_scopes):
        if scope.is_open:
            return scope.mode
    return _mode


def _check_mode(mode: str | None) -> None:
    if mode is not None and mode not in MODES:
        raise ValueError(f"kernels={mode!r} is not a kernel mode; use one of {', '.join(MODES)}")


def set_kernel_mode(mode: str | None) -> None:
    """Chooses the process's default kernels for CPU tensors (None: back to ``LSM_GNN_KERNELS``); an open
    :class:`using` scope still decides while it lasts."""
    global _mode
    _check_mode(mode)
    _mode = mode


class using:  # noqa: N801 -- read as a function: ``with kernels.using("triton"):``
    """The kernel mode ``mode`` from entering to leaving (or :meth:`close`); then the mode before decides again.

    Scopes may close out of order (two trainers, the first closed first): leaving one drops it wherever it is,
    and the newest scope still open decides, so a scope never restores a mode that a later one chose. Closing
    takes no lock (a trainer's finalizer closes its scope, on whichever thread collects it); closed scopes are
    dropped at the next entry. ``mode`` None chooses nothing: the mode stays what it is.
    """

    def __init__(self, mode: str | None):
        _check_mode(mode)
        self.mode = mode
        self.is_open = False
        self._entered = False

    def __enter__(self) -> using:
        global _scopes
        if self._entered:
            raise RuntimeError(f"kernels.using({self.mode!r}) was entered already; make a new one")
        self._entered = True
        if self.mode is not None:
            self.is_open = True
            with _scopes_lock:
                _scopes = tuple(scope for scope in _scopes if scope.is_open) + (self,)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Leaves the scope (later calls do nothing)."""
        self.is_open = False


def triton_interpreted() -> bool:
    """Whether triton, as imported in this process, runs kernels in its interpreter (decided at its import)."""
    import triton

    return type(triton.language.sum).__name__ == "InterpretedFunction"


def triton_module(name: str, on_cpu: bool):
    """Imports the Triton kernels of ``lsm_gnn.kernels.<name>``; for CPU tensors they need the interpreter."""
    import importlib

    try:
        import triton
    except ImportError as exc:
        raise RuntimeError(f"the Triton kernels need the triton package ({exc}); install it with "
                           "'pip install --no-deps triton' (scripts/install.sh does), or use kernels=native") from None
    if on_cpu and not triton_interpreted():
        raise RuntimeError("the Triton kernels cannot run on CPU tensors in this process: triton was imported "
                           "without its interpreter (TRITON_INTERPRET=1 must be set before triton is imported; "
                           "lsm-gnn sets it on machines without a GPU). Use kernels=native for CPU tensors")
    return importlib.import_module(f"lsm_gnn.kernels.{name}")
