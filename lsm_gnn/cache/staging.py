"""Rows from storage to the cache's device: one transfer per batch, through a reused host buffer.

A cache on a GPU reads its misses with the storage engine into page-locked
(pinned) host memory and copies them to the device in one asynchronous
transfer on the cache's side stream, so the copy overlaps the training of the
previous batch on the default stream. The buffer is reused from batch to
batch (pinning memory is slow) and grows geometrically with the largest miss
set seen. A CPU cache needs none of this: it reads straight into its rows.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch


class MissStaging:
    """Reads rows into a reused host buffer and copies them to ``device``.

    ``pin`` (default: whether ``device`` is a CUDA device) page-locks the buffer,
    which makes the copy asynchronous. Before the buffer is refilled the
    previous copy out of it must be complete: on CUDA an event marks it.
    """

    def __init__(self, device: str | torch.device, pin: bool | None = None):
        self.device = torch.device(device)
        self.pin = self.device.type == "cuda" if pin is None else bool(pin)
        self._buffer: torch.Tensor | None = None
        self._copied = None  # CUDA event recorded after the last copy out of the buffer

    @property
    def capacity(self) -> int:
        """Rows the buffer holds now (0 before the first read)."""
        return 0 if self._buffer is None else self._buffer.shape[0]

    def read(self, storage, ids: torch.Tensor) -> torch.Tensor:
        """The rows of ``ids`` (CPU int64) as a new tensor on the device."""
        n = ids.numel()
        if self._copied is not None:
            self._copied.synchronize()  # the last batch's copy still reads the buffer
        buffer = self._host_rows(n, storage.dim, storage.dtype)[:n]
        storage.read(ids, out=buffer)
        rows = torch.empty((n, storage.dim), dtype=storage.dtype, device=self.device)
        rows.copy_(buffer, non_blocking=self.pin)
        if self.pin and self.device.type == "cuda":
            self._copied = torch.cuda.Event()
            self._copied.record()  # on the current stream: the cache's side stream
        return rows

    def _host_rows(self, n: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
        buffer = self._buffer
        if buffer is None or buffer.shape[0] < n or buffer.shape[1] != dim or buffer.dtype != dtype:
            rows = max(n, 2 * self.capacity if buffer is not None and buffer.shape[1:] == (dim,) else n, 1)
            self._buffer = buffer = torch.empty((rows, dim), dtype=dtype, pin_memory=self.pin)
        return buffer


@contextmanager
def side_stream(stream):
    """Runs the block on ``stream`` (a CUDA stream): it starts after the work the caller's stream has so
    far, and the caller's stream waits for it afterwards, even when the block raises. Yields the caller's
    stream, for ``record_stream`` on tensors the block hands back; with ``stream=None`` nothing changes and
    it yields None."""
    if stream is None:
        yield None
        return
    caller = torch.cuda.current_stream(stream.device)
    stream.wait_stream(caller)
    try:
        with torch.cuda.stream(stream):
            yield caller
    finally:  # a block that raised may have issued work: the caller must not reuse its memory before it ends
        caller.wait_stream(stream)
