"""Backends of the native storage engine: io_uring, pread, mmap."""
from __future__ import annotations

import warnings

import torch

from lsm_gnn.storage.base import FeatureStorage, StorageStats
from lsm_gnn.utils.units import parse_bytes


class NativeStorage(FeatureStorage):
    """Rows read by ``lsm_gnn._C.RowReader``: sorted, deduplicated, coalesced
    into aligned runs, many in flight; the GIL is released while reading."""

    from_disk = True

    def __init__(self, dataset, backend: str, queue_depth: int = 64, direct: bool = True,
                 max_request_bytes: int | str = "128K"):
        from lsm_gnn import _C

        layout = dataset.features
        super().__init__(dataset.num_nodes, layout.dim, layout.dtype)
        if not 1 <= int(queue_depth) <= 4096:
            raise ValueError(f"queue_depth must be in 1..4096, got {queue_depth}")
        self.backend = backend
        self.path = dataset.feature_path
        self.queue_depth = int(queue_depth)
        self._reader = _C.RowReader(backend, self.path, dataset.num_nodes, layout.row_bytes, layout.row_stride, 0,
                                    self.queue_depth, bool(direct), parse_bytes(max_request_bytes))
        if backend == "io_uring" and not self._reader.registered_buffers:
            # Pinning queue_depth x max_request_bytes of staging memory failed (RLIMIT_MEMLOCK):
            # reads still work, a few percent slower.
            warnings.warn(
                f"io_uring could not register its {self.queue_depth} staging buffers (locked-memory limit, "
                f"see 'ulimit -l'); reading without them. Raise the limit or lower queue_depth/max_request_bytes.",
                RuntimeWarning, stacklevel=3)

    @property
    def registered_buffers(self) -> bool:
        """io_uring only: whether the staging buffers are registered with the ring (faster)."""
        return self._reader.registered_buffers

    @property
    def alignment(self) -> int:
        """Bytes every read is aligned to (the file's O_DIRECT alignment; what ``_C.plan_reads`` takes)."""
        return int(self._reader.alignment)

    @property
    def direct(self) -> bool:
        """Whether reads bypass the page cache (O_DIRECT); False where the file system refused it."""
        return self._reader.direct

    def _read(self, ids: torch.Tensor, out: torch.Tensor) -> None:
        self._reader.read(ids, out.view(torch.uint8).view(-1))

    def _read_into(self, ids: torch.Tensor, out: torch.Tensor, slots: torch.Tensor) -> None:
        self._reader.read(ids, out.view(torch.uint8).view(-1), slots)  # each row from its read buffer to its slot

    def stats(self) -> StorageStats:
        c = self._reader.counters()
        return StorageStats(
            backend=self.backend, batches=c["batches"], rows=c["rows"], unique_rows=c["unique_rows"],
            requests=c["requests"], bytes_read=c["bytes_read"], bytes_useful=c["bytes_useful"],
            total_seconds=c["total_ns"] * 1e-9, last_batch_seconds=c["last_batch_ns"] * 1e-9,
            max_batch_seconds=c["max_batch_ns"] * 1e-9, busy_seconds=c["busy_ns"] * 1e-9,
        )

    def reset_stats(self) -> None:
        self._reader.reset_counters()

    def close(self) -> None:
        super().close()
        self._reader = None
