"""The ``memory`` backend: the whole feature file loaded into RAM.

For tests and graphs that fit; also the in-memory ceiling benchmarks
compare against. Counts no bytes read (nothing touches storage after load).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from lsm_gnn.storage.base import CountingStorage


class MemoryStorage(CountingStorage):
    backend = "memory"

    def __init__(self, dataset):
        layout = dataset.features
        super().__init__(dataset.num_nodes, layout.dim, layout.dtype)
        raw = np.fromfile(dataset.feature_path, dtype=np.uint8, count=dataset.num_nodes * layout.row_stride)
        rows = raw.reshape(dataset.num_nodes, layout.row_stride)[:, :layout.row_bytes]
        self._rows = torch.from_numpy(np.ascontiguousarray(rows)).view(self.dtype)

    def _read(self, ids: torch.Tensor, out: torch.Tensor) -> None:
        start = time.perf_counter()
        if int(ids.min()) < 0 or int(ids.max()) >= self.num_rows:
            bad = int(torch.nonzero((ids < 0) | (ids >= self.num_rows))[0])
            raise IndexError(f"node id {int(ids[bad])} at position {bad} is out of range: the feature file has "
                             f"{self.num_rows} rows (valid ids are 0..{self.num_rows - 1})")
        torch.index_select(self._rows, 0, ids, out=out)
        self._count(ids.numel(), time.perf_counter() - start)
