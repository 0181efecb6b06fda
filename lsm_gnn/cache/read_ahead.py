"""Read-ahead: the rows a cache's next batches will miss, read on a thread of their own.

A lookup reads its misses from storage and the disk is idle the rest of the time: while the cache works out
the next batch's hits, while the loader samples and hands the batch over. After each lookup the cache knows
the next batches (its window) and which of their ids it holds now, so it asks :class:`ReadAhead` for the rows
those batches will miss; the worker thread reads them while the loader does everything else, and the next
lookup takes them from here instead of the disk.

What is read ahead never changes a result: the cache's decisions are made as before and read-ahead only
decides where a miss's bytes come from (the same file, read earlier). Rows are read only from a storage
nobody writes (a feature file), so a row read early is the row read late. A prediction can be wrong both
ways: an id the cache holds now may be evicted before its batch (it is then read at its lookup, as without
read-ahead, and topped up after the next lookup when there is time), and an id predicted to miss may be
served otherwise (its row is dropped unused; ``stats`` counts both).
"""
from __future__ import annotations

import atexit
import threading
import weakref
from collections import deque
from dataclasses import dataclass, field

import torch

from lsm_gnn.defaults import (READ_AHEAD_BYTES, READ_AHEAD_DEPTH, READ_AHEAD_MAX_BYTES, READ_AHEAD_MEMORY_SHARE,
                              AUTO_MIN_ROOM)
from lsm_gnn.utils.ids import as_id_tensor
from lsm_gnn.utils.units import parse_bytes


#: every ReadAhead alive: closed at exit, so no worker is inside a native read while the interpreter ends
#: (its thread would be killed there: std::terminate)
_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for ahead in list(_LIVE):
        ahead.close()


@dataclass
class ReadAheadStats:
    requested: int = 0  # rows asked for ahead of their lookup
    read: int = 0       # of them, rows the worker read (the others were taken back, or their read failed)
    used: int = 0       # of them, rows a lookup took instead of reading them
    dropped: int = 0    # rows read ahead that no lookup needed (predicted wrongly, or past the budget's end)
    cut: int = 0        # rows not asked for because the memory budget was full
    failed: int = 0     # chunks whose read failed, and device probes that did (their lookups read the rows)


@dataclass(eq=False)
class _Chunk:
    iteration: int          # the lookup these rows are for
    ids: torch.Tensor       # sorted distinct ids
    start: int              # its first row in the ring
    rows: torch.Tensor | None = None  # once read, a view of the ring (None: not read, or the read failed)
    done: threading.Event = field(default_factory=threading.Event)


class _RowRing:
    """One buffer of ``capacity`` rows, made once, that chunks take contiguous spans of: the worker reads into
    memory that is already there instead of allocating a chunk's rows (fresh pages cost more than the copy, and
    a thread's allocations stayed in glibc's per-thread arena: +42 MiB beside a 4 MiB budget). Spans are taken
    first-fit, so the pages touched are about the most rows held at once, not the budget; they are freed in any
    order. Not thread-safe: :class:`ReadAhead` calls it under its lock."""

    def __init__(self, capacity: int, dim: int, dtype: torch.dtype):
        self.capacity, self.dim, self.dtype = int(capacity), int(dim), dtype
        self.buffer: torch.Tensor | None = None  # made at the first span; its pages are touched as they are read
        self._spans: list[tuple[int, int]] = []  # live (start, end), sorted by start

    def take(self, rows: int) -> tuple[int, int]:
        """(start, count) of a free span of ``count <= rows`` rows: all of them where a gap that long is free,
        else the longest gap (0 rows when the ring is full)."""
        if self.buffer is None:
            self.buffer = torch.empty((self.capacity, self.dim), dtype=self.dtype)
        gaps, at = [], 0
        for start, end in self._spans:
            if start > at:
                gaps.append((at, start - at))
            at = end
        if self.capacity > at:
            gaps.append((at, self.capacity - at))
        start, count = next(((at, rows) for at, free in gaps if free >= rows), None) or \
            max(gaps, key=lambda g: g[1], default=(0, 0))
        if count:
            self._spans.append((start, start + count))
            self._spans.sort()
        return start, count

    def view(self, start: int, count: int) -> torch.Tensor:
        return self.buffer[start:start + count]

    def free(self, start: int) -> None:
        self._spans = [span for span in self._spans if span[0] != start]

    def clear(self) -> None:
        self._spans = []


