"""The software cache: 32-way set-associative, policy-driven, in front of a storage.

Semantics are those of :mod:`lsm_gnn.cache.reference` (the oracle); the metadata work runs in the native core
(OpenMP across sets), rows move with torch index ops. A lookup is the named stages of :mod:`lsm_gnn.cache.plan`
over a per-batch plan, calling the cache's parts (:mod:`lsm_gnn.cache.cache_parts`), each chosen once when the
cache is built: this module is the stages and nothing else.
"""
from __future__ import annotations

import torch

from lsm_gnn.cache.cache_parts import CacheParts
from lsm_gnn.cache.geometry import CacheTooSmall
from lsm_gnn.cache.plan import LookupPlan
from lsm_gnn.cache.staging import side_stream
from lsm_gnn.cache.state import Assignment
from lsm_gnn.cache.window import first_occurrences
from lsm_gnn.kernels import ops as _ops  # noqa: F401  (registers torch.ops.lsm_gnn)
from lsm_gnn.utils.ids import as_id_tensor, unique_ids


def _as_bytes(rows: torch.Tensor) -> torch.Tensor:
    """A contiguous ``[n, dim]`` tensor as ``[n, row bytes]`` uint8, the same memory."""
    return rows.view(torch.uint8).view(rows.shape[0], rows.shape[1] * rows.element_size())


