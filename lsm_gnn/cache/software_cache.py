"""The software cache: 32-way set-associative, policy-driven, in front of a storage.

Semantics are those of :mod:`lsm_gnn.cache.reference` (the oracle); the
metadata work runs in the native core (OpenMP across sets), rows move with
torch index ops. State lives in tensors owned by this object. A lookup is the
named stages of :mod:`lsm_gnn.cache.plan` over a per-batch plan, with the
victim buffer's part in one strategy object per PVP mode (:mod:`lsm_gnn.cache.pvp`).
"""
from __future__ import annotations

import threading
import time

import numpy as np
import torch

from lsm_gnn.cache.geometry import CacheTooSmall, cache_geometry
from lsm_gnn.cache.hashing import set_of
from lsm_gnn.cache.hits_first import HitsFirst, ServeGraphs, distinct_padded
from lsm_gnn.kernels.layout import INDEX_MASK, INVALID_TAG, REUSE_SHIFT
from lsm_gnn.cache.policies import PolicyConfig, quantize_scores
from lsm_gnn.cache.plan import LookupPlan
from lsm_gnn.cache.pvp import DEFAULT_QUEUE_BYTES, VictimBuffer, queue_capacity_for
from lsm_gnn.cache.pvp_modes import lookup_strategy
from lsm_gnn.cache.read_ahead import ReadAhead, default_depth
from lsm_gnn.cache.staging import MissStaging, side_stream
from lsm_gnn.cache.state import Assignment, CacheState
from lsm_gnn.cache.stats import CacheStats
from lsm_gnn.cache.window import WindowBuffer
from lsm_gnn.defaults import PERIOD, READ_AHEAD_BYTES, WAYS, WINDOW, policy_for
from lsm_gnn.features import StorageShape
from lsm_gnn.hostmem import host_zeros
from lsm_gnn.ids import as_id_tensor, unique_ids
from lsm_gnn.kernels import kernel_mode
from lsm_gnn.kernels import ops as _ops  # noqa: F401  (registers torch.ops.lsm_gnn)

#: bytes of dirty lines :meth:`SoftwareCache.flush` hands the storage per write (bounds the copies it makes)
FLUSH_BYTES = 16 << 20


def _words(rows: torch.Tensor) -> torch.Tensor:
    """A contiguous 2-D tensor of bytes (an embedding table's rows) as int64 words where its rows allow,
    for index copies; any other tensor as it is."""
    if rows.dtype == torch.uint8 and rows.dim() == 2 and rows.shape[1] % 8 == 0 and rows.is_contiguous():
        return rows.view(torch.int64)
    return rows


def _as_bytes(rows: torch.Tensor) -> torch.Tensor:
    """A contiguous ``[n, dim]`` tensor as ``[n, row bytes]`` uint8, the same memory."""
    return rows.view(torch.uint8).view(rows.shape[0], rows.shape[1] * rows.element_size())


def static_ranks(scores) -> torch.Tensor | None:
    """Per-node static scores as the int16 view of uint16 ranks the native core reads."""
    if scores is None:
        return None
    scores = np.asarray(scores)
    ranks = scores if scores.dtype == np.uint16 else quantize_scores(scores)
    return torch.from_numpy(np.ascontiguousarray(ranks).view(np.int16))


def _cache_device(device) -> torch.device:
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


