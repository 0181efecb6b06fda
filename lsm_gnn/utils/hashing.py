"""splitmix64, the one integer hash the native code, the Triton kernels and Python share
(``csrc/cache/line_state.h``'s ``mix64``): cache sets, sampler streams, per-relation seeds."""
from __future__ import annotations

import numpy as np

_MASK64 = (1 << 64) - 1


def splitmix64(ids: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer (a bijection on 64-bit integers), vectorized."""
    z = np.asarray(ids).astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def mix64(value: int) -> int:
    """splitmix64 of one integer, taken modulo 2**64."""
    return int(splitmix64(np.array([value & _MASK64], dtype=np.uint64))[0])