class SoftwareCache(CacheParts):
    """A set-associative cache of feature rows in front of ``storage``.

    ``lookup(ids, future)`` serves one iteration: it returns the rows of ``ids`` in request order (always
    exactly the bytes in storage) and a mask of which ids were hits. ``future`` is the window of upcoming
    batches (a :class:`WindowBuffer`, ideally built with ``num_nodes`` for its native index, or a list of id
    tensors); it feeds the dynamic policies. Concurrent lookups are serialized batch by batch; each batch runs
    in parallel. A batch with more distinct ids than the cache has lines raises :class:`CacheTooSmall` (a
    ValueError naming ``sized_by``, the config key of the cache's size, if any), since such a cache thrashes; ``oversubscribe=True`` allows it (lines of the current batch are
    then evicted last), for studies that scale caches below one batch.

    ``pvp=True`` adds the Preemptive Victim-buffer Prefetcher (:mod:`lsm_gnn.cache.pvp`): evicted lines with a
    known next use wait in one queue per future iteration (``pvp_queue_capacity`` lines each) and serve that
    iteration's batch without a storage read (``pvp_reinstall=True``: they are installed in the cache as misses
    read from the queue; ``False``: they bypass the cache, as in the paper). ``pvp_queue_bytes`` bounds all
    queues' memory instead (``"256M"``, or a share of the cache's bytes: the default is ``"25%"``, see
    :data:`lsm_gnn.defaults.PVP_QUEUE_BYTES`). ``self.pvp`` is then the :class:`~lsm_gnn.cache.pvp.VictimBuffer`
    (counters in ``self.pvp.stats``); ``hit_mask`` and ``stats.combined_hit_ratio`` count its hits, while
    ``stats.hit_ratio`` counts the cache's own.

    Over a writable storage (an embedding table) the cache is write-back (:mod:`lsm_gnn.cache.write_back`):
    :meth:`update` changes rows in their lines, which become dirty; a dirty line is written to the storage when
    it is evicted and by :meth:`flush`. ``stats`` counts the rows written back, ``last_timings["write-back"]``
    their seconds.

    ``read_ahead``: after each lookup the cache asks for the rows its next ``read_ahead`` batches (of the
    ``future`` window) will miss, read on a thread of their own (:mod:`lsm_gnn.cache.read_ahead`), holding at
    most ``read_ahead_bytes`` of rows. ``None``: 2 where misses come from a disk nobody writes, with 256 MiB of
    memory available (:func:`~lsm_gnn.cache.read_ahead.default_depth`), else 0 (off). What is read ahead
    changes where a miss's bytes come from, never a result.

    ``hits_first``: serve a batch's hits in one kernel before any other work (:mod:`lsm_gnn.cache.hits_first`),
    so a batch that hits in full costs one launch and one read back; only a batch with misses computes its
    distinct ids and assigns them, with one read back. ``None``: on for a cache on a GPU, unless its PVP runs in the
    paper's mode (``pvp_reinstall=False``) or over a writable storage. (``True`` on a CPU cache runs
    the kernel under Triton's interpreter, for tests; the C++ core assigns a whole batch faster there.)
    ``graphs``: opt-in, a GPU cache with hits first: a lookup given ``out`` serves its hits by replaying a CUDA
    graph kept per batch size and ``out`` buffer (:class:`~lsm_gnn.cache.hits_first.ServeGraphs`), which skips
    Triton's launcher; worth it where batches hit in full and the caller reuses a few ``out`` buffers.

    Defaults: ``policy=None`` is ``"farthest"``, with or without PVP; ``pvp_reinstall=None`` is on with PVP, so
    PVP leaves the cache's decisions as they are without it and only turns misses into PVP hits. Both were the
    best measured settings (``docs/benchmarks/pvp.md``); ``policy="hybrid"`` is the paper's policy, and
    ``policy="hybrid_pvp", pvp_reinstall=False`` its PVP design as published.
    """

    def scan(self, future) -> None:
        """Sets every cached line's next reuse from ``future`` (future[0] = next iteration)."""
        self._scan(self._first_occurrence(future))

    def _first_occurrence(self, future) -> tuple:
        return first_occurrences(future, self.policy.window, self.storage.num_rows, self.device)

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
            self._ahead.follow(self.iteration, plan.future)
            return result

    def _check_out(self, num_ids: int, out: torch.Tensor | None) -> None:
        """``out``, if given, must be able to receive the rows of ``num_ids`` ids as they are."""
        shape = (num_ids, self.storage.dim)
        if out is not None and (tuple(out.shape) != shape or out.dtype != self.data.dtype
                                or out.device != self.device or not out.is_contiguous()):
            raise ValueError(f"out must be a contiguous {self.data.dtype} tensor of shape {shape} on {self.device}, "
                             f"got {out.dtype} {tuple(out.shape)} on {out.device}")

    def _forget_unfilled(self, line: torch.Tensor, hit: torch.Tensor) -> None:
        """Invalidates the lines this lookup assigned to ids it did not hit (after a failed fill)."""
        assigned = line[~hit]
        self.state.forget(assigned[assigned >= 0])

    # -- the stages of a lookup (lsm_gnn.cache.plan), in order --------------------------------------------------

    def _begin(self, ids: torch.Tensor, future=None, out: torch.Tensor | None = None) -> LookupPlan:
        """The batch's plan: its distinct ids, checked against the storage, and its prefetched lines.

        Serving hits first (:mod:`lsm_gnn.cache.hits_first`), the window scan when due comes first; then, where the
        last batch hit in full, the hits are served, and a batch that hits in full too ends here. Else the
        distinct ids are found without reading their number back (padded, with the batch's range, which
        :meth:`_read_assigned` checks): one read back in all for a batch with misses."""
        self._writes.check_intact()
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
                plan = LookupPlan(t, ids, None, None, future, out, cache_ids=None, served=True, rows=rows,
                                  request_hit=probe.hit, num_unique=probe.distinct_hits)
                self._victims.take(plan)  # (no line serves a batch that hit in full)
                return plan
            if probe is not None:
                distinct_at_most = probe.distinct_hits + probe.misses
            # Padded to the batch's size; their number, smallest and largest left on the device.
            unique, inverse, num_distinct = torch.ops.lsm_gnn.distinct_ids(ids, self.storage.num_rows)
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
        if plan.num_distinct is None:
            plan.done = assigned.read()
        else:  # the victim buffer's device work first: what it serves is not read from storage
            stored, served = self._victims.claim(plan, assigned, self.data, self.scan_base)
            plan.done = self._read_assigned(plan, assigned, stored, served)
        plan.line, plan.hit = plan.done.line, plan.done.hit

    def _read_assigned(self, plan: LookupPlan, assigned, stored: torch.Tensor, served: torch.Tensor | None
                       ) -> Assignment:
        """Serving hits first: the assign's counts, the number of distinct ids, the batch's smallest and largest
        id, and the ids the storage must read (not ``stored``: hit, or with PVP served by a parked line, whose
        number ``served`` holds) with their lines, in one read back (of the batch's size); the plan's distinct ids
        cut to their number. (A batch with an id out of range was assigned as padding: nothing changed.)"""
        facts = plan.num_distinct if served is None else torch.cat([plan.num_distinct, served])
        packed, position = torch.ops.lsm_gnn.pack_misses(stored, plan.cache_ids, assigned.line, assigned.counts,
                                                         facts)
        host = packed.cpu()
        head, n = 4 + facts.numel(), position.numel()
        counts, (num_unique, low, high, *by_pvp) = host[:4].tolist(), host[4:head].tolist()
        self._check_range(low, high)
        plan.pvp_hits = by_pvp[0] if by_pvp else 0
        misses = counts[3] - plan.pvp_hits  # the assign's misses, less those a parked line serves
        self._hits_first.probing = counts[3] == 0  # a batch that hit in full: the next one may too
        plan.miss = position[:misses]  # (in ascending id order)
        plan.miss_ids, plan.miss_cached = host[head:head + misses], host[head + n:head + n + misses] >= 0
        plan.miss_lines = packed[head + n:head + n + misses]  # (a view: no launch)
        plan.unique = plan.cache_ids = plan.unique[:num_unique]
        if plan.from_pvp is not None:
            plan.from_pvp, plan.entry = plan.from_pvp[:num_unique], plan.entry[:num_unique]
        return Assignment(*(t[:num_unique] for t in assigned[:5]), *counts[:3])

    def _evict(self, plan: LookupPlan) -> None:
        """The victims leave before any row overwrites their lines: dirty ones to the storage (so a parked copy
        is always clean), then to their victim queues."""
        self._writes.evict(plan.done, plan.cache_ids)
        self._victims.park(plan, self.data, self.scan_base)

    def _after_assign(self, plan: LookupPlan) -> None:
        """Back to every distinct id; hit rows out first where the batch evicted lines it uses; then PVP's rows
        into the new lines (reinstalling)."""
        if plan.keep is not None:  # the ids the victim buffer serves bypassed the cache: they have no line
            line = torch.full((plan.unique.numel(),), -1, dtype=torch.int64, device=self.device)
            hit = torch.zeros(plan.unique.numel(), dtype=torch.bool, device=self.device)
            line[plan.keep], hit[plan.keep] = plan.line, plan.hit
            plan.line, plan.hit = line, hit
        if plan.rows is None:  # (serving hits first made them)
            plan.rows = plan.out if plan.out is not None else self._rows_for(plan.ids.numel())
        # No line this batch uses was evicted (the usual case): after the fill every id's line holds its row, and
        # one gather serves hits and misses alike. Otherwise hit rows go first, before a later miss overwrites
        # their line, and each miss row is copied to its positions.
        plan.one_gather = plan.done.evicted_in_use == 0
        if not plan.one_gather:
            self._gather_lines(plan)
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
            self._gather_lines(plan)
        if apart is not None:
            self._rows_apart(plan, *apart)
        self._victims.serve(plan, self.data)

    def _gather_lines(self, plan: LookupPlan) -> None:
        """Every position's row from its id's line (one launch on a GPU), and its hit flag."""
        plan.request_hit = torch.ops.lsm_gnn.rows_by_line(self.data, plan.line, plan.hit, plan.inverse, plan.rows)

    def _read_misses(self, plan: LookupPlan) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Reads the misses into their lines; returns the distinct ids whose rows go to their positions from
        elsewhere than a line (misses the policy left uncached, or all when hit rows went first) and those rows.
        Rows read ahead (:meth:`ReadAhead.take`) are taken from there; the storage reads the rest."""
        miss, miss_ids, miss_cached = plan.miss, plan.miss_ids, plan.miss_cached
        early = self._ahead.take(plan.t, miss_ids)
        self.stats.bytes_read += miss.numel() * self.storage.row_bytes
        if early is None:
            return self._misses.read(plan, miss, miss_ids, miss_cached, self.data, plan.miss_lines)
        where, rows = torch.as_tensor(early[0]).cpu(), early[1].to(self.device)
        left = torch.ones(miss.numel(), dtype=torch.bool)  # on the host, where the ids are
        left[where] = False
        left = torch.nonzero(left).reshape(-1)
        apart = None if not left.numel() else self._misses.read(
            plan, miss[left.to(self.device)], miss_ids[left], None if miss_cached is None else miss_cached[left],
            self.data)
        got = miss[where.to(self.device)]
        lines = plan.line[got]
        cached = lines >= 0
        self.data.index_copy_(0, lines[cached], rows[cached])
        if plan.one_gather:  # only the rows without a line go to their positions apart
            got, rows = got[~cached], rows[~cached]
        if got.numel():
            apart = (got, rows) if apart is None else (torch.cat([apart[0], got]), torch.cat([apart[1], rows]))
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
            self._writes.remember(None)
            self._victims.serve(plan, self.data)  # (none of its prefetched lines served it)
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
        self._writes.remember(plan)
        return self._to_caller(plan.rows, request_hit, caller)

    @staticmethod
    def _to_caller(rows: torch.Tensor, hit: torch.Tensor, caller) -> tuple[torch.Tensor, torch.Tensor]:
        if caller is not None:  # made on the side stream, used on the caller's: not freed before
            rows.record_stream(caller)
            hit.record_stream(caller)
        return rows, hit

    # -- the Features interface's read (lsm_gnn.features) --------------------------------------------------------

    def gather(self, ids, *, future=None, out: torch.Tensor | None = None, following=None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`lookup`: the rows and which of them were served without reading storage (``following`` is
        ignored: one process's cache has nothing to send ahead)."""
        return self.lookup(ids, future=future, out=out)
