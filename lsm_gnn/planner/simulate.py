"""Trace-only simulation: the batches a run would gather, and what a cache would do with them.

:func:`record_trace` iterates the trainer's own loader (same task, seeds,
shuffle, sampler and window) over a storage that reads nothing, so the
trace is the run's sequence of input nodes. :func:`simulate_cache` replays
it through the real :class:`~lsm_gnn.cache.SoftwareCache` (same policy
code, window scans and victim buffer) over that storage: the hit ratio it
reports is the cache's, not an estimate, and the ids it misses go through
the storage engine's read plan (``_C.plan_reads``) for the bytes and reads
a run would issue.

On a heterogeneous graph the loader gathers from one cache per feature group
(:func:`trace_features` lays the groups out as the run does); a group's trace
is its ids in its own id space (:meth:`Trace.of_group`), and its replay
counts hits, misses and reads per node type (each type's file is read on its
own).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from lsm_gnn.cache import SoftwareCache, replay
from lsm_gnn.features import FeatureGroup, TypedFeatures
from lsm_gnn.storage.base import CountingStorage
from lsm_gnn.storage.concat import ConcatStorage

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

    @classmethod
    def group(cls, dataset, types: list[str]):
        """The null storage of one feature group of a heterogeneous ``dataset``, in its id space as
        :func:`lsm_gnn.build.build_features` lays it out: one type's rows, or several types' one after another
        (a :class:`~lsm_gnn.storage.concat.ConcatStorage` of a null storage per type)."""
        if len(types) == 1:
            return cls.like(dataset.node_type(types[0]))
        from lsm_gnn.storage.concat import ConcatStorage

        return ConcatStorage([cls.like(dataset.node_type(t)) for t in types], types)

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


class TraceTable(TraceStorage):
    """A node embedding table (:class:`~lsm_gnn.storage.EmbeddingTable`) of ``num_rows`` rows of ``row_bytes``
    that reads zeros and writes nothing, recording the ids of what the table would read (a cache's misses and
    the before-images its undo journal reads: rows first written in a generation that no cache handed over by
    :meth:`before_change`) and write."""

    writable = True

    def __init__(self, num_rows: int, row_bytes: int):
        from lsm_gnn.storage.journal import RowSet

        super().__init__(num_rows, row_bytes, "uint8", record=True)
        self.writes: list[torch.Tensor] = []
        self._journaled = RowSet(num_rows)

    def before_change(self, ids, rows) -> None:
        self._journaled.add(ids.numpy())

    def write(self, ids, rows) -> None:
        ids = torch.sort(ids.to(torch.int64).cpu()).values
        new = ids[torch.from_numpy(~self._journaled.contains(ids.numpy()))]
        if new.numel():  # the journal reads their before-images from the file first
            self.read(new)
            self._journaled.add(new.numpy())
        self.writes.append(ids)

    def new_generation(self) -> None:
        """A checkpoint committed the table: its journal starts empty."""
        self._journaled.clear()

    def take_writes(self) -> list[torch.Tensor]:
        writes, self.writes = self.writes, []
        return writes


def table_geometry(num_rows: int, row_bytes: int) -> ReadGeometry:
    """The read plan's inputs for a node embedding table of ``num_rows`` rows of ``row_bytes``, as the table
    reads (its file's layout, buffered: aligned to 1 byte)."""
    from lsm_gnn.data.format import feature_file_bytes, row_stride_for

    stride = row_stride_for(row_bytes)
    return ReadGeometry(num_rows, row_bytes, stride, feature_file_bytes(num_rows, stride), 1)


def trace_features(dataset) -> TypedFeatures:
    """``dataset``'s features as a run's loader gathers them, one group per row format in its id space
    (:func:`lsm_gnn.build.build_features`), every group over a null storage."""
    from lsm_gnn.build import feature_groups, group_offsets

    groups = []
    for types in feature_groups(dataset):
        storage = TraceStorage.group(dataset, types)
        groups.append(FeatureGroup(types, group_offsets(storage, types), storage))
    return TypedFeatures(groups)


@dataclass
class Trace:
    """The input nodes of each iteration of a run, in order, and what sampling them cost. A recorded batch is
    {node type: ids} (a graph of one type's too); :meth:`of_group` gives one feature group's ids, as its cache
    sees them, and :meth:`of_type` one type's."""

    batches: list
    sample_s: list[float]       # loader-thread seconds per batch, sampled with nothing else running
    epoch_length: int           # batches per epoch (the window refills when an epoch starts)
    sizes: list[int]            # ids per batch

    @property
    def nodes_per_batch(self) -> float:
        return float(np.mean(self.sizes)) if self.sizes else 0.0

    def of_group(self, features: TypedFeatures, group: int) -> "Trace":
        """The ids of feature group ``group`` of ``features`` in each batch (its id space; empty where a batch
        has none of its types): what that group's window holds and its cache looks up."""
        return self._of_one_space([features.group_ids(b)[group] for b in self.batches])

    def of_type(self, node_type: str) -> "Trace":
        """The ids of ``node_type`` in each batch (its own ids; empty where a batch has none): what its node
        embedding table's window holds and its cache looks up (a graph of one type: its one cache's)."""
        empty = torch.empty(0, dtype=torch.int64)
        return self._of_one_space([b.get(node_type, empty).to(torch.int64) for b in self.batches])

    def _of_one_space(self, batches: list[torch.Tensor]) -> "Trace":
        return Trace(batches, self.sample_s, self.epoch_length, [ids.numel() for ids in batches])


def record_trace(task, dataset, iterations, features=None, max_bytes: int | None = None) -> Trace:
    """The first ``iterations`` batches of ``task``'s train loader (rank 0 of 1), epochs following on
    as the trainer's do; ``iterations`` a count, or a function of the loader's epoch length that gives it.
    ``features``: what the loader gathers from (default: a null storage of the dataset's one feature file; a
    heterogeneous graph's: :func:`trace_features`). ``max_bytes``: fewer batches where their ids would take more."""
    loader = task.train_loader(TraceStorage.like(dataset) if features is None else features, 0, 1)
    batches, sample_s, sizes, held = [], [], [], 0
    try:
        if callable(iterations):
            iterations = iterations(len(loader))
        while len(batches) < iterations:
            for batch in loader:
                nodes = batch.keyed(batch.input_nodes)
                batches.append({t: ids.clone() for t, ids in nodes.items()})
                sample_s.append(batch.timings["sample"])
                sizes.append(sum(ids.numel() for ids in nodes.values()))
                held += 8 * sizes[-1]
                if len(batches) >= iterations or (max_bytes is not None and held > max_bytes):
                    iterations = len(batches)
                    break
    finally:
        loader.close()
    return Trace(batches, sample_s, len(loader), sizes)


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


def _storage_parts(storage, geometry) -> list[tuple]:
    """(name, first id, end, null storage, read geometry) per file the cache's ``storage`` reads: one (name
    None) for a :class:`ReadGeometry`; per node type for ``geometry`` by type (a feature group's files)."""
    if isinstance(geometry, ReadGeometry):
        return [(None, 0, storage.num_rows, storage, geometry)]
    if isinstance(storage, ConcatStorage):
        return [(name, int(storage.offsets[k]), int(storage.offsets[k + 1]), part, geometry[name])
                for k, (name, part) in enumerate(zip(storage.names, storage.parts))]
    (name,) = geometry
    return [(name, 0, storage.num_rows, storage, geometry[name])]


def _timed_lookups(cache: SoftwareCache, storage, trace: Trace, measured: int, window: int, after=lambda: None):
    """Looks up the first ``measured`` batches of ``trace`` in ``cache`` over ``storage``, the window as the
    loader holds it, calling ``after()`` after each; yields (the batch's ids, its hit mask, the cache's own
    seconds: the lookup's and ``after``'s less the storage's)."""
    for t, (current, future) in enumerate(_epoch_by_epoch(trace, window, storage.num_rows)):
        if t >= measured:
            break
        before = storage.stats().total_seconds
        start = time.perf_counter()
        _, hit = cache.lookup(current, future if window else None)
        after()
        yield current, hit, time.perf_counter() - start - (storage.stats().total_seconds - before)


def simulate_cache(trace: Trace, measured: int, storage, geometry, make_cache, window: int) -> dict:
    """Replays the first ``measured`` batches of ``trace`` (the rest only fill the window) through
    ``make_cache(storage)``; returns totals and per-iteration means of hits, misses, bytes read and
    reads, the cache's own time (lookup time less the storage's), and under ``each`` the reads and cache
    milliseconds of every iteration.

    ``storage`` is a :class:`TraceStorage` and ``geometry`` its file's :class:`ReadGeometry`, or, for a
    feature group of a heterogeneous graph, :meth:`TraceStorage.group` and a ReadGeometry per node type;
    ``by_part`` then has each type's hits, rows, misses, bytes read and reads, and ``each`` its reads per
    iteration (``reads_by_part``)."""
    parts = _storage_parts(storage, geometry)
    for part in parts:
        part[3].record = True
        part[3].take_reads()
    cache: SoftwareCache = make_cache(storage)
    hits = unique = misses = bytes_read = reads = 0
    by_part = {p[0]: dict.fromkeys(("hits", "unique", "misses", "bytes_read", "reads"), 0) for p in parts}
    cache_s, reads_each, reads_by_part_each = [], [], []
    try:
        # as the loader does after a lookup: PVP moves the next queue
        for current, hit, seconds in _timed_lookups(cache, storage, trace, measured, window, cache.prefetch):
            cache_s.append(seconds)
            n_hit = int(hit.sum())
            hits += n_hit
            unique += hit.numel()
            batch_bytes = batch_reads = 0
            batch_reads_by_part = {}
            for name, low, high, part, part_geometry in parts:
                counts = by_part[name]
                if len(parts) == 1:
                    counts["hits"], counts["unique"] = hits, unique
                else:  # this part's rows of the batch
                    mine = (current >= low) & (current < high)
                    counts["hits"] += int(hit[mine].sum())
                    counts["unique"] += int(mine.sum())
                part_reads = 0
                for ids in part.take_reads():
                    misses += ids.numel()
                    counts["misses"] += ids.numel()
                    b, r = part_geometry.plan(ids)
                    batch_bytes, batch_reads = batch_bytes + b, batch_reads + r
                    counts["bytes_read"] += b
                    part_reads += r
                counts["reads"] += part_reads
                batch_reads_by_part[name] = part_reads
            bytes_read += batch_bytes
            reads += batch_reads
            reads_each.append(batch_reads)
            reads_by_part_each.append(batch_reads_by_part)
    finally:
        cache.settle()
        for part in parts:
            part[3].record = False
    n = max(measured, 1)
    typical = typical_mean(cache_s, cache.policy.period)
    # Per iteration: the measured pattern (scan iterations cost more), at the robust level.
    scale = typical / float(np.mean(cache_s)) if cache_s and np.mean(cache_s) > 0 else 1.0
    return {"hit_ratio": hits / unique if unique else 0.0, "hits": hits, "unique": unique, "misses": misses,
            "bytes_read": bytes_read, "reads": reads, "cache_s": sum(cache_s),
            "per_iteration": {"unique": unique / n, "misses": misses / n, "bytes_read": bytes_read / n,
                              "reads": reads / n, "cache_ms": 1e3 * typical},
            "each": {"cache_ms": [1e3 * scale * c for c in cache_s], "reads": reads_each,
                     "reads_by_part": reads_by_part_each},
            "by_part": by_part, "lines": cache.num_lines, "capacity_bytes": cache.capacity_bytes}


def _unchanged(rows: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
    return rows


def simulate_table(trace: Trace, measured: int, table: TraceTable, geometry: ReadGeometry, make_cache, window: int,
                   checkpoints=frozenset()) -> dict:
    """Replays the first ``measured`` batches of ``trace`` through ``make_cache(table)``, the cache over a node
    embedding table, as the trainer uses it: each batch's rows read (``lookup``: misses read, dirty victims
    written back), then updated in their lines (``update``: rows left without a line read, journaled and
    written in place); after the iterations in ``checkpoints`` (counted from 1) every dirty line is written and
    the journal restarts, as a checkpoint does, those writes left out of the counts as the run leaves them out.

    Returns the hit ratio over the rows read (the run's ``embedding_hit_ratio``), bytes read and written (its
    ``embedding_bytes_read`` and ``embedding_bytes_written``), reads and writes issued (a write per row, as the
    table's native writes), the cache's own time of the lookups, per iteration and under ``each``."""
    from lsm_gnn.utils.ids import unique_ids

    table.take_reads()
    table.take_writes()
    cache: SoftwareCache = make_cache(table)
    totals = dict.fromkeys(("hits", "rows", "bytes_read", "bytes_written", "reads", "writes"), 0)
    cache_s, reads_each, writes_each = [], [], []
    try:
        # the table's reader (the node embeddings) moves no victim queue ahead
        for t, (current, hit, seconds) in enumerate(_timed_lookups(cache, table, trace, measured, window)):
            cache_s.append(seconds)
            unique = unique_ids(current)[0]
            cache.update(unique, torch.zeros((unique.numel(), 1)), _unchanged)
            totals["hits"] += int(hit.sum())
            totals["rows"] += hit.numel()
            reads = writes = 0
            for ids in table.take_reads():
                b, r = geometry.plan(ids)
                totals["bytes_read"] += b
                reads += r
            for ids in table.take_writes():
                totals["bytes_written"] += ids.numel() * geometry.row_bytes
                writes += ids.numel()
            totals["reads"] += reads
            totals["writes"] += writes
            reads_each.append(reads)
            writes_each.append(writes)
            if t + 1 in checkpoints:
                cache.flush()
                table.take_writes()
                table.new_generation()
    finally:
        cache.settle()
    n = max(measured, 1)
    typical = typical_mean(cache_s, cache.policy.period)
    scale = typical / float(np.mean(cache_s)) if cache_s and np.mean(cache_s) > 0 else 1.0
    return {**totals, "hit_ratio": totals["hits"] / totals["rows"] if totals["rows"] else 0.0,
            "per_iteration": {"bytes_read": totals["bytes_read"] / n, "bytes_written": totals["bytes_written"] / n,
                              "reads": totals["reads"] / n, "writes": totals["writes"] / n,
                              "cache_ms": 1e3 * typical},
            "each": {"cache_ms": [1e3 * scale * c for c in cache_s], "reads": reads_each, "writes": writes_each},
            "lines": cache.num_lines, "capacity_bytes": cache.capacity_bytes}
