"""Trace-only simulation: the batches a run would gather, and what a cache would do with them.

:func:`record_trace` iterates the trainer's own loader (same task, seeds,
shuffle, sampler and window) over a storage that reads nothing, so the
trace is the run's sequence of input nodes. :func:`simulate_cache` replays
it through the real :class:`~lsm_gnn.cache.SoftwareCache` (same policy
code, window scans and victim buffer) over that storage: the hit ratio it
reports is the cache's, not an estimate, and the ids it misses go through
the storage engine's read plan (``_C.plan_reads``) for the bytes and reads
a run would issue.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from lsm_gnn.cache import SoftwareCache, replay
from lsm_gnn.storage.base import CountingStorage

MAX_REQUEST_BYTES = 128 << 10  # the storage engine's default longest coalesced read


class TraceStorage(CountingStorage):
    """Rows of zeros of a dataset's shape, read in no time; remembers the ids of every read (the
    misses of a cache over it) when ``record`` is on."""

    backend = "trace"

    def __init__(self, num_rows: int, dim: int, dtype: str, record: bool = False):
        super().__init__(num_rows, dim, dtype)
        self.record = record
        self.reads: list[torch.Tensor] = []
        self._reads_lock = threading.Lock()

    @classmethod
    def like(cls, dataset, record: bool = False) -> "TraceStorage":
        layout = dataset.features
        return cls(dataset.num_nodes, layout.dim, layout.dtype, record)

    def _read(self, ids: torch.Tensor, out: torch.Tensor) -> None:
        start = time.perf_counter()
        out.zero_()
        if self.record:
            with self._reads_lock:
                self.reads.append(ids.clone())
        self._count(ids.numel(), time.perf_counter() - start)

    def take_reads(self) -> list[torch.Tensor]:
        with self._reads_lock:
            reads, self.reads = self.reads, []
        return reads


@dataclass
class Trace:
    """The input nodes of each iteration of a run, in order, and what sampling them cost."""

    batches: list[torch.Tensor]
    sample_s: list[float]       # loader-thread seconds per batch, sampled with nothing else running
    epoch_length: int           # batches per epoch (the window refills when an epoch starts)

    @property
    def nodes_per_batch(self) -> float:
        return float(np.mean([b.numel() for b in self.batches])) if self.batches else 0.0


def record_trace(task, dataset, iterations: int) -> Trace:
    """The first ``iterations`` batches of ``task``'s train loader (rank 0 of 1), epochs following on
    as the trainer's do."""
    loader = task.train_loader(TraceStorage.like(dataset), 0, 1)
    batches, sample_s = [], []
    try:
        while len(batches) < iterations:
            for batch in loader:
                batches.append(batch.input_nodes.clone())
                sample_s.append(batch.timings["sample"])
                if len(batches) >= iterations:
                    break
    finally:
        loader.close()
    return Trace(batches, sample_s, len(loader))


def on_loader_thread(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` on a fresh thread, as the loader runs gathers: torch's intra-op
    parallelism differs between the main thread and others (the others run ops on one thread, which
    under load is many times faster than a main-thread team waiting on a descheduled member). Returns
    its result or raises its exception."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # raised again in the caller's thread
            out["error"] = exc

    worker = threading.Thread(target=run, name="lsm-gnn-plan")
    worker.start()
    worker.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def typical_mean(seconds: list[float], period: int) -> float:
    """The median over consecutive groups of ``period`` iterations of their mean: a group holds one
    window scan, and a lookup the machine's other work delayed moves one group, not the figure."""
    if not seconds:
        return 0.0
    groups = [seconds[i:i + period] for i in range(0, len(seconds) - period + 1, period)] or [seconds]
    return float(np.median([np.mean(g) for g in groups]))


@dataclass(frozen=True)
class ReadGeometry:
    """What the storage engine needs to plan reads of one feature file."""

    num_rows: int
    row_bytes: int
    row_stride: int
    file_bytes: int
    alignment: int
    max_request_bytes: int = MAX_REQUEST_BYTES

    def plan(self, ids: torch.Tensor) -> tuple[int, int]:
        """(bytes read, reads issued) of one batch of ``ids``, as the engine plans them."""
        from lsm_gnn import _C

        if ids.numel() == 0:
            return 0, 0
        plan = _C.plan_reads(ids.to(torch.int64).contiguous(), self.num_rows, self.row_bytes, self.row_stride,
                             self.file_bytes, self.alignment, self.max_request_bytes)
        return int(plan["bytes_read"]), int(plan["length"].numel())


def _epoch_by_epoch(trace: Trace, window: int, num_nodes: int):
    """(current batch, window) over the trace as the loader serves it: a window never reaches into the
    next epoch (each epoch's loader thread samples only its own batches, the window draining at the end)."""
    length = max(trace.epoch_length, 1)
    for start in range(0, len(trace.batches), length):
        yield from replay(trace.batches[start:start + length], window, num_nodes=num_nodes)


def simulate_cache(trace: Trace, measured: int, storage: TraceStorage, geometry: ReadGeometry,
                   make_cache, window: int) -> dict:
    """Replays the first ``measured`` batches of ``trace`` (the rest only fill the window) through
    ``make_cache(storage)``; returns totals and per-iteration means of hits, misses, bytes read and
    reads, the cache's own time (lookup time less the storage's), and under ``each`` the reads and cache
    milliseconds of every iteration."""
    storage.record = True
    storage.take_reads()
    cache: SoftwareCache = make_cache(storage)
    hits = unique = misses = bytes_read = reads = 0
    cache_s, reads_each = [], []
    try:
        for t, (current, future) in enumerate(_epoch_by_epoch(trace, window, storage.num_rows)):
            if t >= measured:
                break
            before = storage.stats().total_seconds
            start = time.perf_counter()
            _, hit = cache.lookup(current, future if window else None)
            cache.prefetch()  # as the loader does: PVP moves the next queue
            cache_s.append(time.perf_counter() - start - (storage.stats().total_seconds - before))
            n_hit = int(hit.sum())
            hits += n_hit
            unique += hit.numel()
            batch_bytes = batch_reads = 0
            for ids in storage.take_reads():
                misses += ids.numel()
                b, r = geometry.plan(ids)
                batch_bytes, batch_reads = batch_bytes + b, batch_reads + r
            bytes_read += batch_bytes
            reads += batch_reads
            reads_each.append(batch_reads)
    finally:
        cache.settle()
        storage.record = False
    n = max(measured, 1)
    typical = typical_mean(cache_s, cache.policy.period)
    # Per iteration: the measured pattern (scan iterations cost more), at the robust level.
    scale = typical / float(np.mean(cache_s)) if cache_s and np.mean(cache_s) > 0 else 1.0
    return {"hit_ratio": hits / unique if unique else 0.0, "hits": hits, "unique": unique, "misses": misses,
            "bytes_read": bytes_read, "reads": reads, "cache_s": sum(cache_s),
            "per_iteration": {"unique": unique / n, "misses": misses / n, "bytes_read": bytes_read / n,
                              "reads": reads / n, "cache_ms": 1e3 * typical},
            "each": {"cache_ms": [1e3 * scale * c for c in cache_s], "reads": reads_each},
            "lines": cache.num_lines, "capacity_bytes": cache.capacity_bytes}