def misses_on_host(tags: torch.Tensor, ways: int, batches: list[torch.Tensor], known: list[torch.Tensor]
                   ) -> list[torch.Tensor]:
    """Per batch (CPU int64 ids, nearest first): its sorted distinct ids that ``tags`` (a CPU cache's, whole sets
    of ``ways``) lacks, no nearer batch has and ``known[j]`` lacks. One native pass, without the GIL."""
    from lsm_gnn import _C

    return _C.ahead_misses(tags, ways, batches, known)


#: Tags that hold no id (ids are >= 0): the native pass over batches whose held ids are already taken out.
_NO_TAGS = torch.full((1,), torch.iinfo(torch.int64).min, dtype=torch.int64)


def held_in_flight(tags: torch.Tensor, ways: int, batches: list[torch.Tensor]) -> tuple[torch.Tensor, object]:
    """Starts looking the batches' ids up in ``tags`` where they live (one kernel over all batches,
    :mod:`lsm_gnn.kernels.tag_probe`) and copying whether each is held, one byte an id, to the host without
    waiting: ``(held, ready)``, ``held`` valid once ``ready`` (a CUDA event on the current stream; None where
    the copy was synchronous) has passed. Nothing here grows with the cache."""
    if sum(b.numel() for b in batches) == 0:
        return torch.zeros(0, dtype=torch.bool), None
    from lsm_gnn.kernels import triton_module

    ids = torch.cat(batches) if len(batches) > 1 else batches[0]
    probe = triton_module("tag_probe", on_cpu=tags.device.type == "cpu")
    held = probe.held(tags, ways, ids.to(tags.device, non_blocking=True))
    host = torch.empty(held.shape, dtype=torch.bool, pin_memory=held.is_cuda)
    host.copy_(held, non_blocking=True)
    if not held.is_cuda:
        return host, None
    ready = torch.cuda.Event()
    ready.record()
    return host, ready


def misses_of_held(held: torch.Tensor, batches: list[torch.Tensor], known: list[torch.Tensor]
                   ) -> list[torch.Tensor]:
    """:func:`misses_on_host` given whether each of the batches' ids is held (:func:`held_in_flight`, arrived):
    the native pass over the ids not held. The same result: an id held now is wanted by no batch, so leaving it
    out of the nearer batches changes no other id's answer."""
    left = [batch[~h] for batch, h in zip(batches, held.split([b.numel() for b in batches]))]
    return misses_on_host(_NO_TAGS, 1, left, known)


def misses_on_device(tags: torch.Tensor, ways: int, batches: list[torch.Tensor], known: list[torch.Tensor]
                     ) -> list[torch.Tensor]:
    """:func:`misses_on_host` for tags on a device, waiting for them: :func:`held_in_flight`, then
    :func:`misses_of_held`. (A cache does the two halves on different threads: :meth:`ReadAhead.request_misses`.)"""
    held, ready = held_in_flight(tags, ways, batches)
    if ready is not None:
        ready.synchronize()
    return misses_of_held(held, batches, known)


@dataclass(eq=False)
class _Probe:
    """A device cache's miss probe in flight (:meth:`ReadAhead.request_misses`): whether each id of the batches
    of lookups ``iteration``, ``iteration + 1``... is held, arriving in ``held`` once ``ready`` has passed."""
    iteration: int
    batches: list[torch.Tensor]
    parked: list[torch.Tensor | None]
    held: torch.Tensor
    ready: object


def default_depth(from_disk: bool) -> int:
    """``cache.read_ahead=auto``: READ_AHEAD_DEPTH batches where misses come from a disk nobody writes
    (``from_disk``), with at least AUTO_MIN_ROOM of memory available; else 0. A cache on a GPU too: on an H200
    the misses' reads then overlapped training (13.0 ms an iteration against 26.1, at 0.92 of the disk's bound)."""
    if not from_disk:
        return 0
    from lsm_gnn.utils.memcap import available_memory

    room = available_memory()
    return READ_AHEAD_DEPTH if room is None or room >= AUTO_MIN_ROOM else 0


