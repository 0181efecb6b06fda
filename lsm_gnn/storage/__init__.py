"""The storage engine: feature rows by node id, from SSD (the cache's miss path)."""
from __future__ import annotations

import os
import warnings

from lsm_gnn.storage.base import FeatureStorage, StorageStats
from lsm_gnn.storage.table import EmbeddingTable, TableError

# The one table of backend names; the CLI, configs and docs read it.
BACKENDS = {
    "io_uring": "io_uring with O_DIRECT and registered buffers (default on Linux)",
    "pread": "a pread thread pool with O_DIRECT (fallback when io_uring is unavailable)",
    "mmap": "memory-mapped file (baseline only)",
    "memory": "the whole feature file loaded into RAM (tests, small graphs)",
    "gds": "GPUDirect Storage via KvikIO (GPU machines with kvikio)",
    "pinned": "the whole feature file in page-locked host memory, rows read by the GPU over UVA (a GPU cache's "
              "misses without a disk)",
}


def default_backend() -> str:
    """``$LSM_GNN_STORAGE_BACKEND`` if set, else io_uring where the kernel allows it, else pread."""
    env = os.environ.get("LSM_GNN_STORAGE_BACKEND")
    if env:
        return env
    from lsm_gnn import _C

    if _C.io_uring_available():
        return "io_uring"
    warnings.warn("io_uring is unavailable here (kernel.io_uring_disabled or a seccomp filter); "
                  "falling back to the pread backend", RuntimeWarning, stacklevel=3)
    return "pread"


def open_storage(dataset, backend: str = "auto", **options) -> FeatureStorage:
    """Opens the feature file of ``dataset`` (a :class:`~lsm_gnn.data.Dataset` or its path).

    Options: ``queue_depth`` (reads in flight, default 64), ``direct``
    (O_DIRECT, default True), ``max_request_bytes`` (longest coalesced read,
    default "128K") for io_uring/pread/mmap; ``device`` for gds and pinned (where reads land; default the
    current CUDA device).
    """
    from lsm_gnn.data import open_dataset

    if isinstance(dataset, (str, os.PathLike)):
        dataset = open_dataset(dataset, check="shape")
    types = getattr(dataset, "node_types", ())  # a Dataset's; a NodeType is one file already
    if len(types) > 1:
        raise ValueError(f"dataset {dataset.path} has a feature file per node type ({', '.join(types)}); open one "
                         f"type's: open_storage(dataset.node_type({dataset.target!r}))")
    if backend == "auto":
        backend = default_backend()
    if backend not in BACKENDS:
        raise ValueError(f"unknown storage backend {backend!r}; valid names are {', '.join(BACKENDS)} or 'auto'")
    if backend in ("io_uring", "pread", "mmap"):
        from lsm_gnn.storage.native import NativeStorage

        return NativeStorage(dataset, backend, **options)
    if options:
        takes = {"memory": set(), "pinned": {"device"}, "gds": {"device", "max_request_bytes"}}[backend]
        unknown = sorted(set(options) - takes)
        if unknown:
            raise TypeError(f"backend {backend!r} takes no option(s) {unknown}")
    if backend == "memory":
        from lsm_gnn.storage.memory import MemoryStorage

        return MemoryStorage(dataset)
    if backend == "pinned":
        from lsm_gnn.storage.pinned import PinnedStorage

        return PinnedStorage(dataset, **options)
    from lsm_gnn.storage.gds import GdsStorage

    return GdsStorage(dataset, **options)


__all__ = ["BACKENDS", "EmbeddingTable", "FeatureStorage", "StorageStats", "TableError", "default_backend",
           "open_storage"]
