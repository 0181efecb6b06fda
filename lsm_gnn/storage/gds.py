"""The ``gds`` backend: GPUDirect Storage through KvikIO, rows land in GPU memory.

Needs a CUDA GPU, its driver and the ``kvikio`` package. Its own logic (runs
of ids cut into requests, file offsets, request order) is tested without them
against a stand-in for KvikIO's documented ``CuFile.pread`` API
(tests/fake_kvikio.py), and so is a cache over it (tests/test_gds_cache.py, which
benchmarks/gpu_suite.sh also runs with the real KvikIO in its compatibility mode where it imports).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from lsm_gnn.data.format import ROW_ALIGNMENT
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
        if self._device.type == "cuda" and self._device.index is None:  # as a cache on "cuda" names it: cuda:N
            self._device = torch.device("cuda", torch.cuda.current_device())
        self._stride = layout.row_stride
        self._max_request = int(max_request_bytes)
        # Staging slots are whole multiples of this, so every row lands at a multiple of the stride.
        self._slot_unit = max(layout.row_stride, ROW_ALIGNMENT)
        self._file = kvikio.CuFile(dataset.feature_path, "r")

    @property
    def device(self) -> torch.device:
        """Where reads land (rows read into GPU memory): a cache on this device reads its misses into its lines."""
        return self._device

    def _read(self, ids: torch.Tensor, out: torch.Tensor) -> None:
        start = time.perf_counter()
        if int(ids.min()) < 0 or int(ids.max()) >= self.num_rows:
            raise IndexError(f"node ids must lie in [0, {self.num_rows}), got [{int(ids.min())}, {int(ids.max())}]")
        unique, inverse = np.unique(ids.numpy(), return_inverse=True)
        offsets, lengths, first_rows = self._plan(unique)
        slots = -(-lengths // self._slot_unit) * self._slot_unit
        slot_starts = np.concatenate([[0], np.cumsum(slots)[:-1]])
        staging = torch.empty(int(slots.sum()), dtype=torch.uint8, device=self._device)
        futures = [self._file.pread(staging[int(p):int(p) + int(n)], int(n), int(o))
                   for p, n, o in zip(slot_starts, lengths, offsets)]
        for f in futures:
            f.get()
        # Row i of ``unique`` sits in the read r that serves it, at its own offset inside that read.
        run_of_row = np.repeat(np.arange(offsets.size), np.diff(np.append(first_rows, unique.size)))
        position = (slot_starts[run_of_row] + unique * self._stride - offsets[run_of_row]) // self._stride
        rows = staging.view(-1, self._stride)[:, :self.row_bytes].contiguous().view(self.dtype)
        order = torch.from_numpy(position[inverse.reshape(-1)]).to(self._device)
        torch.index_select(rows, 0, order, out=out)
        self._count(ids.numel(), time.perf_counter() - start, unique_rows=unique.size, requests=offsets.size,
                    bytes_read=int(lengths.sum()), bytes_useful=unique.size * self.row_bytes)

    def _plan(self, unique: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(file offset, length, index in ``unique`` of the first row) of each read for the sorted ids ``unique``.

        As the native engine plans them: rows whose 512-byte blocks are the same or adjacent share one read
        (packed rows of one block are read once), cut where a read would pass ``max_request_bytes`` (one
        block at least), and no block is read twice.
        """
        block = ROW_ALIGNMENT
        begin = unique * self._stride
        block_begin = begin // block * block
        block_end = -(-(begin + self.row_bytes) // block) * block
        groups = np.flatnonzero(block_begin[1:] > block_end[:-1]) + 1
        offsets, lengths, firsts = [], [], []
        for lo, hi in zip(np.concatenate([[0], groups]), np.append(groups, unique.size)):
            while lo < hi:  # cut the group greedily; block_end is sorted within it
                limit = max(block_begin[lo] + self._max_request, block_end[lo])
                last = lo + int(np.searchsorted(block_end[lo:hi], limit, side="right")) - 1
                offsets.append(block_begin[lo])
                lengths.append(block_end[last] - block_begin[lo])
                firsts.append(lo)
                lo = last + 1
        return np.array(offsets, dtype=np.int64), np.array(lengths, dtype=np.int64), np.array(firsts, dtype=np.int64)

    def close(self) -> None:
        super().close()
        self._file.close()
