"""The ``memory`` backend: the whole feature file loaded into RAM.

For tests and graphs that fit; also the in-memory ceiling benchmarks
compare against. Counts no bytes read (nothing touches storage after load).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from lsm_gnn.storage.base import CountingStorage
from lsm_gnn.utils.hostmem import host_zeros


class MemoryStorage(CountingStorage):
    backend = "memory"
    CHUNK_BYTES = 64 << 20

    def __init__(self, dataset):
        layout = dataset.features
        super().__init__(dataset.num_nodes, layout.dim, layout.dtype)
        # On huge pages, like a cache's lines, so the ceiling's gather pays the same TLB cost as a cache hit;
        # read in chunks: no second copy of the file in memory while the padding is dropped.
        table = host_zeros((dataset.num_nodes, layout.row_bytes), torch.uint8)
        rows_per_chunk = max(1, self.CHUNK_BYTES // layout.row_stride)
        with open(dataset.feature_path, "rb") as f:
            for start in range(0, dataset.num_nodes, rows_per_chunk):
                count = min(rows_per_chunk, dataset.num_nodes - start)
                raw = np.fromfile(f, dtype=np.uint8, count=count * layout.row_stride)
                if raw.size != count * layout.row_stride:
                    raise ValueError(f"{dataset.feature_path} ends at row {start + raw.size // layout.row_stride} "
                                     f"of {dataset.num_nodes}: the feature file is truncated")
                rows = raw.reshape(count, layout.row_stride)[:, :layout.row_bytes]
                table[start:start + count] = torch.from_numpy(rows)
        self._rows = table.view(self.dtype)

    #: rows written stay in memory: the file is never changed (a trainable table held in RAM)
    writable = True

    def _write(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        self._rows.index_copy_(0, ids, rows)

    def _read(self, ids: torch.Tensor, out: torch.Tensor) -> None:
        start = time.perf_counter()
        self._check_ids(ids)
        torch.index_select(self._rows, 0, ids, out=out)
        self._count(ids.numel(), time.perf_counter() - start)

    def _check_ids(self, ids: torch.Tensor) -> None:
        """Refuses an id out of range, naming it and its position (``ids``: the host's, so no device sync)."""
        if int(ids.min()) < 0 or int(ids.max()) >= self.num_rows:
            bad = int(torch.nonzero((ids < 0) | (ids >= self.num_rows))[0])
            raise IndexError(f"node id {int(ids[bad])} at position {bad} is out of range: the feature file has "
                             f"{self.num_rows} rows (valid ids are 0..{self.num_rows - 1})")


class DeviceMemoryStorage(MemoryStorage):
    """The whole feature table in a GPU's memory (``cache.features=device``): the ceiling of a GPU run, what a user
    whose features fit on the device would write (one index_select per batch, rows already where the model is)."""

    backend = "device"

    def __init__(self, dataset, device: str | torch.device):
        self._device = torch.device(device)
        if self._device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"cache.features=device needs a CUDA device, and torch sees none (asked for "
                               f"{device!r}); use cache.features=memory to hold the features in RAM")
        super().__init__(dataset)
        self._rows = self._rows.to(self._device)

    @property
    def device(self) -> torch.device:
        return self._device

    def _read(self, ids: torch.Tensor, out: torch.Tensor) -> None:
        start = time.perf_counter()
        self._check_ids(ids)
        torch.index_select(self._rows, 0, ids.to(self._device, non_blocking=True), out=out)
        self._count(ids.numel(), time.perf_counter() - start)
