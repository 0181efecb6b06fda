"""A quick read-throughput probe of a dataset's feature file, per backend.

What `lsm-gnn bench storage` runs: enough for a user to check a disk and
pick a backend. The formal comparison with fio lives in benchmarks/.
"""
from __future__ import annotations

import os
import time

import numpy as np

from lsm_gnn.storage import open_storage


def evict_page_cache(path: str) -> None:
    """Drops the file's pages from the page cache so buffered reads start cold."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def probe_backend(dataset, backend: str, batch_size: int = 4096, seconds: float = 2.0, seed: int = 0,
                  **options) -> dict:
    """Reads random batches of distinct ids for about ``seconds``; returns throughput and counters."""
    rng = np.random.default_rng(seed)
    batch_size = min(batch_size, dataset.num_nodes)
    if backend in ("mmap", "memory"):
        evict_page_cache(dataset.feature_path)
    with open_storage(dataset, backend, **options) as storage:
        rows = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            storage.read(rng.choice(dataset.num_nodes, batch_size, replace=False))
            rows += batch_size
        elapsed = time.perf_counter() - start
        stats = storage.stats()
    return {
        "backend": backend, "rows": rows, "seconds": elapsed, "rows_per_s": rows / elapsed,
        "gb_per_s": rows * dataset.features.row_bytes / elapsed / 1e9, "amplification": stats.amplification,
        "mean_batch_ms": stats.mean_batch_seconds * 1e3, "max_batch_ms": stats.max_batch_seconds * 1e3,
    }
