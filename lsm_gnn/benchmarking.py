"""Helpers the benchmark scripts share: timing medians and result files."""
from __future__ import annotations

import json
import statistics
import time

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
