"""GPU kernels in Triton, and the switch that runs them on CPU tensors too.

Each native op is registered once with ``torch.library`` (:mod:`lsm_gnn.kernels.ops`): the C++ core for
CPU tensors, the Triton kernel for CUDA tensors. With the kernel mode ``triton`` (config key ``kernels``,
or ``LSM_GNN_KERNELS=triton``) CPU tensors go to the Triton kernels as well, run by Triton's interpreter
(``TRITON_INTERPRET=1``): the very source a GPU compiles, checked on machines without one. It is slow
(programs run one at a time) and meant for tests and small runs.
"""
from __future__ import annotations

import os
import sys

KERNELS_ENV = "LSM_GNN_KERNELS"
MODES = ("native", "triton")
_mode: str | None = None  # set_kernel_mode's choice; None: the environment's


def use_interpreter_without_gpu() -> None:
    """Triton decides at its own import whether its kernels (``tl.sum``, ``tl.max``... are kernels too) run
    in its interpreter; without a GPU that is the only way they can run. Called by ``import lsm_gnn``,
    before anything imports triton; a TRITON_INTERPRET already set is left alone."""
    import torch

    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def kernel_mode() -> str:
    """``native`` (C++ on CPU tensors, Triton on CUDA ones) or ``triton`` (Triton everywhere)."""
    mode = _mode if _mode is not None else os.environ.get(KERNELS_ENV, "native").strip() or "native"
    if mode not in MODES:
        raise ValueError(f"{KERNELS_ENV}={mode!r} is not a kernel mode; use one of {', '.join(MODES)}")
    return mode


def kernel_setting() -> str | None:
    """What :func:`set_kernel_mode` last chose (None: the environment decides), to give back later."""
    return _mode


def set_kernel_mode(mode: str | None) -> None:
    """Chooses the kernels for CPU tensors (None: back to ``LSM_GNN_KERNELS``)."""
    global _mode
    if mode is not None and mode not in MODES:
        raise ValueError(f"kernels={mode!r} is not a kernel mode; use one of {', '.join(MODES)}")
    _mode = mode


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