class NoReadAhead:
    """A cache that reads nothing ahead (``read_ahead=0``): its lookups read every miss themselves."""

    depth = 0

    def take(self, iteration: int, ids: torch.Tensor) -> None:
        return None

    def follow(self, iteration: int, future) -> None:
        pass

    def close(self) -> None:
        pass


def read_ahead_for(storage, depth: int | None, max_bytes, device, state, parked) -> ReadAhead | NoReadAhead:
    """A cache's ``read_ahead`` of ``depth`` batches (``None``: :func:`default_depth`, from a disk nobody writes;
    0: :class:`NoReadAhead`) over ``storage``, following its ``state`` and victim buffer's ``parked`` ids."""
    if depth is None:
        depth = default_depth(getattr(storage, "from_disk", False) and not storage.writable)
    if depth < 0:
        raise ValueError(f"read_ahead is a number of batches >= 0 (0: off), got {depth}")
    return ReadAhead(storage, depth, max_bytes, device, state=state, parked=parked) if depth else NoReadAhead()


def read_ahead_budget(value) -> int:
    """Bytes of rows a read-ahead may hold: ``value`` in bytes ("64M"), or ``"auto"``: READ_AHEAD_MAX_BYTES, or
    READ_AHEAD_MEMORY_SHARE of the memory still available (a memory cgroup's limit counted) where that is less.
    A fixed 64 MiB pushed a run under a 400 MiB cap, whose imports alone take 250 MiB, into the OOM killer."""
    if value != "auto":
        budget = parse_bytes(value)
        if budget < 1:
            raise ValueError(f"a read-ahead budget must be at least one byte, got {value!r}")
        return budget
    from lsm_gnn.utils.memcap import available_memory

    room = available_memory()
    return READ_AHEAD_MAX_BYTES if room is None else max(1, min(READ_AHEAD_MAX_BYTES,
                                                                 int(room * READ_AHEAD_MEMORY_SHARE)))


