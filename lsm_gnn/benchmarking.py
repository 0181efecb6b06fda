"""Helpers the benchmark scripts share: timing medians, result files and reused datasets."""
from __future__ import annotations

import json
import os
import statistics
import time

from lsm_gnn.data.format import DatasetError, open_dataset
from lsm_gnn.fileio import atomic_write_bytes


def median_seconds(fn, repeats: int, warmup: bool = True) -> float:
    """Median wall seconds of ``fn()`` over ``repeats`` calls (after one untimed call if ``warmup``)."""
    if warmup:
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def write_json(path: str, result, indent: int = 2) -> None:
    """Writes a result file atomically (a killed run never leaves half a JSON behind)."""
    atomic_write_bytes(json.dumps(result, indent=indent).encode(), path)


def reusable_dataset(path: str, *, num_nodes: int, feature_dim: int | None = None, feature_dtype: str | None = None,
                     generator: dict | None = None, log=None):
    """The dataset an earlier run left at ``path`` if it opens and matches, else None (the caller writes it).

    It matches when it has ``num_nodes`` nodes and, where given, ``feature_dim``, ``feature_dtype``
    (a numpy name) and the ``generator`` settings recorded in its meta. An unreadable one is reported
    through ``log`` when given.
    """
    if not os.path.isdir(path):
        return None
    try:
        ds = open_dataset(path, check="shape")
    except DatasetError as exc:
        if log is not None:
            log(f"  {path} is unusable ({exc}); re-creating it")
        return None
    recorded = ds.meta.get("generator") or {}
    if ds.num_nodes != num_nodes or (feature_dim is not None and ds.feature_dim != feature_dim) \
            or (feature_dtype is not None and ds.feature_dtype.name != feature_dtype) \
            or any(recorded.get(key) != value for key, value in (generator or {}).items()):
        return None
    return ds
