"""Wall-clock medians, for the planner's calibration and the benchmark scripts."""
from __future__ import annotations

import statistics
import time


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
