"""The ``gds`` backend: GPUDirect Storage through KvikIO, rows land in GPU memory.

Needs a CUDA GPU, its driver and the ``kvikio`` package. Its own logic (runs
of ids cut into requests, file offsets, request order) is tested without them
against a stand-in for KvikIO's documented ``CuFile.pread`` API
(tests/test_storage.py); KvikIO itself has not yet run under it.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from lsm_gnn.storage.base import CountingStorage


class GdsStorage(CountingStorage):
    backend = "gds"

    def __init__(self, dataset, device: str | torch.device = "cuda", max_request_bytes: int = 128 << 10):
        try:
            import kvikio
        except ImportError as exc:
            raise RuntimeError("backend 'gds' needs KvikIO (pip install kvikio-cu12) and a CUDA GPU; "
                               "use backend='io_uring' otherwise") from exc
        if not torch.cuda.is_available():
            raise RuntimeError("backend 'gds' needs a CUDA GPU; torch.cuda.is_available() is False")
        layout = dataset.features
        super().__init__(dataset.num_nodes, layout.dim, layout.dtype)
        self._device = torch.device(device)
        self._stride = layout.row_stride
        self._max_rows = max(1, max_request_bytes // layout.row_stride)
        self._file = kvikio.CuFile(dataset.feature_path, "r")

    @property
    def device(self) -> torch.device:
        return self._device

    def _read(self, ids: torch.Tensor, out: torch.Tensor) -> None:
        start = time.perf_counter()
        if int(ids.min()) < 0 or int(ids.max()) >= self.num_rows:
            raise IndexError(f"node ids must lie in [0, {self.num_rows}), got [{int(ids.min())}, {int(ids.max())}]")
        unique, inverse = np.unique(ids.numpy(), return_inverse=True)
        # Runs of consecutive ids, cut at max_rows, each one pread into the staging buffer.
        breaks = np.flatnonzero(np.diff(unique) != 1) + 1
        staging = torch.empty((unique.size, self._stride), dtype=torch.uint8, device=self._device)
        futures, requests = [], 0
        for run in np.split(np.arange(unique.size), breaks):
            for lo in range(0, run.size, self._max_rows):
                part = run[lo:lo + self._max_rows]
                first, count = int(part[0]), int(part.size)
                view = staging[first:first + count]
                futures.append(self._file.pread(view, count * self._stride, int(unique[first]) * self._stride))
                requests += 1
        for f in futures:
            f.get()
        rows = staging[:, :self.row_bytes].contiguous().view(self.dtype)
        torch.index_select(rows, 0, torch.from_numpy(inverse.reshape(-1)).to(self._device), out=out)
        self._count(ids.numel(), time.perf_counter() - start, unique_rows=unique.size, requests=requests,
                    bytes_read=unique.size * self._stride, bytes_useful=unique.size * self.row_bytes)

    def close(self) -> None:
        super().close()
        self._file.close()
