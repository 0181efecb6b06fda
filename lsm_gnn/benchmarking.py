"""Helpers the benchmark scripts share: timing medians and result files."""
from __future__ import annotations

import json
import os
import statistics
import tempfile
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


def write_json(path: str, result, indent: int = 2) -> None:
    """Writes a result file atomically (a killed run never leaves half a JSON behind)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(result, fh, indent=indent)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
