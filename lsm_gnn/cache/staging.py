"""Rows from storage to the cache's device: where a cache may live (:func:`cache_device`), how its misses reach
its lines (:func:`miss_path`, as the object :func:`miss_reads` picks once per cache), and the stream it works on.

Staged misses: a cache on a GPU reads its misses with the storage engine into page-locked
(pinned) host memory and copies them to the device in one asynchronous
transfer on the cache's side stream, so the copy overlaps the training of the
previous batch on the default stream. The buffer is reused from batch to
batch (pinning memory is slow) and grows geometrically with the largest miss
set seen. A CPU cache needs none of this: it reads straight into its rows.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch


def cache_device(device) -> torch.device:
    """``device`` as a torch.device a cache can live on: the CPU, or a CUDA device torch can see."""
    device_ = torch.device(device)
    if device_.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"the cache was asked for device {device!r}, but torch sees no CUDA device "
                           f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); "
                           "use device='cpu' or run on a GPU machine")
    if device_.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or a CUDA device, got {device!r}")
    if device_.type == "cuda" and device_.index is None:  # "cuda" is the current device: its tensors say cuda:N
        device_ = torch.device("cuda", torch.cuda.current_device())
    return device_


def miss_path(read_device: torch.device, cache_device: torch.device) -> str:
    """How a cache on ``cache_device`` gets its misses from a storage whose reads land on ``read_device`` (its
    ``device``): ``"direct"`` where they are the same (read straight into the lines: a CPU cache over a file, a
    GPU cache over ``gds`` on its GPU), ``"staged"`` from the host to a GPU cache (through a reused pinned
    buffer, one transfer per batch), else ``"copied"`` (read where the storage reads to, then moved)."""
    read_device, cache_device = torch.device(read_device), torch.device(cache_device)
    if read_device == cache_device:
        return "direct"
    if read_device.type == "cpu" and cache_device.type == "cuda":
        return "staged"
    return "copied"


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


class CopiedMisses:
    """A cache's misses read where ``storage`` reads to, then moved to the cache's ``device``; the base of the
    other paths, whose reads reach the device otherwise. The fill stage calls :meth:`read`."""

    def __init__(self, storage, device: torch.device, path: str = "copied"):
        self.storage, self.device, self.path = storage, device, path  # path: as miss_path names it

    def read(self, plan, miss: torch.Tensor, miss_ids: torch.Tensor, miss_cached: torch.Tensor | None,
             data: torch.Tensor, miss_lines: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Reads the rows of a lookup's misses ``miss`` (positions in ``plan.unique``; ``miss_ids`` their ids on
        the host, ``miss_cached`` whether each got a line, on the host where known, ``miss_lines`` their lines
        where known) into their lines of ``data`` (the cache's); returns the distinct ids whose rows go to their
        positions apart (those without a line, or all where hit rows went first: ``plan.one_gather`` false) and
        those rows, or None."""
        if miss_lines is None:
            miss_lines = plan.line[miss]
        # A miss without a line: bypassed, or (sets overflowing) its line taken again by a later id.
        every_miss_cached = (plan.one_gather and plan.done.bypassed == 0) or bool(
            (miss_lines >= 0 if miss_cached is None else miss_cached).all())
        cached = None if every_miss_cached else miss_lines >= 0
        if not plan.one_gather:  # hit rows went first: every miss's row goes to its positions too
            fetched = self.fetch(miss_ids)
            if every_miss_cached:
                data.index_copy_(0, miss_lines, fetched)
            else:
                data.index_copy_(0, miss_lines[cached], fetched[cached])
            return miss, fetched
        if every_miss_cached:
            self._into_lines(miss_ids, data, miss_lines)
            return None
        uncached_rows = self._into_cached(miss_ids, cached, miss_cached, data, miss_lines)
        return miss[~cached], uncached_rows

    def fetch(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows of ``ids`` (CPU int64) on the cache's device."""
        return self.storage.read(ids).to(self.device)

    def _into_lines(self, ids: torch.Tensor, data: torch.Tensor, lines: torch.Tensor) -> None:
        """The rows of ``ids`` into their ``lines`` of ``data``."""
        data.index_copy_(0, lines, self.fetch(ids))

    def _into_cached(self, ids: torch.Tensor, cached: torch.Tensor, on_host: torch.Tensor | None,
                     data: torch.Tensor, lines: torch.Tensor) -> torch.Tensor:
        """The rows of the ``ids`` that got a line (``cached``; ``on_host``: the same on the host where known)
        into their ``lines``; returns the others' rows, on the cache's device."""
        fetched = self.fetch(ids)
        data.index_copy_(0, lines[cached], fetched[cached])
        return fetched[~cached]


class StagedMisses(CopiedMisses):
    """From a host storage to a GPU cache through :class:`MissStaging` (``pin``: as there)."""

    def __init__(self, storage, device: torch.device, pin: bool | None = None):
        super().__init__(storage, device, "staged")
        self.staging = MissStaging(device, pin)

    def fetch(self, ids: torch.Tensor) -> torch.Tensor:
        return self.staging.read(self.storage, ids)


class DirectMisses(CopiedMisses):
    """A storage that reads to the cache's device: rows straight into their lines (its ``read_into``), where the
    batch's rows are served by one gather from the lines."""

    def __init__(self, storage, device: torch.device):
        super().__init__(storage, device, "direct")

    def _into_lines(self, ids: torch.Tensor, data: torch.Tensor, lines: torch.Tensor) -> None:
        self.storage.read_into(ids, data, lines)

    def _into_cached(self, ids: torch.Tensor, cached: torch.Tensor, on_host: torch.Tensor | None,
                     data: torch.Tensor, lines: torch.Tensor) -> torch.Tensor:
        on_host = cached.cpu() if on_host is None else on_host
        self.storage.read_into(ids[on_host], data, lines[cached])
        return self.storage.read(ids[~on_host])


def miss_reads(storage, device: torch.device) -> CopiedMisses:
    """How a cache on ``device`` reads its misses from ``storage``, chosen once (:func:`miss_path`). (A stand-in
    storage that does not say where it reads to reads to the host, as FeatureStorage's default; one without a
    ``read_into`` has its rows read, then copied.)"""
    path = miss_path(getattr(storage, "device", torch.device("cpu")), device)
    if path == "direct":
        return DirectMisses(storage, device) if getattr(storage, "read_into", None) is not None else \
            CopiedMisses(storage, device, path)
    return StagedMisses(storage, device) if path == "staged" else CopiedMisses(storage, device)