class SoftwareCache(StorageShape):
    """A set-associative cache of feature rows in front of ``storage``.

    ``lookup(ids, future)`` serves one iteration: it returns the rows of
    ``ids`` in request order (always exactly the bytes in storage) and a mask
    of which ids were hits. ``future`` is the window of upcoming batches (a
    :class:`WindowBuffer`, ideally built with ``num_nodes`` for its native
    index, or a list of id tensors); it feeds the dynamic policies.
    Concurrent lookups are serialized batch by batch; each batch runs in parallel.

    A batch with more distinct ids than the cache has lines raises
    :class:`CacheTooSmall` (a ValueError, naming ``sized_by``: the config key of the cache's size, if
    any), since such a cache thrashes; ``oversubscribe=True`` allows it
    (lines of the current batch are then evicted last), for studies that
    scale caches below one batch.

    ``pvp=True`` adds the Preemptive Victim-buffer Prefetcher
    (:mod:`lsm_gnn.cache.pvp`): evicted lines with a known next use wait in
    one queue per future iteration (``pvp_queue_capacity`` lines each) and
    serve that iteration's batch without a storage read (``pvp_reinstall=True``:
    they are installed in the cache as misses read from the queue; ``False``:
    they bypass the cache, as in the paper). ``pvp_queue_bytes`` bounds all
    queues' memory instead (``"256M"``, or a share of the cache's bytes: the
    default is ``"25%"``, see :data:`lsm_gnn.defaults.PVP_QUEUE_BYTES`).
    ``self.pvp`` is then the
    :class:`~lsm_gnn.cache.pvp.VictimBuffer` (counters in ``self.pvp.stats``);
    ``hit_mask`` and ``stats.combined_hit_ratio`` count its hits, while
    ``stats.hit_ratio`` counts the cache's own.

    Over a writable storage (``storage.writable``: an embedding table) the cache is write-back:
    :meth:`update` changes rows in their lines, which become dirty; a dirty line is written to the storage
    when it is evicted (before its victim-buffer copy is made, so a parked line is always clean) and by
    :meth:`flush`. ``stats`` counts the rows written back and ``last_timings["write-back"]`` their seconds.

    ``read_ahead``: after each lookup the cache asks for the rows its next ``read_ahead`` batches (of the
    ``future`` window) will miss, read on a thread of their own (:mod:`lsm_gnn.cache.read_ahead`), so the disk
    reads while the loader does everything else; at most ``read_ahead_bytes`` of rows are held. ``None``: 2
    where misses come from a disk (``storage.from_disk``) that nobody writes,
    with 256 MiB of memory available (:func:`~lsm_gnn.cache.read_ahead.default_depth`), else 0 (off). What is read ahead changes where a miss's bytes come from, never a result.

    ``hits_first``: serve a batch's hits in one kernel before any other work (:mod:`lsm_gnn.cache.hits_first`),
    so a batch that hits in full costs one launch and one read back; only a batch with misses computes its
    distinct ids and assigns them. ``None``: on for a cache on a GPU without PVP. (``True`` on a CPU cache runs
    the kernel under Triton's interpreter, for tests; the C++ core assigns a whole batch faster there.)
    ``graphs``: opt-in, a GPU cache with hits first: a lookup given ``out`` serves its hits by replaying a CUDA
    graph kept per batch size and ``out`` buffer (:class:`~lsm_gnn.cache.hits_first.ServeGraphs`), which skips
    Triton's launcher; worth it where batches hit in full and the caller reuses a few ``out`` buffers.

    Defaults: ``policy=None`` is ``"farthest"``, with or without PVP;
    ``pvp_reinstall=None`` is on with PVP, so PVP leaves the cache's
    decisions as they are without it and only turns misses into PVP hits.
    Both were the best measured settings (``docs/benchmarks/pvp.md``);
    ``policy="hybrid"`` is the paper's policy, and ``policy="hybrid_pvp",
    pvp_reinstall=False`` its PVP design as published.
    """

    def __init__(self, storage, capacity=None, *, ways: int = WAYS, policy: str | PolicyConfig | None = None,
                 window: int = WINDOW, period: int = PERIOD, threshold: int | None = None, levels=None,
                 static_scores=None, num_sets: int | None = None, oversubscribe: bool = False,
                 device: str | torch.device = "cpu", num_threads: int = 0, pvp: bool = False,
                 pvp_queue_capacity: int | None = None, pvp_queue_bytes=None, pvp_reinstall: bool | None = None,
                 read_ahead: int | None = None, read_ahead_bytes=READ_AHEAD_BYTES, hits_first: bool | None = None,
                 graphs: bool = False, sized_by: str | None = None):
        self.storage = storage
        self.sized_by = sized_by  # the config key of its size, which its CacheTooSmall names
        if policy is None:  # the best measured default (docs/benchmarks/pvp.md, PVP section)
            policy = policy_for(pvp)
        if pvp_reinstall is None:
            pvp_reinstall = bool(pvp)
        if isinstance(policy, PolicyConfig):
            self.policy = policy
        else:
            self.policy = PolicyConfig(policy, window=window, period=period, threshold=threshold,
                                       levels=tuple(levels) if levels is not None else None)
        self.num_sets, self.ways = self._geometry(capacity, num_sets, ways)
        self.device = _cache_device(device)
        self.state = CacheState.empty(self.num_sets, self.ways, self.device)
        self.data = host_zeros((self.num_lines, storage.dim), storage.dtype) if self.device.type == "cpu" else \
            torch.zeros((self.num_lines, storage.dim), dtype=storage.dtype, device=self.device)
        self.node_static = self._static_ranks(static_scores)
        self.num_threads = num_threads
        self.oversubscribe = oversubscribe
        self.iteration = 0
        self.scan_base = 0
        self.stats = CacheStats()
        self._lock = threading.Lock()
        # Write-back over a writable storage: lines changed since they were read or last written back.
        writable = storage.writable
        self.dirty = torch.zeros(self.num_lines, dtype=torch.bool, device=self.device) if writable else None
        self.last_timings = {"write-back": 0.0} if writable else {}
        self._failed: BaseException | None = None  # a write-back that failed: the dirty rows it held are gone
        # The last lookup's rows that got no line (bypassed), which an update before the next lookup needs.
        self._lineless: tuple[torch.Tensor, torch.Tensor] | None = None
        # How misses reach the lines, from where the storage reads to (see miss_path): decided here, once.
        # (A stand-in storage that does not say where it reads to reads to the host, as FeatureStorage's default.)
        self.miss_path = miss_path(getattr(storage, "device", torch.device("cpu")), self.device)
        self._staging = MissStaging(self.device) if self.miss_path == "staged" else None
        # Straight into their lines where the storage reads to the cache's device (its read_into; None: not).
        self._read_into = storage.read_into if self.miss_path == "direct" else None
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.pvp_reinstall = bool(pvp_reinstall)
        self.pvp: VictimBuffer | None = self._victim_buffer(pvp, pvp_queue_capacity, pvp_queue_bytes)
        # PVP's part of every lookup, by mode (lsm_gnn.cache.pvp): chosen here, once.
        self._victims = lookup_strategy(self.pvp, self.pvp_reinstall)
        self.read_ahead = self._read_ahead(read_ahead, read_ahead_bytes)
        self._hits_first = self._serving_hits_first(hits_first, graphs)

    def _serving_hits_first(self, wanted: bool | None, graphs: bool) -> HitsFirst | None:
        """The constructor's ``hits_first`` (see the class) as the buffers it reuses, or None."""
        if wanted is None:
            wanted = self.device.type == "cuda" and self.pvp is None
        if wanted and self.pvp is not None:
            raise ValueError("hits_first=True needs pvp=False: the victim buffer's part of a lookup needs the "
                             "batch's distinct ids, which serving hits first avoids computing")
        if wanted and self.device.type == "cpu" and kernel_mode() != "triton":
            raise ValueError("hits_first=True on a CPU cache runs the device kernel under Triton's interpreter: "
                             "construct the cache under lsm_gnn.kernels.using('triton') (tests), or leave "
                             "hits_first=None (a CPU cache assigns whole batches in the C++ core)")
        if graphs and not wanted:
            raise ValueError("graphs=True captures the serving of hits first: it needs hits_first (a GPU cache "
                             "without PVP)")
        return HitsFirst(self.num_lines, self.device, ServeGraphs(self.device) if graphs else None) \
            if wanted else None

    def _read_ahead(self, depth: int | None, max_bytes) -> ReadAhead | None:
        """The read-ahead of the constructor's ``read_ahead`` batches (see the class), or None."""
        if depth is None:
            depth = default_depth(getattr(self.storage, "from_disk", False) and not self.writable)
        if depth < 0:
            raise ValueError(f"read_ahead is a number of batches >= 0 (0: off), got {depth}")
        return ReadAhead(self.storage, depth, max_bytes, self.device) if depth else None

    def _geometry(self, capacity, num_sets: int | None, ways: int) -> tuple[int, int]:
        """(num_sets, ways) from the constructor's capacity or num_sets."""
        if num_sets is None:
            if capacity is None:
                raise ValueError("give the cache a capacity in bytes (e.g. '4G') or num_sets")
            num_sets, ways = cache_geometry(capacity, self.storage.row_bytes, ways, self.storage.num_rows)
        elif num_sets < 1 or ways < 1:
            raise ValueError(f"a cache needs at least one set and one way, got {num_sets} x {ways}")
        return int(num_sets), int(ways)

    def _static_ranks(self, static_scores) -> torch.Tensor | None:
        """:func:`static_ranks` on the cache's device, one per node of the storage."""
        ranks = static_ranks(static_scores)
        if ranks is None:
            return None
        ranks = ranks.to(self.device)
        if ranks.numel() != self.storage.num_rows:
            raise ValueError(f"static_scores has {ranks.numel()} entries; the storage has "
                             f"{self.storage.num_rows} nodes")
        return ranks

    def _victim_buffer(self, pvp: bool, queue_capacity: int | None, queue_bytes) -> VictimBuffer | None:
        """The victim buffer of ``pvp=True``, its queues sized by lines or by bytes (see the class)."""
        if queue_capacity is not None and queue_bytes is not None:
            raise ValueError(f"give the victim queues' size once: pvp_queue_capacity={queue_capacity!r} (lines "
                             f"per queue) or pvp_queue_bytes={queue_bytes!r} (all queues), not both")
        if not pvp:
            if self.pvp_reinstall:
                raise ValueError("pvp_reinstall=True needs pvp=True")
            return None
        if queue_capacity is None:
            queue_capacity = queue_capacity_for(DEFAULT_QUEUE_BYTES if queue_bytes is None else queue_bytes,
                                                self.policy.window + 1, self.storage.row_bytes, self.capacity_bytes,
                                                at_least_one=queue_bytes is None)
        return VictimBuffer(self.policy.window, queue_capacity, self.storage.dim, self.storage.dtype, self.device,
                            first_iteration=self.iteration, num_threads=self.num_threads)

    @property
    def num_lines(self) -> int:
        return self.num_sets * self.ways

    @property
    def capacity_bytes(self) -> int:
        return self.num_lines * self.storage.row_bytes

    def scan(self, future) -> None:
        """Sets every cached line's next reuse from ``future`` (future[0] = next iteration)."""
        self._scan(self._first_occurrence(future))

    def _first_occurrence(self, future) -> tuple:
        """``future``'s per-node first occurrences on the cache's device (``WindowBuffer.first_occurrence``)."""
        window = future if isinstance(future, WindowBuffer) and future.index is not None else None
        if window is None:  # a plain list of batches: index it now (O(ids in the window))
            window = WindowBuffer(self.policy.window, self.storage.num_rows)
            for k, batch in enumerate(future):
                if k >= self.policy.window:
                    break
                window.push(batch)
        return window.first_occurrence(self.device)

    def _scan(self, first_occurrence: tuple) -> None:
        self.state.scan(*first_occurrence, self.policy.window, self.num_threads)
        self.scan_base = self.iteration
        self.stats.scans += 1

    def lookup(self, ids, future=None, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Serves one iteration; returns (rows [len(ids), dim] in request order, hit mask [len(ids)]).

        The hit mask marks ids served without reading storage: cache hits and,
        with PVP, victim-buffer hits. ``out``, a contiguous ``[len(ids), dim]``
        tensor of the cache's dtype and device, receives the rows: reusing one
        avoids faulting in fresh memory on every batch (which costs more than
        the copy itself). The work is the stages of :mod:`lsm_gnn.cache.plan`.
        """
        ids = as_id_tensor(ids).to(self.device)
        self._check_out(ids.numel(), out)
        # With PVP, the victim buffer's next move waits for this lookup's accesses on the side stream (serving).
        with self._lock, side_stream(self._stream) as caller, self._victims.serving():
            plan = self._begin(ids, future, out)
            if not plan.served:
                self._before_assign(plan)
                self._assign(plan)
                try:
                    self._evict(plan)
                    self._after_assign(plan)
                    self._fill(plan)
                except BaseException:
                    # The new tags are installed but their rows may never have been written:
                    # forget those lines, so a later lookup cannot hit stale bytes.
                    self._forget_unfilled(plan.line, plan.hit)
                    raise
            result = self._account(plan, caller)
            self._request_ahead(plan.future)
            return result

    def _check_out(self, num_ids: int, out: torch.Tensor | None) -> None:
        """``out``, if given, must be able to receive the rows of ``num_ids`` ids as they are."""
        shape = (num_ids, self.storage.dim)
        if out is not None and (tuple(out.shape) != shape or out.dtype != self.data.dtype
                                or out.device != self.device or not out.is_contiguous()):
            raise ValueError(f"out must be a contiguous {self.data.dtype} tensor of shape {shape} on {self.device}, "
                             f"got {out.dtype} {tuple(out.shape)} on {out.device}")

    # -- the stages of a lookup (lsm_gnn.cache.plan), in order --------------------------------------------------

    def _begin(self, ids: torch.Tensor, future=None, out: torch.Tensor | None = None) -> LookupPlan:
        """The batch's plan: its distinct ids, checked against the storage, and its prefetched lines.

        Serving hits first (:mod:`lsm_gnn.cache.hits_first`), the window scan when due comes first; then, where the
        last batch hit in full, the hits are served, and a batch that hits in full too ends here. Else the
        distinct ids are found without reading their number back (padded, with the batch's range, which
        :meth:`_read_assigned` checks): one read back in all for a batch with misses."""
        self._check_intact()
        t, scanned, rows, distinct_at_most = self.iteration, False, None, ids.numel()
        window, scan_now = self._window(t, future)
        num_distinct = None
        if self._hits_first is not None:
            if scan_now:  # a scan precedes the batch's hits
                self._scan(window)
                scanned = True
            rows = out if out is not None else self._rows_for(ids.numel())
            probe = self._probe_hits(ids, rows, t, window, out is not None) \
                if self._hits_first.probing or not ids.numel() else None
            if probe is not None and probe.misses == 0:
                return LookupPlan(t, ids, None, None, future, out, cache_ids=None, served=True, rows=rows,
                                  request_hit=probe.hit, num_unique=probe.distinct_hits)
            if probe is not None:
                distinct_at_most = probe.distinct_hits + probe.misses
            # Padded to the batch's size; their number, smallest and largest left on the device.
            unique, inverse, num_distinct = distinct_padded(ids, self.storage.num_rows)
        else:
            unique, inverse = unique_ids(ids)
            if unique.numel():
                self._check_range(int(unique[0]), int(unique[-1]))
        plan = LookupPlan(t, ids, unique, inverse, future, out, cache_ids=unique, window=window,
                          scan_due=scan_now and not scanned, rows=rows, num_distinct=num_distinct,
                          distinct_at_most=distinct_at_most)
        self._victims.take(plan)
        return plan

    def _probe_hits(self, ids: torch.Tensor, rows: torch.Tensor, t: int, window, rows_kept: bool):
        """The hits of ``ids`` served into ``rows`` (:meth:`HitsFirst.serve`); an id out of range refused."""
        probe = self._hits_first.serve(self.state, self.data, ids, rows, self.storage.num_rows, t, self.scan_base,
                                       self._window_at_assign(window), rows_kept=rows_kept)
        if probe.out_of_range:
            self._check_range(*(int(v) for v in torch.aminmax(ids)))
        return probe

    def _check_range(self, low: int, high: int) -> None:
        """Refuses a batch whose smallest or largest id (``low``, ``high``) lies outside the storage."""
        if low < 0 or high >= self.storage.num_rows:
            raise IndexError(f"node id {low if low < 0 else high} is out of range [0, {self.storage.num_rows})")

    def _rows_for(self, num_ids: int) -> torch.Tensor:
        return torch.empty((num_ids, self.storage.dim), dtype=self.data.dtype, device=self.device)

    def _window(self, t: int, future) -> tuple[tuple | None, bool]:
        """(``future``'s first occurrences where iteration ``t`` reads them, whether a window scan is due at ``t``).
        PVP needs next-use records for every policy, not only the window-based ones."""
        p = self.policy
        scan_now = (p.uses_window or self.pvp is not None) and t % p.period == 0
        window = self._first_occurrence(future) if future is not None and (scan_now or p.assign_next_use) \
            else None
        return window, scan_now and window is not None

    def _window_at_assign(self, window: tuple | None) -> tuple | None:
        """``window`` with the policy's limit, where the policy gives hits and installs their next use at once."""
        return (*window, self.policy.window) if window is not None and self.policy.assign_next_use else None

    def _before_assign(self, plan: LookupPlan) -> None:
        """PVP's work before the cache decides (the paper's mode: the ids it serves skip the cache)."""
        self._victims.before_assign(plan)

    def _assign(self, plan: LookupPlan) -> None:
        """Hits, victims and installs of the ids the cache sees, after the window scan when one is due."""
        if plan.cache_ids.numel() > self.num_lines and not self.oversubscribe:
            # (Padded, the distinct ids are at most those that hit and the ids that missed: read their number
            # back only where that bound does not fit.)
            distinct = plan.cache_ids.numel() if plan.num_distinct is None else \
                plan.distinct_at_most if plan.distinct_at_most <= self.num_lines else int(plan.num_distinct)
            if distinct > self.num_lines:
                raise CacheTooSmall(distinct, self.num_lines, self.storage.row_bytes, self.sized_by)
        if plan.scan_due:
            self._scan(plan.window)
        p = self.policy
        assigned = self.state.assign(plan.cache_ids, self.node_static, p, plan.t, self.scan_base,
                                     self._victims.room(p), self.num_threads, plan.window,
                                     has_misses=plan.num_distinct is not None)
        plan.done = assigned.read() if plan.num_distinct is None else self._read_assigned(plan, assigned)
        plan.line, plan.hit = plan.done.line, plan.done.hit

    def _read_assigned(self, plan: LookupPlan, assigned) -> Assignment:
        """Serving hits first: the assign's counts, the number of distinct ids, the batch's smallest and largest
        id, and the ids that missed with their lines, in one read back (of the batch's size); the plan's distinct
        ids cut to their number. (A batch with an id out of range was assigned as padding: nothing changed.)"""
        order = torch.argsort(assigned.hit, stable=True)  # the misses first, in ascending id order
        host = torch.cat([assigned.counts, plan.num_distinct, plan.cache_ids[order], assigned.line[order]]).cpu()
        n, counts, (num_unique, low, high) = order.numel(), host[:4].tolist(), host[4:7].tolist()
        self._check_range(low, high)
        misses = counts[3]
        self._hits_first.probing = misses == 0  # a batch that hit in full: the next one may too
        plan.miss = order[:misses]
        plan.miss_ids, plan.miss_cached = host[7:7 + misses], host[7 + n:7 + n + misses] >= 0
        plan.unique = plan.cache_ids = plan.unique[:num_unique]
        return Assignment(*(t[:num_unique] for t in assigned[:5]), *counts[:3])

    def _evict(self, plan: LookupPlan) -> None:
        """The victims leave before any row overwrites their lines: dirty ones to the storage (so a parked copy
        is always clean), then to their victim queues."""
        if self.dirty is not None:
            self.last_timings["write-back"] = 0.0
            if plan.done.evictions:
                self._write_back(plan.done, plan.cache_ids)
        self._victims.park(plan, self.data, self.scan_base)

    def _after_assign(self, plan: LookupPlan) -> None:
        """Back to every distinct id; hit rows out first where the batch evicted lines it uses; then PVP's rows
        into the new lines (reinstalling)."""
        if plan.keep is not None:  # the ids the victim buffer serves bypassed the cache: they have no line
            line = torch.full((plan.unique.numel(),), -1, dtype=torch.int64, device=self.device)
            hit = torch.zeros(plan.unique.numel(), dtype=torch.bool, device=self.device)
            line[plan.keep], hit[plan.keep] = plan.line, plan.hit
            plan.line, plan.hit = line, hit
        plan.request_line = plan.line[plan.inverse]
        plan.request_hit = plan.hit[plan.inverse]
        if plan.rows is None:  # (serving hits first made them)
            plan.rows = plan.out if plan.out is not None else self._rows_for(plan.ids.numel())
        # No line this batch uses was evicted (the usual case): after the fill every id's line holds its row, and
        # one gather serves hits and misses alike. Otherwise hit rows go first, before a later miss overwrites
        # their line, and each miss row is copied to its positions.
        plan.one_gather = plan.done.evicted_in_use == 0
        if not plan.one_gather:
            torch.index_select(self.data, 0, plan.request_line.clamp_min(0), out=plan.rows)
        self._victims.after_assign(plan, self.data)

    def _fill(self, plan: LookupPlan) -> None:
        """The misses from storage, the rows in request order, then the rows the victim buffer served."""
        if plan.miss is None:  # (serving hits first, the assign's read back found them)
            need = ~plan.hit if plan.from_pvp is None else ~plan.hit & ~plan.from_pvp  # read from storage
            plan.miss = torch.nonzero(need).reshape(-1)
            if plan.miss.numel():
                plan.miss_ids = plan.unique[plan.miss].cpu()
        apart = self._read_misses(plan) if plan.miss.numel() else None
        if plan.one_gather:  # PVP-served ids without a line (the paper's mode) get their rows from the PVP below
            torch.index_select(self.data, 0, plan.request_line.clamp_min(0), out=plan.rows)
        if apart is not None:
            self._rows_apart(plan, *apart)
        self._victims.serve(plan, self.data)

    def _read_misses(self, plan: LookupPlan) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Reads the misses into their lines; returns the distinct ids whose rows go to their positions from
        elsewhere than a line (misses the policy left uncached, or all when hit rows went first) and those rows.
        Rows read ahead (:meth:`_request_ahead`) are taken from there; the storage reads the rest."""
        miss, miss_ids, miss_cached = plan.miss, plan.miss_ids, plan.miss_cached
        early = None if self.read_ahead is None else self.read_ahead.take(plan.t, miss_ids)
        self.stats.bytes_read += miss.numel() * self.storage.row_bytes
        if early is None:
            return self._read_rows(plan, miss, miss_ids, miss_cached)
        where, rows = torch.as_tensor(early[0]).cpu(), early[1].to(self.device)
        left = torch.ones(miss.numel(), dtype=torch.bool)  # on the host, where the ids are
        left[where] = False
        left = torch.nonzero(left).reshape(-1)
        apart = self._read_rows(plan, miss[left.to(self.device)], miss_ids[left],
                                None if miss_cached is None else miss_cached[left]) if left.numel() else None
        got = miss[where.to(self.device)]
        lines = plan.line[got]
        cached = lines >= 0
        self.data.index_copy_(0, lines[cached], rows[cached])
        if plan.one_gather:  # only the rows without a line go to their positions apart
            got, rows = got[~cached], rows[~cached]
        if got.numel():
            apart = (got, rows) if apart is None else (torch.cat([apart[0], got]), torch.cat([apart[1], rows]))
        return apart

    def _request_ahead(self, future) -> None:
        """Asks the read-ahead for the rows the next batches of ``future`` will miss as the cache stands now
        (:meth:`ReadAhead.request_misses`), less those parked in the victim buffer for their batch."""
        if self.read_ahead is None or future is None:
            return
        batches = [as_id_tensor(future[j]) for j in range(min(self.read_ahead.depth, len(future)))]
        self.read_ahead.request_misses(self.iteration, batches, self.state.tags, self.ways,
                                       None if self.pvp is None else self.pvp.parked_for)

    def _read_rows(self, plan: LookupPlan, miss: torch.Tensor, miss_ids: torch.Tensor,
                   miss_cached: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Reads the rows of the misses ``miss`` (positions in ``plan.unique``; ``miss_ids`` their ids on the
        host, ``miss_cached`` whether each got a line, on the host where known) from the storage into their lines;
        returns the rows that go to their positions apart, as :meth:`_read_misses` does."""
        miss_lines = plan.line[miss]
        cached = miss_lines >= 0
        # A miss without a line: bypassed, or (sets overflowing) its line taken again by a later id.
        every_miss_cached = (plan.one_gather and plan.done.bypassed == 0) or bool(
            (cached if miss_cached is None else miss_cached).all())
        apart = None
        if plan.one_gather and self._read_into is not None:  # read straight into their lines
            if every_miss_cached:
                self._read_into(miss_ids, self.data, miss_lines)
            else:
                on_host = cached.cpu() if miss_cached is None else miss_cached
                self._read_into(miss_ids[on_host], self.data, miss_lines[cached])
                apart = (miss[~cached], self.storage.read(miss_ids[~on_host]))
        else:
            fetched = self.storage.read(miss_ids).to(self.device) if self._staging is None else \
                self._staging.read(self.storage, miss_ids)
            if every_miss_cached:
                self.data.index_copy_(0, miss_lines, fetched)
            else:
                self.data.index_copy_(0, miss_lines[cached], fetched[cached])
            if not plan.one_gather:
                apart = (miss, fetched)
            elif not every_miss_cached:
                apart = (miss[~cached], fetched[~cached])
        return apart

    def _rows_apart(self, plan: LookupPlan, apart_ids: torch.Tensor, apart_rows: torch.Tensor) -> None:
        """Copies the rows of the distinct ids ``apart_ids`` to every position of those ids in the request."""
        slot = torch.full((plan.unique.numel(),), -1, dtype=torch.int64, device=self.device)
        slot[apart_ids] = torch.arange(apart_ids.numel(), device=self.device)
        of_request = slot[plan.inverse]
        positions = torch.nonzero(of_request >= 0).reshape(-1)
        if self.device.type == "cpu" and apart_rows.is_contiguous():  # one copy, not a gather then a scatter
            from lsm_gnn import _C

            _C.copy_rows(_as_bytes(plan.rows), positions, _as_bytes(apart_rows), of_request[positions])
        else:
            plan.rows[positions] = apart_rows[of_request[positions]]

    def _account(self, plan: LookupPlan, caller=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Counts the batch and ends its iteration; returns (rows, hit mask), kept alive for the ``caller``'s
        stream where the lookup ran on a side stream."""
        s = self.stats
        s.iterations += 1
        s.requests += plan.ids.numel()
        self.iteration += 1
        if plan.served:  # every id hit: no line was taken, none is without one
            s.unique += plan.num_unique
            s.hits += plan.num_unique
            self._lineless = None
            return self._to_caller(plan.rows, plan.request_hit, caller)
        done, unique, misses = plan.done, plan.unique.numel(), plan.miss.numel()
        s.unique += unique
        s.misses += misses
        s.pvp_hits += plan.pvp_hits
        s.hits += unique - misses - plan.pvp_hits
        s.evictions += done.evictions
        s.evicted_in_use += done.evicted_in_use
        s.bypassed += done.bypassed
        request_hit = plan.request_hit if not plan.pvp_hits else plan.request_hit | plan.from_pvp[plan.inverse]
        if self.dirty is not None:
            self._remember_lineless(plan.unique, plan.inverse, plan.line, plan.rows)
        return self._to_caller(plan.rows, request_hit, caller)

    @staticmethod
    def _to_caller(rows: torch.Tensor, hit: torch.Tensor, caller) -> tuple[torch.Tensor, torch.Tensor]:
        if caller is not None:  # made on the side stream, used on the caller's: not freed before
            rows.record_stream(caller)
            hit.record_stream(caller)
        return rows, hit

    # -- writes (over a writable storage) ------------------------------------------------------------------------

    def _check_intact(self) -> None:
        if self._failed is not None:
            raise RuntimeError(f"this cache lost dirty rows when writing them back failed ({self._failed}); "
                               "resume from the last checkpoint (its table is intact)") from self._failed

    def _write_back(self, done, assigned: torch.Tensor) -> None:
        """Writes the dirty lines among one batch's victims (``done``: the assignment of the sorted distinct
        ``assigned``) to the storage and marks them clean."""
        tags, lines = done.evicted_tag, done.evicted_line
        # A line taken twice in one batch (a set given more ids than ways) also evicts a row installed by this
        # batch: only the line's earlier occupant, never one of the batch's misses, can hold changes.
        position = torch.searchsorted(assigned, tags).clamp_max(max(assigned.numel() - 1, 0))
        installed_now = (assigned[position] == tags) & ~done.hit[position] if assigned.numel() else False
        victim = (tags != INVALID_TAG) & ~installed_now
        victim[victim.clone()] = self.dirty[lines[victim]]
        if bool(victim.any()):
            self._write_lines(tags[victim], lines[victim])

    def _write_lines(self, tags: torch.Tensor, lines: torch.Tensor) -> None:
        """Writes ``lines`` (holding rows of ``tags``) to the storage in id order and marks them clean; a failure
        leaves the cache refusing every later call (those rows exist nowhere else)."""
        start = time.perf_counter()
        order = torch.argsort(tags)
        tags, lines = tags[order], lines[order]
        try:
            self.storage.write(tags.cpu(), self.data[lines].cpu())  # a device cache's lines go to the host first
        except BaseException as exc:
            self._failed = exc
            raise
        self.dirty[lines] = False
        self.stats.written_back += tags.numel()
        self.stats.bytes_written += tags.numel() * self.storage.row_bytes
        self.last_timings["write-back"] = self.last_timings.get("write-back", 0.0) + time.perf_counter() - start

    def _remember_lineless(self, unique: torch.Tensor, inverse: torch.Tensor, line: torch.Tensor,
                           rows: torch.Tensor) -> None:
        """Keeps the rows of this lookup's distinct ids that have no line (sorted by id), so that updating them
        before the next lookup does not read them from storage again."""
        lost = torch.nonzero(line < 0).reshape(-1)
        if lost.numel() == 0:
            self._lineless = None
            return
        position = torch.empty(unique.numel(), dtype=torch.int64, device=self.device)
        position.scatter_(0, inverse, torch.arange(inverse.numel(), device=self.device))
        self._lineless = (unique[lost], rows[position[lost]])

    def _stored_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows of uncached ``ids`` as stored: kept from the last lookup where it had them, else read."""
        out = torch.empty((ids.numel(), self.storage.dim), dtype=self.data.dtype, device=self.device)
        missing = torch.ones(ids.numel(), dtype=torch.bool, device=self.device)
        if self._lineless is not None:
            known, known_rows = self._lineless
            ids_here = ids.to(self.device)
            at = torch.searchsorted(known, ids_here).clamp_max(known.numel() - 1)
            found = torch.nonzero(known[at] == ids_here).reshape(-1)
            out.index_copy_(0, found, known_rows[at[found]])
            missing[found] = False
        read = torch.nonzero(missing).reshape(-1)
        if read.numel():
            out.index_copy_(0, read, self.storage.read(ids[read.cpu()]).to(self.device))
        return out

    @property
    def writable(self) -> bool:
        """Whether :meth:`update` works: the storage is writable and the cache writes back."""
        return self.dirty is not None

    def lines_of(self, ids) -> torch.Tensor:
        """The line holding each of ``ids`` (-1: not cached), without touching the policy's state."""
        ids = as_id_tensor(ids).to(self.device)
        sets = torch.from_numpy(set_of(ids.cpu().numpy(), self.num_sets)).to(self.device)
        match = self.state.tags.view(self.num_sets, self.ways)[sets] == ids[:, None]
        way = match.to(torch.uint8).argmax(1)
        return torch.where(match.any(1), sets * self.ways + way, torch.full_like(sets, -1))

    def update(self, ids, grads: torch.Tensor, apply) -> None:
        """Read-modify-write of the rows of distinct ``ids``: row ``i`` becomes row ``i`` of
        ``apply(rows, grads)`` (``grads[i]`` belongs to ``ids[i]``). Cached rows change in their lines, which
        become dirty; the others (left uncached by the policy) are read from and written to the storage."""
        if self.dirty is None:
            raise TypeError(f"{self.describe()}: its storage is read-only; only an embedding table's rows can be "
                            "updated")
        ids = as_id_tensor(ids)
        with self._lock:
            self._check_intact()
            line = self.lines_of(ids)
            cached = line >= 0
            held = torch.nonzero(cached).reshape(-1)
            apart = torch.nonzero(~cached).reshape(-1)
            lines = line[held]
            data = _words(self.data)  # rows of bytes moved as 8-byte words: several times faster
            if apart.numel() == 0:  # the usual case: every row is in its line
                rows = torch.index_select(data, 0, lines)
            else:
                rows = torch.empty((ids.numel(), data.shape[1]), dtype=data.dtype, device=self.device)
                rows.index_copy_(0, held, torch.index_select(data, 0, lines))
                rows.index_copy_(0, apart, _words(self._stored_rows(ids[apart.cpu()])))
            rows = rows.view(self.data.dtype)
            new = apply(rows, grads.to(self.device)).to(self.data.dtype)
            keep_before = self.storage.before_change
            if keep_before is not None:  # a clean line holds its row's stored bytes: a journal can keep them now
                clean = torch.nonzero(~self.dirty[lines]).reshape(-1)
                if clean.numel():
                    first = held[clean]
                    keep_before(ids[first.cpu()], rows[first].cpu())
            data.index_copy_(0, lines, _words(new.contiguous() if apart.numel() == 0 else new[held]))
            self.dirty[lines] = True
            self._lineless = None  # changed below, or not asked for: the next lookup keeps its own
            if apart.numel():
                changed = ids[apart.cpu()]
                self.storage.write(changed, new[apart].cpu())
                if self.pvp is not None:  # a row evicted by its own batch may be parked: that copy is now stale
                    self.pvp.discard(changed)

    def flush(self) -> None:
        """Writes every dirty line to the storage (a checkpoint calls it, then syncs the storage), in id order,
        :data:`FLUSH_BYTES` at a time: each write copies its rows, and a cache sized to fit a memory cap has
        no room for copies of all its lines at once."""
        if self.dirty is None:
            return
        with self._lock:
            self._check_intact()
            lines = torch.nonzero(self.dirty).reshape(-1)
            lines = lines[torch.argsort(self.state.tags[lines])]
            for part in lines.split(max(1, FLUSH_BYTES // self.storage.row_bytes)):
                self._write_lines(self.state.tags[part], part)

    # -- the Features interface (lsm_gnn.features): a cache wraps a storage -------------------------------------

    caches = True
    owner = None  # one process's cache: every row is its own

    @property
    def cache_lines(self) -> int:
        return self.num_lines

    def gather(self, ids, *, future=None, out: torch.Tensor | None = None, following=None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`lookup`: the rows and which of them were served without reading storage (``following`` is
        ignored: one process's cache has nothing to send ahead)."""
        return self.lookup(ids, future=future, out=out)

    def counters(self) -> dict[str, int]:
        """The storage's byte counters; with PVP also the victim buffer's hits and the bytes they saved."""
        counters = self.storage.counters()
        if self.pvp is not None:
            counters.update(pvp_hits=self.stats.pvp_hits, bytes_saved=self.stats.pvp_hits * self.row_bytes)
        return counters

    def prefetch(self) -> None:
        """With PVP: starts moving the victim queue of the next iteration into the prefetch buffer, on a
        background thread, so the next lookup finds its rows there (the paper's side-stream copy)."""
        if self.pvp is not None:
            self.pvp.prefetch_async(self.iteration)

    def settle(self) -> None:
        """Joins a prefetch in flight and stops reading ahead; the next lookup still finds its rows."""
        if self.pvp is not None:
            self.pvp.close()
        if self.read_ahead is not None:
            self.read_ahead.close()

    def describe(self) -> str:
        from lsm_gnn.units import format_bytes

        pvp = f" with a victim buffer ({self.pvp.capacity:,} lines per queue)" if self.pvp is not None else ""
        rows = self.storage.num_rows  # the rows this cache serves: of a typed graph, its group's types only
        share = f"room for all {rows:,} rows" if self.num_lines >= rows else \
            f"for {rows:,} rows: {self.num_lines / rows:.2%}"
        return (f"a {format_bytes(self.capacity_bytes)} {self.policy.name} cache ({self.num_lines:,} lines, "
                f"{share}){pvp} over {self.storage.backend} storage")

    def _forget_unfilled(self, line: torch.Tensor, hit: torch.Tensor) -> None:
        """Invalidates the lines this lookup assigned to ids it did not hit (after a failed fill)."""
        assigned = line[~hit]
        self.state.forget(assigned[assigned >= 0])

    def snapshot(self) -> dict[str, np.ndarray]:
        """Line metadata in the reference model's terms, for decision-by-decision comparison."""
        state = self.state
        records = state.records.cpu().numpy().view(np.uint64)
        return {"tags": state.tags.cpu().numpy().copy(), "reuse": (records >> np.uint64(REUSE_SHIFT)).astype(np.uint16),
                "fresh": (state.flags.cpu().numpy() & 1).astype(bool),
                "static": state.static_score.cpu().numpy().view(np.uint16).copy(),
                "pvp_index": (records & np.uint64(INDEX_MASK)).astype(np.int64),
                "rr_pointer": state.rr_pointer.cpu().numpy().astype(np.int64)}
