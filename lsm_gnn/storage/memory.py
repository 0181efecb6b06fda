"""The ``memory`` backend: the whole feature file loaded into RAM.

For tests and graphs that fit; also the in-memory ceiling benchmarks
compare against. Counts no bytes read (nothing touches storage after load).
"""
from __future__ import annotations

import threading
import time

import numpy as np
import torch

from lsm_gnn.storage.base import FeatureStorage, StorageStats


class MemoryStorage(FeatureStorage):
    backend = "memory"

    def __init__(self, dataset):
        layout = dataset.features
        super().__init__(dataset.num_nodes, layout.dim, layout.dtype)
        raw = np.fromfile(dataset.feature_path, dtype=np.uint8, count=dataset.num_nodes * layout.row_stride)
        rows = raw.reshape(dataset.num_nodes, layout.row_stride)[:, :layout.row_bytes]
        self._rows = torch.from_numpy(np.ascontiguousarray(rows)).view(self.dtype)
        self._lock = threading.Lock()
        self._stats = StorageStats(backend=self.backend)

    def _read(self, ids: torch.Tensor, out: torch.Tensor) -> None:
        start = time.perf_counter()
        if int(ids.min()) < 0 or int(ids.max()) >= self.num_rows:
            bad = int(torch.nonzero((ids < 0) | (ids >= self.num_rows))[0])
            raise IndexError(f"node id {int(ids[bad])} at position {bad} is out of range: the feature file has "
                             f"{self.num_rows} rows (valid ids are 0..{self.num_rows - 1})")
        torch.index_select(self._rows, 0, ids, out=out)
        elapsed = time.perf_counter() - start
        with self._lock:
            s = self._stats
            s.batches += 1
            s.rows += ids.numel()
            s.total_seconds += elapsed
            s.last_batch_seconds = elapsed
            s.max_batch_seconds = max(s.max_batch_seconds, elapsed)

    def stats(self) -> StorageStats:
        with self._lock:
            return StorageStats(**{k: v for k, v in vars(self._stats).items()})

    def reset_stats(self) -> None:
        with self._lock:
            self._stats = StorageStats(backend=self.backend)
