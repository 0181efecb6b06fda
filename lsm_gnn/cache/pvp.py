"""The Preemptive Victim-buffer Prefetcher (PVP): paper section 4.3.

Evicted cache lines whose next use is known are parked in host memory and
handed back to the batch that needs them, so they are never read from
storage again. :class:`VictimBuffer` holds the state; the cache drives it
(``SoftwareCache(..., pvp=True)``). The reference model
(:mod:`lsm_gnn.cache.reference`) defines the semantics:

Queues. One queue per future iteration of the window: ``window + 1`` queues
in a ring (the queue of iteration ``T`` is ``T % (window + 1)``), each of
up to ``queue_capacity`` lines, with the rows (data) apart from the node ids
and PVP records (metadata), as in the paper's Figure 7.

Eviction. When serving iteration ``t`` evicts a valid line, its PVP record
(set by the last window scan, at ``scan_base``) names its next use
``T = scan_base + reuse``. If ``t < T <= t + window`` the line takes the
next slot of queue ``T`` (slots are claimed in ascending order of the ids
that evicted the lines) and its row is copied there before the line is refilled; if queue
``T`` is full it is dropped (*dropped_full*); without a known next use (no
reuse in the window, or a reuse already consumed by a hit since the scan)
it is dropped (*dropped_no_reuse*). With PVP on, the cache scans the window
for every policy (the records are PVP's input), not only the dynamic ones.

Prefetch. Before iteration ``t`` is served, queue ``t`` is moved into the
prefetch buffer (on the cache's device) and recycled as the queue of
``t + window + 1``; queues of iterations before ``t`` that were never
moved expire (their lines count as *unused*). Nothing is ever served from
a queue of another iteration. For a GPU cache :meth:`VictimBuffer.prefetch_async`
does the move on a background thread (the loader starts it right after
serving ``t - 1``, while that batch trains); otherwise serving ``t`` moves
it. A CPU cache's queues are already where the batch is gathered, so its
"move" copies nothing: the batch is served from the queue's own slots,
which no victim can claim before iteration ``t + 1``, and costs no thread.
An iteration whose queue is empty costs no PVP work beyond that
bookkeeping.

Serving. A prefetched line of node ``v`` with index ``p`` (the record's
position of ``v``'s first occurrence in batch ``T``) is *valid* if
``ids[p] == v``; its row is scattered to ``rows[p]`` (and to any repeat of
``v`` in the batch). Those ids never reach storage. With
``SoftwareCache(..., pvp_reinstall=True)`` (the default with PVP) they pass
through the cache as misses whose rows come from the prefetch buffer, so the
cache evolves exactly as without PVP; with ``pvp_reinstall=False`` (the
paper's design) they skip the cache too, which looks up only the other ids.
Invalid lines (an inexact window), repeats of an id, and (reinstalling)
lines whose id the cache holds anyway are *unused*. Reinstalling, one op
after the cache's assign does both steps, ``torch.ops.lsm_gnn.pvp_fill``: it
matches the lines to the ids the cache missed and copies their rows into
those ids' new lines (a GPU cache, serving hits first, matches before its one
read back, so the storage never reads what a line serves, and copies after it,
``pvp_install``), so the batch's one gather from the cache serves them
like hits (a batch that evicts lines it uses also scatters them to their
positions). The paper's mode matches before the assign
(``torch.ops.lsm_gnn.pvp_match``) and scatters to the positions
(``pvp_scatter``). Each op is the C++ core on CPU tensors and a Triton kernel
(:mod:`lsm_gnn.kernels.victim_serve`) on CUDA ones; :func:`match_prefetched`,
:func:`fill_prefetched` and :func:`scatter_prefetched` below define them in
torch ops, and the tests hold both kernels to these. The cache reaches the
buffer through one strategy object per mode, chosen when it is built
(:mod:`lsm_gnn.cache.pvp_modes`), whose hooks run in the stages of a lookup
(:mod:`lsm_gnn.cache.plan`).

Counts: ``enqueued = hits + unused + pending`` (pending: lines still in
queues or in an unserved prefetch buffer), ``offered = enqueued +
dropped_no_reuse + dropped_full`` is the number of evictions.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from lsm_gnn.kernels.layout import INDEX_MASK
from lsm_gnn.kernels import ops as _ops  # noqa: F401  (registers torch.ops.lsm_gnn)
from lsm_gnn.defaults import PVP_QUEUE_BYTES
from lsm_gnn.utils.units import parse_bytes

DEFAULT_QUEUE_BYTES = PVP_QUEUE_BYTES


LINE_METADATA_BYTES = 16  # a queued line's node id and PVP record, beside its row


def queue_memory_bytes(num_queues: int, lines_per_queue: int, row_bytes: int) -> int:
    """Host memory of ``num_queues`` victim queues of ``lines_per_queue`` lines: rows and metadata."""
    return num_queues * lines_per_queue * (row_bytes + LINE_METADATA_BYTES)


def queue_budget(queue_bytes, cache_bytes: int) -> int:
    """Bytes for all victim queues from a byte size (``"64M"``, an int) or a share of the cache (``"25%"``)."""
    text = str(queue_bytes).strip()
    if not text.endswith("%"):
        return parse_bytes(queue_bytes)
    try:
        share = float(text[:-1])
    except ValueError:
        share = -1.0
    if not 0 < share <= 1000:
        raise ValueError(f"{queue_bytes!r} is not a share of the cache in (0%, 1000%], nor a byte size like '256M'")
    return int(cache_bytes * share / 100)


class QueueBudgetTooSmall(ValueError):
    """A victim-queue budget that cannot hold one line in each queue."""


def queue_capacity_for(queue_bytes, num_queues: int, row_bytes: int, cache_bytes: int,
                       at_least_one: bool = False) -> int:
    """Lines per victim queue such that all ``num_queues`` queues (rows and metadata) fit in ``queue_bytes``
    (:func:`queue_budget`); a budget too small for one line each raises, or (``at_least_one``, for a
    default rather than the user's figure) gives one line each."""
    budget = queue_budget(queue_bytes, cache_bytes)
    per_line = queue_memory_bytes(num_queues, 1, row_bytes)
    lines = budget // per_line
    if lines < 1 and at_least_one:
        return 1
    if lines < 1:
        raise QueueBudgetTooSmall(f"pvp_queue_bytes {queue_bytes!r} ({budget:,} bytes) cannot hold one line in each of the "
                         f"{num_queues} victim queues ({per_line:,} bytes); give at least {per_line} bytes or a "
                         "shorter window")
    return int(lines)


@dataclass
class PVPStats:
    """Victim-buffer counters (lines, except bytes_saved)."""

    enqueued: int = 0          # victims copied into a queue
    dropped_no_reuse: int = 0  # victims without a known next use
    dropped_full: int = 0      # victims whose queue was full
    hits: int = 0              # distinct ids served from the prefetch buffer
    unused: int = 0            # queued lines never served (inexact window, repeats, expired queues)
    prefetched: int = 0        # lines moved from a queue to the prefetch buffer
    bytes_saved: int = 0       # hits x row bytes: not read from storage

    @property
    def offered(self) -> int:
        return self.enqueued + self.dropped_no_reuse + self.dropped_full

    def as_dict(self) -> dict:
        d = dict(vars(self))
        d["offered"] = self.offered
        return d


class VictimBuffer:
    """The victim queues and the prefetch buffer of one cache.

    Queues live in host memory: plain on a CPU cache, pinned for a CUDA
    cache (the enqueue kernel writes victims into them through UVA and the
    prefetch is an asynchronous host-to-device copy on a side stream; the
    stream calls are the only lines CPU runs skip, see docs/gpu.md). The
    queue counters live on the cache's device. Rows take
    ``(window + 1) * queue_capacity * row_bytes`` bytes of address space;
    on CPU only the pages victims touch become resident, pinned memory is
    committed whole.
    """

    def __init__(self, window: int, queue_capacity: int, dim: int, dtype: torch.dtype,
                 device: str | torch.device = "cpu", first_iteration: int = 0, num_threads: int = 0):
        if not isinstance(queue_capacity, (int, np.integer)) or isinstance(queue_capacity, bool) \
                or queue_capacity < 1:
            raise ValueError(f"pvp_queue_capacity must be a positive number of lines, got {queue_capacity!r}")
        if window < 1:
            raise ValueError(f"the victim buffer needs a window of at least 1 iteration, got {window}")
        self.window = int(window)
        self.num_queues = self.window + 1
        self.capacity = int(queue_capacity)
        self.device = torch.device(device)
        self.num_threads = num_threads
        cuda = self.device.type == "cuda"
        host = {"pin_memory": True} if cuda else {}
        q, cap = self.num_queues, self.capacity
        self.count = torch.zeros(q, dtype=torch.int64, device=self.device)
        slots = torch.arange(q, dtype=torch.int64)
        self.queue_iteration = (first_iteration + (slots - first_iteration) % q).to(self.device)
        self.node = torch.empty((q, cap), dtype=torch.int64, **host)
        self.record = torch.empty((q, cap), dtype=torch.int64, **host)
        self.data = torch.empty((q, cap, dim), dtype=dtype, **host)
        # A CPU cache serves from the queue in place; a GPU cache copies each queue into a device buffer
        # (_copy_to_device).
        self._in_place = True
        self._background = False
        self.prefetch_node = self.prefetch_record = self.prefetch_data = None
        self._stream = None  # CUDA: the stream of the moves (and discards), the buffer's own
        self._moved = None  # CUDA: recorded on it after the last move's (or discard's) device work
        self._used = None  # CUDA: recorded on the serving stream after its last access (mark_used)
        self._served_slot = 0  # in place: the queue slot the prefetched lines sit in
        self.row_bytes = dim * self.data.element_size()
        self._stats = PVPStats()
        # The enqueue's outcomes (enqueued, dropped without a next use, dropped by a full queue), added to on the
        # device: read when the stats are, not once a batch.
        self.tallies = torch.zeros(3, dtype=torch.int64, device=self.device)
        self._prefetched_iteration: int | None = None  # the iteration the prefetch buffer holds
        self._prefetched_count = 0
        self._frontier = int(first_iteration)  # iterations before it have been moved or expired
        self._pending: tuple[int, threading.Thread, list] | None = None
        self._pending_lock = threading.Lock()
        self._state_lock = threading.Lock()  # queues and prefetch buffer: one writer at a time
        if cuda:
            self._copy_to_device()

    def _copy_to_device(self) -> None:
        """A GPU cache's mode: each queue is copied into a prefetch buffer on the device, on a side stream and a
        background thread. (A test calls it on CPU tensors with torch.cuda's streams replaced by a recording
        stand-in, to check the order of every access on a machine without a GPU.)"""
        cap, dim = self.capacity, self.data.shape[2]
        self._in_place = False
        self._background = True  # the move on a thread: only a copy to the device is worth one
        self.prefetch_node = torch.empty(cap, dtype=torch.int64, device=self.device)
        self.prefetch_record = torch.empty(cap, dtype=torch.int64, device=self.device)
        self.prefetch_data = torch.empty((cap, dim), dtype=self.data.dtype, device=self.device)
        self._slots = torch.arange(cap, device=self.device)  # parked_for's slot numbers
        self._stream = torch.cuda.Stream(self.device)
        # Nothing orders two CUDA streams but events: a move (on this buffer's stream) waits for the serving
        # stream's last access (_used), and the serving stream waits for the last move (_moved) before it reads
        # the prefetch buffer or touches the counters and queues again. The first move waits for the counters'
        # initialisation, on the stream that built the buffer.
        self.mark_used()

    def mark_used(self) -> None:
        """CUDA: the current stream has issued its accesses to the counters, queue labels, queues and prefetch
        buffer; the next move waits for them. :meth:`enqueue` and :meth:`consumed` call it, and the cache after
        every lookup, failed or not (:meth:`serving`). Nothing to do on CPU."""
        if self._stream is not None:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self._used = event

    @contextmanager
    def serving(self):
        """One lookup's use of the buffer on the current stream: the next move waits for all of it, even where
        the lookup raised between :meth:`take` and :meth:`consumed`."""
        try:
            yield self
        finally:
            self.mark_used()

    def _after_move(self) -> None:
        """CUDA: the current stream waits for the last move's writes (and its reads of the queue it recycled)."""
        if self._moved is not None:
            torch.cuda.current_stream(self.device).wait_event(self._moved)

    @contextmanager
    def _on_own_stream(self):
        """CUDA: runs the block's device work on the buffer's stream, after the serving stream's last access,
        and records ``_moved`` after it. On CPU it just runs the block."""
        if self._stream is None:
            yield
            return
        self._stream.wait_event(self._used)
        try:
            with torch.cuda.stream(self._stream):
                yield
        finally:
            self._moved = torch.cuda.Event()
            self._moved.record(self._stream)

    def _host_waits(self) -> None:
        """CUDA: the host waits for all device work on the queues (pinned host memory that the enqueue kernel
        writes and the moves copy from) and the counters, before it reads or writes them itself."""
        if self._stream is not None:
            self._used.synchronize()
            if self._moved is not None:
                self._moved.synchronize()

    @property
    def stats(self) -> PVPStats:
        """The counters (:class:`PVPStats`); on a GPU cache reading them waits for the buffer's device work."""
        self._host_waits()
        self._stats.enqueued, self._stats.dropped_no_reuse, self._stats.dropped_full = self.tallies.tolist()
        return self._stats

    @property
    def memory_bytes(self) -> int:
        """Bytes of host memory reserved for the queues (rows and metadata)."""
        return queue_memory_bytes(self.num_queues, self.capacity, self.row_bytes)

    # -- eviction -----------------------------------------------------------------------------------------------

    def room(self) -> torch.Tensor:
        """uint8 per queue: 1 where the queue has a free slot (for the hybrid_pvp_room policy)."""
        return (self.count < self.capacity).to(torch.uint8)

    def enqueue(self, evicted_tag, evicted_record, evicted_line, cache_data, iteration: int, scan_base: int,
                check: bool = True) -> None:
        """Offers one batch's victims (the cache's assign outputs) to their queues, copying their rows out of
        ``cache_data`` (call before the batch's fill overwrites them). Reads nothing back: the outcomes go to
        :attr:`tallies`. ``check=False``: the lines come from the cache's own assign (no read back to check
        them on a GPU)."""
        with self._state_lock:
            self._after_move()  # the queue it fills was recycled by the last move
            torch.ops.lsm_gnn.victim_enqueue(self.count, self.queue_iteration, self.node, self.record, self.data,
                                             evicted_tag, evicted_record, evicted_line, cache_data, int(iteration),
                                             int(scan_base), self.tallies, self.num_threads, check)
            self.mark_used()

    def discard(self, nodes: torch.Tensor) -> None:
        """Drops every parked or prefetched copy of ``nodes``: their rows changed in storage (a write-back
        cache updated them outside its lines), so a copy would serve stale bytes. Dropped lines count as unused
        when their iteration comes."""
        self.close()  # a background move must not copy a line while it is dropped
        with self._state_lock:
            self._host_waits()  # the queues are written on the host below
            nodes = nodes.to(self.node.device)
            self.node[torch.isin(self.node, nodes)] = -1  # no batch holds id -1: never matched
            if self.prefetch_node is not None:
                with self._on_own_stream():  # ordered as a move: the next take waits for it
                    self.prefetch_node[torch.isin(self.prefetch_node, nodes.to(self.device))] = -1

    def parked_for(self, iteration: int) -> torch.Tensor:
        """The ids parked for ``iteration`` (CPU int64; -1 for a discarded line): that batch's victim-buffer
        hits, which the cache's read-ahead leaves out. Only the queue still collecting for it; a queue
        already moved is the prefetch buffer's.

        A GPU cache's host does not wait here (the loader's thread calls it after every lookup): the queue comes
        back whole, each slot past its count, or every slot of a queue labelled for another iteration, as -1,
        through a copy queued on the current stream. It is valid once an event recorded after this call on that
        stream has passed (the read-ahead's probe records one and its worker waits for it)."""
        slot = iteration % self.num_queues
        with self._state_lock:
            if self._stream is None:  # counters in host memory: read them
                if int(self.queue_iteration[slot]) != iteration:
                    return torch.empty(0, dtype=torch.int64)
                n = min(int(self.count[slot]), self.capacity)
                return self.node[slot, :n].cpu()
            self._after_move()  # a move recycles queues: their labels and counts
            live = torch.where(self.queue_iteration[slot] == iteration, self.count[slot], 0)
            node = self.node[slot].to(self.device, non_blocking=True)  # written by the enqueue kernel, this stream
            parked = torch.where(self._slots < live, node, -1)
            host = torch.empty(self.capacity, dtype=torch.int64, pin_memory=self.device.type == "cuda")
            host.copy_(parked, non_blocking=True)
            self.mark_used()  # the next move, which recycles a queue, waits for these reads
            return host

    # -- prefetch -----------------------------------------------------------------------------------------------

    def prefetch(self, iteration: int) -> None:
        """Moves the queue of ``iteration`` into the prefetch buffer (synchronously) and
        recycles it; queues of earlier iterations expire."""
        self.wait()
        self._move(int(iteration))

    def prefetch_async(self, iteration: int) -> None:
        """:meth:`prefetch` on a background thread (GPU caches; a CPU cache's move is bookkeeping, done
        now); :meth:`take` waits for it."""
        self.wait()
        if not self._background:
            self._move(int(iteration))
            return
        error: list = []

        def run():
            try:
                self._move(int(iteration))
            except BaseException as exc:  # re-raised by wait() in the thread that serves the batch
                error.append(exc)

        thread = threading.Thread(target=run, name="lsm-gnn-pvp", daemon=True)
        with self._pending_lock:
            self._pending = (int(iteration), thread, error)
        thread.start()

    def wait(self) -> None:
        """Waits for a background prefetch; re-raises its error."""
        with self._pending_lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            pending[1].join()
            if pending[2]:
                raise pending[2][0]

    def close(self) -> None:
        """Joins the background prefetch, if any (idempotent); a later :meth:`take` still finds its rows
        and a later :meth:`wait` raises its error."""
        with self._pending_lock:
            pending = self._pending
        if pending is not None:
            pending[1].join()

    def _move(self, t: int) -> None:
        with self._state_lock:
            if self._prefetched_iteration == t or t < self._frontier:
                return  # already moved (a retried lookup finds the same lines), or passed
            # Every device access below on the buffer's stream, after the last lookup's enqueue and serve.
            with self._on_own_stream():
                if self._prefetched_iteration is not None:
                    self._stats.unused += self._prefetched_count  # moved but never served
                    self._prefetched_iteration, self._prefetched_count = None, 0
                q, cap = self.num_queues, self.capacity
                labels = self.queue_iteration
                stale = labels < t
                if bool(stale.any()):  # never served: their iteration passed (a skipped iteration)
                    self._stats.unused += int(self.count[stale].clamp(max=cap).sum())
                    self.count[stale] = 0
                    slots = torch.arange(q, dtype=torch.int64, device=labels.device)
                    labels[stale] = t + (slots[stale] - t) % q
                slot = t % q  # after the expiry above, it collects for iteration t
                n = min(int(self.count[slot]), cap)
                if n and not self._in_place:  # on a GPU cache an asynchronous copy, which take() waits for
                    self.prefetch_node[:n].copy_(self.node[slot, :n], non_blocking=True)
                    self.prefetch_record[:n].copy_(self.record[slot, :n], non_blocking=True)
                    self.prefetch_data[:n].copy_(self.data[slot, :n], non_blocking=True)
                self.count[slot] = 0
                labels[slot] = t + q
                self._served_slot = slot
                self._prefetched_iteration, self._prefetched_count = t, n
                self._frontier = t + 1
                self._stats.prefetched += n

    # -- serving ------------------------------------------------------------------------------------------------

    def take(self, iteration: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(node ids, records, rows) prefetched for ``iteration`` (moved now if no prefetch ran).
        The lines stay until :meth:`consumed`, so a lookup that fails can be retried."""
        self.wait()
        t = int(iteration)
        if self._prefetched_iteration != t:
            self._move(t)
        self._after_move()  # the serving stream reads what the move wrote
        n = self._prefetched_count if self._prefetched_iteration == t else 0  # 0: a passed iteration
        if self._in_place:
            slot = self._served_slot
            return self.node[slot, :n], self.record[slot, :n], self.data[slot, :n]
        return self.prefetch_node[:n], self.prefetch_record[:n], self.prefetch_data[:n]

    def consumed(self, iteration: int, served: int) -> None:
        """Iteration ``iteration`` served ``served`` of the lines :meth:`take` returned."""
        if self._prefetched_iteration != int(iteration):
            if not served:  # nothing was prefetched for it (a passed iteration): nothing to settle
                return
            raise RuntimeError(f"the prefetch buffer holds iteration {self._prefetched_iteration}, not {iteration}")
        self._stats.hits += served
        self._stats.unused += self._prefetched_count - served
        self._stats.bytes_saved += served * self.row_bytes
        self._prefetched_iteration, self._prefetched_count = None, 0
        self.mark_used()  # the next move overwrites the buffer only after this serve read it

    @property
    def pending(self) -> int:
        """Lines queued or prefetched and not yet served or expired."""
        self._host_waits()
        held = int(self.count.clamp(max=self.capacity).sum())
        return held + (self._prefetched_count if self._prefetched_iteration is not None else 0)

    def snapshot(self) -> dict[int, list[tuple[int, int]]]:
        """Queued lines per target iteration, as sorted (node, record) pairs (for comparing with the reference)."""
        self._host_waits()
        out = {}
        counts = self.count.clamp(max=self.capacity).cpu().tolist()
        labels = self.queue_iteration.cpu().tolist()
        for slot, (n, it) in enumerate(zip(counts, labels)):
            if n:
                records = [r & 0xFFFFFFFFFFFFFFFF for r in self.record[slot, :n].tolist()]  # as unsigned
                out[it] = sorted(zip(self.node[slot, :n].tolist(), records))
        return out

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def match_prefetched(ids: torch.Tensor, inverse: torch.Tensor, num_unique: int, node: torch.Tensor,
                     record: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Which prefetched lines serve this batch: the definition of ``torch.ops.lsm_gnn.pvp_match`` in torch
    ops (the C++ and Triton kernels are tested against it; call the op).

    Returns (served [num_unique] bool, entry [num_unique] int64, position [num_unique] int64):
    for a served distinct id ``u``, ``entry[u]`` is its line in the prefetch buffer and
    ``position[u]`` the stored index it is scattered to, where ``ids[position[u]]`` is
    that node. A line is valid if its stored index holds its node; of several valid
    lines for one node, the first serves. Ids no line serves have entry and position -1.
    """
    device = ids.device
    served = torch.zeros(num_unique, dtype=torch.bool, device=device)
    entry = torch.full((num_unique,), -1, dtype=torch.int64, device=device)
    position = torch.full((num_unique,), -1, dtype=torch.int64, device=device)
    if node.numel() == 0 or ids.numel() == 0:
        return served, entry, position
    index = record & INDEX_MASK
    in_range = torch.nonzero(index < ids.numel()).reshape(-1)
    pos = index[in_range]
    ok = ids[pos] == node[in_range]
    lines, pos = in_range[ok], pos[ok]
    if lines.numel() == 0:
        return served, entry, position
    u = inverse[pos]
    order = torch.argsort(u, stable=True)  # the first line per distinct id serves
    first = torch.ones(order.numel(), dtype=torch.bool, device=device)
    first[1:] = u[order[1:]] != u[order[:-1]]
    keep = order[first]
    entry[u[keep]] = lines[keep]
    position[u[keep]] = pos[keep]
    served[u[keep]] = True
    return served, entry, position


def fill_prefetched(ids: torch.Tensor, inverse: torch.Tensor, hit: torch.Tensor, line: torch.Tensor,
                    node: torch.Tensor, record: torch.Tensor, pf_rows: torch.Tensor,
                    cache_data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """PVP with reinstall, matching and scattering in one step after the cache's assign: the definition of
    ``torch.ops.lsm_gnn.pvp_fill`` in torch ops (the kernels are tested against it; call the op).

    Of the ids the cache missed (``~hit``), those a prefetched line serves (:func:`match_prefetched`) get
    that line's row in their new cache line ``line[u]`` (where it is not -1), from which the batch's gather
    serves them. Returns (from_pvp [num_unique] bool, entry [num_unique] int64, -1 where not served).
    """
    served, entry, _ = match_prefetched(ids, inverse, hit.numel(), node, record)
    from_pvp = served & ~hit  # a cache hit wins over a queued copy
    entry = torch.where(from_pvp, entry, torch.full_like(entry, -1))
    install_prefetched(cache_data, pf_rows, from_pvp, entry, line)
    return from_pvp, entry


def install_prefetched(cache_data: torch.Tensor, pf_rows: torch.Tensor, from_pvp: torch.Tensor, entry: torch.Tensor,
                       line: torch.Tensor) -> None:
    """The second half of :func:`fill_prefetched`, for a device cache that matched before its read back: the
    definition of ``torch.ops.lsm_gnn.pvp_install`` in torch ops (the kernels are tested against it; call the op).
    Each distinct id ``u`` served (``from_pvp[u]``) with a line (``line[u] >= 0``) gets ``pf_rows[entry[u]]``
    there."""
    filled = torch.nonzero(from_pvp & (line >= 0)).reshape(-1)
    cache_data.index_copy_(0, line[filled], pf_rows[entry[filled]])


def scatter_prefetched(rows: torch.Tensor, cache_data: torch.Tensor, pf_rows: torch.Tensor, inverse: torch.Tensor,
                       from_pvp: torch.Tensor, entry: torch.Tensor, line: torch.Tensor | None) -> None:
    """Writes the prefetched rows of the ids served from the victim buffer: the definition of
    ``torch.ops.lsm_gnn.pvp_scatter`` in torch ops (the kernels are tested against it; call the op).

    Every request position ``j`` whose distinct id ``u = inverse[j]`` has ``from_pvp[u]`` gets
    ``pf_rows[entry[u]]``: the paper's scatter to the stored index, and every repeat of the id. With
    ``line`` (reinstalling), the row also fills cache line ``line[u]`` where that is not -1.
    """
    positions = torch.nonzero(from_pvp[inverse]).reshape(-1)
    if positions.numel() == 0:
        return
    rows.index_copy_(0, positions, pf_rows[entry[inverse[positions]]])
    if line is not None:
        reinstalled = torch.nonzero(from_pvp & (line >= 0)).reshape(-1)
        cache_data.index_copy_(0, line[reinstalled], pf_rows[entry[reinstalled]])
