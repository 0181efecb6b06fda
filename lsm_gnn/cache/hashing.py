"""Cache geometry: which set a node id lives in.

The C++ and CUDA caches hash ids the same way (``csrc/cache/line_state.h``); the
reference model and the capacity planner use these to agree with them.
"""
from __future__ import annotations

import numpy as np

from lsm_gnn.hashing import splitmix64


def set_of(ids, num_sets: int) -> np.ndarray:
    """The set of each id: ``splitmix64(id) % num_sets``."""
    return (splitmix64(np.asarray(ids, dtype=np.int64)) % np.uint64(num_sets)).astype(np.int64)