class ReadAhead:
    """Reads rows of ``storage`` ahead of the lookup that needs them, on one worker thread, holding at most
    ``max_bytes`` of rows. :meth:`request` queues ids for a lookup; :meth:`take` gives that lookup the rows of
    the ids it asks for that were read (waiting for a read in flight); :meth:`close` stops the worker.
    Thread-safe; the worker starts with the first request. :meth:`request_misses` works out what to ask for
    from the tags of a cache on ``device``: on the CPU at once, else (``self.on_device``) in two halves, the
    lookup on the device started on the caller's thread and finished on the worker's (or by the next
    :meth:`take`, whichever comes first), so the caller never waits for the device.

    A cache's read-ahead (:func:`read_ahead_for`) follows its ``state`` (a :class:`~lsm_gnn.cache.state.CacheState`:
    what it holds) and ``parked`` (``parked(iteration)``: the ids its victim buffer serves that batch, or None);
    the cache calls :meth:`take` in its fill and :meth:`follow` after each lookup."""

    def __init__(self, storage, depth: int = READ_AHEAD_DEPTH, max_bytes=READ_AHEAD_BYTES, device="cpu", *,
                 state=None, parked=None):
        if depth < 1:
            raise ValueError(f"read-ahead depth is a number of batches >= 1, got {depth}")
        if getattr(storage, "writable", False):
            raise ValueError("read-ahead needs a storage nobody writes: a row read early from a writable one "
                             "(an embedding table) could be changed before its lookup")
        self.storage = storage
        self.depth = int(depth)
        self.max_rows = max(1, read_ahead_budget(max_bytes) // storage.row_bytes)
        self._ring = _RowRing(self.max_rows, storage.dim, storage.dtype)  # every chunk's rows, in one buffer
        self.stats = ReadAheadStats()
        self.on_device = torch.device(device).type != "cpu"
        self._probes: deque[_Probe] = deque()  # started, not finished: oldest first
        self._probing = False  # one is being finished (in order: each reads what the ones before asked for)
        self._chunks: list[_Chunk] = []  # every chunk not yet taken or dropped, in request order
        self._queue: deque[_Chunk] = deque()  # the chunks the worker has still to read
        self._held = 0  # rows in _chunks
        self._cond = threading.Condition()
        self._worker: threading.Thread | None = None
        self._closed = False
        self._state, self._parked = state, parked
        _LIVE.add(self)

    # -- the cache's side ----------------------------------------------------------------------------------------

    def follow(self, iteration: int, future) -> None:
        """After the lookup before ``iteration``: asks for the rows the next :attr:`depth` batches of ``future``
        (the cache's window; None: none) will miss as the cache stands now (:meth:`request_misses`)."""
        if self._state is None:
            raise TypeError("follow() compares the next batches with a cache's state: build the read-ahead with "
                            "state= (read_ahead_for does), or ask with request_misses()")
        if future is None:
            return
        batches = [as_id_tensor(future[j]) for j in range(min(self.depth, len(future)))]
        self.request_misses(iteration, batches, self._state.tags, self._state.ways, self._parked)

    def requested(self, iteration: int) -> torch.Tensor | None:
        """The ids already asked for ``iteration`` (each chunk's sorted, one after another), or None."""
        with self._cond:
            parts = [c.ids for c in self._chunks if c.iteration == iteration]
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else torch.cat(parts)  # its reader builds a set of them

    def request_misses(self, iteration: int, batches: list[torch.Tensor], tags: torch.Tensor, ways: int,
                       parked=None) -> None:
        """Asks for the rows the ``batches`` of lookups ``iteration``, ``iteration + 1``... (CPU int64 ids) will
        miss as the cache's ``tags`` stand now: the ids it does not hold, less those of a nearer batch (which
        that batch installs), those already asked for and those ``parked(iteration)`` names (its victim
        buffer's, served from there)."""
        if not batches:
            return
        parked = [None if parked is None else parked(iteration + j) for j in range(len(batches))]
        if not self.on_device:  # the tags change with the next lookup: read them now
            self._request_wanted(iteration, misses_on_host(tags, ways, batches, self._known(iteration, parked)))
            return
        probe = _Probe(iteration, batches, parked, *held_in_flight(tags, ways, batches))
        with self._cond:
            if self._closed:
                return
            self._probes.append(probe)
            self._start_worker()
            self._cond.notify()

    def _known(self, iteration: int, parked: list[torch.Tensor | None]) -> list[torch.Tensor]:
        """Per batch from ``iteration`` on, the ids to leave out: those asked for already, and ``parked``'s."""
        known = []
        for j, parked_ids in enumerate(parked):
            parts = [p for p in (self.requested(iteration + j), parked_ids) if p is not None and p.numel()]
            known.append(torch.cat(parts) if len(parts) > 1 else parts[0] if parts else
                         torch.empty(0, dtype=torch.int64))
        return known

    def _request_wanted(self, iteration: int, wanted: list[torch.Tensor]) -> None:
        for j, want in enumerate(wanted):
            self.request(iteration + j, want)

    def _next_probe(self) -> _Probe | None:
        """The oldest probe to finish, claimed (under the lock), or None: none, or one is being finished."""
        if self._probing or not self._probes:
            return None
        self._probing = True
        return self._probes.popleft()

    def _finish(self, probe: _Probe) -> None:
        """Waits for a claimed probe's flags and asks for what its batches will miss."""
        try:
            if probe.ready is not None:
                probe.ready.synchronize()
            known = self._known(probe.iteration, probe.parked)
            self._request_wanted(probe.iteration, misses_of_held(probe.held, probe.batches, known))
        finally:
            with self._cond:
                self._probing = False
                self._cond.notify_all()

    def _finish_probes(self) -> None:
        """Finishes every probe started (waiting for one the worker is finishing): a lookup's chunks are then
        all asked for before it takes them."""
        while True:
            with self._cond:
                while self._probing:
                    self._cond.wait()
                probe = self._next_probe()
            if probe is None:
                return
            self._finish(probe)

    def request(self, iteration: int, ids: torch.Tensor) -> None:
        """Queues the rows of ``ids`` (sorted, distinct, CPU int64) for the lookup of ``iteration``; as many as
        the memory budget leaves room for."""
        if ids.numel() == 0:
            return
        with self._cond:
            if self._closed:
                return
            start, count = self._ring.take(ids.numel())
            if count < ids.numel():
                self.stats.cut += ids.numel() - count
                ids = ids[:count]
            if ids.numel() == 0:
                return
            chunk = _Chunk(int(iteration), ids, start)
            self._chunks.append(chunk)
            self._queue.append(chunk)
            self._held += ids.numel()
            self.stats.requested += ids.numel()
            self._start_worker()
            self._cond.notify()

    def _start_worker(self) -> None:
        """Starts the worker if none runs (under the lock)."""
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="lsm-gnn-read-ahead", daemon=True)
            self._worker.start()

    def take(self, iteration: int, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """For the lookup of ``iteration`` reading ``ids`` (CPU int64): ``(where, rows)``, the positions in
        ``ids`` of the rows read ahead and those rows, or None when none was. A chunk of this iteration being
        read is waited for; one still queued is left to the lookup, which reads it beside the worker. Every
        chunk of this iteration or an earlier one is used or dropped here."""
        self._finish_probes()
        with self._cond:
            mine = [c for c in self._chunks if c.iteration <= iteration]
            if not mine:
                return None
            self._chunks = [c for c in self._chunks if c.iteration > iteration]
            unread = {id(c) for c in self._queue if c.iteration <= iteration}
            self._queue = deque(c for c in self._queue if c.iteration > iteration)
        wheres, parts = [], []
        for chunk in mine:
            if id(chunk) in unread:
                continue
            chunk.done.wait()  # (read already, but its span is not reused while the worker may write it)
            if chunk.iteration != iteration or chunk.rows is None or ids.numel() == 0:
                continue  # an older lookup's, or its read failed: the lookup reads these rows, meeting the error
            at = torch.searchsorted(chunk.ids, ids).clamp_max(chunk.ids.numel() - 1)
            where = torch.nonzero(chunk.ids[at] == ids).reshape(-1)  # chunks of one iteration never share ids
            wheres.append(where)
            parts.append(chunk.rows[at[where]])  # a copy: the chunk's span is freed below
        used = sum(int(w.numel()) for w in wheres)
        with self._cond:
            for chunk in mine:
                self._ring.free(chunk.start)
            self._held -= sum(c.ids.numel() for c in mine)
            self.stats.used += used
            self.stats.dropped += sum(c.ids.numel() for c in mine) - used
        if not used:
            return None
        if len(wheres) == 1:
            return wheres[0], parts[0]
        return torch.cat(wheres), torch.cat(parts)

    def close(self) -> None:
        """Stops the worker after the read in flight and forgets every chunk (idempotent); a later request
        starts a new worker."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._probes.clear()
            self._cond.notify_all()
            worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join()
        with self._cond:
            self.stats.dropped += self._held
            self._chunks, self._held, self._worker, self._closed = [], 0, None, False
            self._ring.clear()

    # -- the worker ----------------------------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._cond:  # a probe first: the chunks it asks for may be needed sooner than those queued
                probe = self._next_probe()
                while probe is None and not self._queue and not self._closed:
                    self._cond.wait()
                    probe = self._next_probe()
                if self._closed:
                    if probe is not None:  # claimed, never to be finished: free the claim
                        self._probing = False
                        self._cond.notify_all()
                    return
                chunk = self._queue.popleft() if probe is None else None
            if probe is not None:
                try:
                    self._finish(probe)
                except Exception:  # asks for nothing: the lookups read those rows themselves
                    with self._cond:
                        self.stats.failed += 1
                continue
            try:
                with self._cond:
                    into = self._ring.view(chunk.start, chunk.ids.numel())
                chunk.rows = self.storage.read(chunk.ids, out=into)
                with self._cond:
                    self.stats.read += chunk.ids.numel()
            except BaseException:  # the lookup reads these rows itself and meets the error there
                with self._cond:
                    self.stats.failed += 1
            finally:
                chunk.done.set()
