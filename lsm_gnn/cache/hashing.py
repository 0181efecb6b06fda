"""Cache geometry: which set a node id lives in.

The C++ and CUDA caches hash ids the same way (``csrc/cache/line_state.h``); the
reference model and the capacity planner use these to agree with them.
"""
from __future__ import annotations

import numpy as np


def splitmix64(ids: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer (a bijection on 64-bit integers), vectorized."""
    z = np.asarray(ids).astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def set_of(ids, num_sets: int) -> np.ndarray:
    """The set of each id: ``splitmix64(id) % num_sets``."""
    return (splitmix64(np.asarray(ids, dtype=np.int64)) % np.uint64(num_sets)).astype(np.int64)
