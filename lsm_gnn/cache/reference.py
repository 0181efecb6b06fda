"""The reference model of the software cache: slow, simple, the oracle.

It defines the semantics every implementation (C++, CUDA) must reproduce:

Geometry. ``num_sets * ways`` lines; node ``v`` lives only in set
``set_of(v) = splitmix64(v) % num_sets``; a line holds one feature row.

Iterations. Each ``lookup`` is one iteration ``t`` (0, 1, 2, ...). When a
window-based policy is used and ``t % period == 0``, the cache first *scans*
the window: ``future[k]`` is the batch of iteration ``t + 1 + k``. For every
valid line it records the first ``k`` whose batch holds its node (reuse =
k + 1, with the node's index in that batch, the PVP record) or NONE, and
clears every line's ``fresh`` mark. ``scan_base = t``.

Serving a batch. Distinct ids are served once. Hits: the line is marked used
at ``t`` and, when ``t > scan_base``, marked ``fresh``: the reuse the scan
predicted has been consumed; hit rows are copied out before anything is
installed. Misses are grouped by set and handled in ascending id order: the
victim is the first invalid way if any, else the way the policy picks among
lines not used at ``t``, else (every line of the set was used at ``t``) the
way the policy picks among all of them: lines of the current batch are
evicted last, never skipped. A new line is ``fresh``, has reuse NONE and the
node's static score. All misses are read from storage in one batched read
and served from it; a miss whose line was taken again by a later miss of
the same batch is not cached. A batch with more distinct ids than lines is
an error unless the cache was built with ``oversubscribe=True``.

Next use at assign (``policy.assign_next_use``, on for ``farthest``, and a
window given): a hit line and a new line instead take their node's first
occurrence in this iteration's window (``future[k]``, ``k < window``) as their
record, reuse ``k + 1 + t - scan_base`` (counted from the last scan, as the
scan's are) or NONE, and are not ``fresh``. With ``policy.bypass`` too, a
miss whose victim is a valid line is not cached when its own key (its record,
not fresh, its static score, last use ``t``) is below the victim's (the way
left out): the policy would evict it first, as Belady's MIN would not
install it. It is served from storage and counted in ``stats.bypassed``.

Dynamic level of a valid line at iteration ``t``: ``fresh`` if marked fresh
(or its predicted reuse lies in the past: an inexact window); else ``none``
if the scan found no reuse; else its distance ``d = scan_base + reuse - t``
is ``near`` when ``d <= threshold``, ``far`` otherwise.

Victim order (smallest key evicted), ``w`` the way index:
  rr       ways from the set's pointer onward; the pointer moves past each valid victim
  lru      (last use, w)
  static   (static score, w)
  dynamic  (class, -d, w) with class none=0, fresh=1, near/far=2
  hybrid*  (rank of the level in the policy's level order, static score, w)
  hybrid_far  (rank of the level, 65535 - d if the level is far else 0, static score, w)
  farthest (rank of the level, 65535 - d if the level is far or near else 0, static score, w)
  hybrid_pvp_room  as hybrid_pvp, but a far line whose victim queue (that of
           iteration t + d) is full at the start of the batch, or with no
           victim buffer, ranks just after the level none

The victim buffer (PVP, ``pvp_queue_capacity`` set): see
:mod:`lsm_gnn.cache.pvp` for the queues, the eviction and the prefetch. In
this model, before the cache serves iteration ``t`` the queue of ``t`` is
taken and matched to the batch; with PVP on, the window is scanned every
``period`` iterations for every policy; victims of the batch are offered to
their queues in ascending order of the id that evicted them, before any row
is installed; a line installed earlier in the same batch holds no row yet and
goes to no queue (counted as no reuse).

``lookup`` runs the named stages of :mod:`lsm_gnn.cache.plan` over a plan of
its own, as the software cache does, so tests can compare the two stage by
stage. It has no write-back: it models read-only storage.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

# The model uses the production geometry and counters; splitmix64 and quantize_scores stay importable from here.
from lsm_gnn.cache.geometry import set_of  # noqa: F401
from lsm_gnn.cache.policies import LEVEL_FAR, LEVEL_FRESH, LEVEL_NEAR, LEVEL_NONE, PolicyConfig
from lsm_gnn.cache.policies import quantize_scores  # noqa: F401
from lsm_gnn.kernels.layout import INDEX_MASK, INVALID_TAG, NO_REUSE, pack_record
from lsm_gnn.utils.hashing import splitmix64  # noqa: F401
from lsm_gnn.cache.pvp import PVPStats
from lsm_gnn.cache.stats import CacheStats
from lsm_gnn.utils.ids import as_id_tensor


@dataclass
class _Lines:
    tags: np.ndarray
    static: np.ndarray
    reuse: np.ndarray
    fresh: np.ndarray
    last_use: np.ndarray
    pvp_index: np.ndarray
    pvp_rank: np.ndarray
    rr_pointer: np.ndarray = field(default=None)


@dataclass(eq=False)
class _Batch:
    """One batch on its way through :meth:`ReferenceCache.lookup`'s stages; the stage named first fills each field."""

    # begin
    t: int
    ids: np.ndarray
    unique: np.ndarray         # sorted distinct ids
    inverse: np.ndarray        # ids == unique[inverse]
    future: object
    rank: int
    taken: list = field(default_factory=list)   # the queue of t: [(node, record, row)]
    # before_assign
    served: dict = field(default_factory=dict)  # unique index -> (row, stored index) a line of the queue serves
    cache_u: list = field(default_factory=list)  # the unique indices the cache sees
    # assign
    known: dict | None = None  # next use at assign, per node of the window
    sets: np.ndarray = None
    where: np.ndarray = None   # the line caching each distinct id at the end (-1: not cached)
    hit: np.ndarray = None
    victims: dict = field(default_factory=dict)  # unique index -> (evicted node, reuse, line, index, rank)
    evictions: int = 0
    evicted_in_use: int = 0
    bypassed: int = 0
    # after_assign
    unique_rows: torch.Tensor = None
    from_pvp: np.ndarray = None  # distinct ids served from the queue
    # fill
    miss: np.ndarray = None      # distinct ids read from storage
    rows: torch.Tensor = None    # in request order

    def next_use(self, node) -> tuple[int, int, int]:
        """(reuse, index, rank) a line of ``node`` records at assign: its next use in the window, if known."""
        return (NO_REUSE, 0, 0) if self.known is None else self.known.get(int(node), (NO_REUSE, 0, 0))


class ReferenceCache:
    """The semantics in plain Python loops. Use on small inputs only."""

    def __init__(self, storage, num_sets: int, ways: int = 32, policy: PolicyConfig | str = "hybrid",
                 static_scores: np.ndarray | None = None, oversubscribe: bool = False,
                 pvp_queue_capacity: int | None = None, pvp_reinstall: bool = False):
        if num_sets < 1 or ways < 1:
            raise ValueError(f"a cache needs at least one set and one way, got {num_sets} sets x {ways} ways")
        self.storage = storage
        self.num_sets, self.ways = int(num_sets), int(ways)
        self.policy = PolicyConfig(policy) if isinstance(policy, str) else policy
        n = self.num_sets * self.ways
        self.lines = _Lines(
            tags=np.full(n, INVALID_TAG, np.int64), static=np.zeros(n, np.uint16), reuse=np.full(n, NO_REUSE, np.uint16),
            fresh=np.zeros(n, bool), last_use=np.full(n, -1, np.int64), pvp_index=np.zeros(n, np.int64),
            pvp_rank=np.zeros(n, np.uint8), rr_pointer=np.zeros(self.num_sets, np.int64),
        )
        self.data = torch.zeros((n, storage.dim), dtype=storage.dtype)
        self.static_scores = None if static_scores is None else np.asarray(static_scores, dtype=np.uint16)
        self.oversubscribe = oversubscribe
        self.iteration = 0
        self.scan_base = 0
        self.stats = CacheStats()
        # PVP: target iteration -> queued lines [(node, record, row)], in slot order.
        self.pvp_capacity = pvp_queue_capacity
        self.pvp_reinstall = pvp_reinstall
        self.queues: dict[int, list[tuple[int, int, torch.Tensor]]] = {}
        self.pvp_stats = PVPStats()
        self._room: dict[int, bool] = {}

    @property
    def num_lines(self) -> int:
        return self.num_sets * self.ways

    @property
    def pvp(self) -> bool:
        return self.pvp_capacity is not None

    # -- the window scan -----------------------------------------------------
    def scan(self, future, rank: int = 0) -> None:
        """Records each valid line's next reuse within ``future`` (future[0] = next iteration)."""
        first: dict[int, tuple[int, int]] = {}
        for k in range(min(len(future), self.policy.window) - 1, -1, -1):
            batch = as_id_tensor(future[k]).numpy()
            for pos in range(batch.size - 1, -1, -1):  # first occurrence in the batch wins
                first[int(batch[pos])] = (k + 1, pos)
        L = self.lines
        for i in range(self.num_lines):
            if L.tags[i] == INVALID_TAG:
                continue
            hit = first.get(int(L.tags[i]))
            L.fresh[i] = False
            if hit is None:
                L.reuse[i], L.pvp_index[i], L.pvp_rank[i] = NO_REUSE, 0, 0
            else:
                L.reuse[i], L.pvp_index[i], L.pvp_rank[i] = hit[0], hit[1], rank
        self.scan_base = self.iteration
        self.stats.scans += 1

    # -- victim choice ---------------------------------------------------------
    def level(self, i: int) -> str:
        L = self.lines
        return self._level(int(L.reuse[i]), bool(L.fresh[i]))

    def _level(self, reuse: int, fresh: bool) -> str:
        if fresh:
            return LEVEL_FRESH
        if reuse == NO_REUSE:
            return LEVEL_NONE
        d = self.scan_base + reuse - self.iteration
        if d <= 0:
            return LEVEL_FRESH
        return LEVEL_NEAR if d <= self.policy.near_threshold else LEVEL_FAR

    def _key(self, i: int, way: int):
        L = self.lines
        return (*self._key_of(int(L.reuse[i]), bool(L.fresh[i]), int(L.static[i]), int(L.last_use[i])), way)

    def _key_of(self, reuse: int, fresh: bool, static: int, last_use: int) -> tuple:
        """The victim key of a line with these fields, without the way that breaks its ties."""
        name = self.policy.name
        if name == "lru":
            return (last_use,)
        if name == "static":
            return (static,)
        level = self._level(reuse, fresh)
        if name == "dynamic":
            if level == LEVEL_NONE:
                return (0, 0)
            if level == LEVEL_FRESH:
                return (1, 0)
            return (2, -(self.scan_base + reuse - self.iteration))
        order = self.policy.level_order
        position = 2 * order.index(level)
        far_term = 0
        if (level == LEVEL_FAR and name in ("hybrid_far", "farthest")) or (level == LEVEL_NEAR and name == "farthest"):
            far_term = 65535 - (self.scan_base + reuse - self.iteration)
        if name == "hybrid_pvp_room" and level == LEVEL_FAR and not self._room.get(self.scan_base + reuse):
            position = 2 * order.index(LEVEL_NONE) + 1
        return (position, far_term, static)

    def choose_victim(self, set_index: int) -> int:
        """The way to fill in ``set_index`` at this iteration."""
        base, L, t = set_index * self.ways, self.lines, self.iteration
        for way in range(self.ways):
            if L.tags[base + way] == INVALID_TAG:
                return way
        free = [w for w in range(self.ways) if L.last_use[base + w] != t] or list(range(self.ways))
        if self.policy.name == "rr":
            start = int(L.rr_pointer[set_index])
            way = min(free, key=lambda w: (w - start) % self.ways)
            L.rr_pointer[set_index] = (way + 1) % self.ways
            return way
        return min(free, key=lambda w: self._key(base + w, w))

    # -- the batch API ----------------------------------------------------------
    def lookup(self, ids, future=None, rank: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Serves one iteration: returns (rows in request order, hit mask), by the stages of
        :mod:`lsm_gnn.cache.plan`, as the software cache does."""
        batch = self._begin(ids, future, rank)
        self._before_assign(batch)
        self._assign(batch)
        self._evict(batch)
        self._after_assign(batch)
        self._fill(batch)
        return self._account(batch)

    # -- the stages of a lookup (lsm_gnn.cache.plan), in order ------------------
    def _begin(self, ids, future=None, rank: int = 0) -> _Batch:
        """The batch: its distinct ids, checked against the storage, and the queue of its iteration."""
        ids = as_id_tensor(ids).numpy()
        unique, inverse = np.unique(ids, return_inverse=True)
        if unique.size and (unique[0] < 0 or unique[-1] >= self.storage.num_rows):
            bad = unique[0] if unique[0] < 0 else unique[-1]
            raise IndexError(f"node id {bad} is out of range [0, {self.storage.num_rows})")
        batch = _Batch(self.iteration, ids, unique, inverse.reshape(-1), future, rank)
        if self.pvp:
            for target in [T for T in self.queues if T < batch.t]:  # never served from a queue whose iteration passed
                self.pvp_stats.unused += len(self.queues.pop(target))
            batch.taken = self.queues.get(batch.t, [])  # removed once the batch is served (a failed lookup may retry)
        return batch

    def _before_assign(self, b: _Batch) -> None:
        """Matches the queue of ``t`` to the batch; in the paper's mode the ids it serves skip the cache."""
        for node, record, row in b.taken:
            p = record & INDEX_MASK
            if p < b.ids.size and b.ids[p] == node and int(b.inverse[p]) not in b.served:
                b.served[int(b.inverse[p])] = (row, p)
        bypass = self.pvp and not self.pvp_reinstall
        b.cache_u = [u for u in range(b.unique.size) if not (bypass and u in b.served)]

    def _assign(self, b: _Batch) -> None:
        """The window scan when due, then the hits, victims and installs of the ids the cache sees."""
        if len(b.cache_u) > self.num_lines and not self.oversubscribe:
            raise ValueError(f"this batch has {len(b.cache_u)} distinct ids but the cache holds {self.num_lines} "
                             f"lines; raise the cache capacity to at least {len(b.cache_u)} rows (or pass "
                             "oversubscribe=True)")
        if (self.policy.uses_window or self.pvp) and b.future is not None and b.t % self.policy.period == 0:
            self.scan(b.future, b.rank)
        self._room = {T: len(self.queues.get(T, ())) < self.pvp_capacity
                      for T in range(b.t + 1, b.t + self.policy.window + 1)} if self.pvp else {}
        # Next use at assign: (reuse counted from the last scan, index, rank) of each node in the window.
        if self.policy.assign_next_use and b.future is not None:
            b.known = self._next_uses(b.future, b.rank)
        b.sets = set_of(b.unique, self.num_sets)
        b.where = np.full(b.unique.size, -1, np.int64)
        b.hit = np.zeros(b.unique.size, bool)
        self._mark_hits(b)
        self._install_misses(b)

    def _mark_hits(self, b: _Batch) -> None:
        """Finds the ids the cache holds and marks their lines used (and their next use, or fresh)."""
        L, t = self.lines, b.t
        for u in b.cache_u:
            base = b.sets[u] * self.ways
            for way in range(self.ways):
                if L.tags[base + way] == b.unique[u]:
                    i = base + way
                    b.hit[u], b.where[u] = True, i
                    L.last_use[i] = t
                    if b.known is not None:
                        L.reuse[i], L.pvp_index[i], L.pvp_rank[i] = b.next_use(b.unique[u])
                        L.fresh[i] = False
                    elif t > self.scan_base:
                        L.fresh[i] = True
                    break

    def _install_misses(self, b: _Batch) -> None:
        """Misses by set, in ascending id order: each takes its victim's line (or is bypassed)."""
        L, t = self.lines, b.t
        installed_by: dict[int, int] = {}  # line -> unique index installed there this batch
        for u in sorted((u for u in b.cache_u if not b.hit[u]), key=lambda u: (b.sets[u], b.unique[u])):
            i = int(b.sets[u] * self.ways + self.choose_victim(int(b.sets[u])))
            reuse, index, rank = b.next_use(b.unique[u])
            static = 0 if self.static_scores is None else int(self.static_scores[b.unique[u]])
            if (self.policy.bypass and b.known is not None and L.tags[i] != INVALID_TAG
                    and self._key_of(reuse, False, static, t) < self._key(i, 0)[:-1]):
                b.bypassed += 1  # Belady's bypass: the policy would evict this miss before its victim
                continue
            if L.tags[i] != INVALID_TAG:
                b.evictions += 1
                b.evicted_in_use += int(L.last_use[i] == t)
                # A line this batch installed holds no row yet: no victim queue may take it.
                victim_reuse = NO_REUSE if i in installed_by else int(L.reuse[i])
                b.victims[u] = (int(L.tags[i]), victim_reuse, i, int(L.pvp_index[i]), int(L.pvp_rank[i]))
            if i in installed_by:
                b.where[installed_by[i]] = -1
            installed_by[i] = u
            L.tags[i], L.static[i] = b.unique[u], static
            L.reuse[i], L.fresh[i], L.last_use[i] = reuse, b.known is None, t
            L.pvp_index[i], L.pvp_rank[i] = index, rank
            b.where[u] = i

    def _evict(self, b: _Batch) -> None:
        """The victims go to their queues before any row is installed (this model has no write-back)."""
        if self.pvp:
            self._enqueue(b.victims)

    def _after_assign(self, b: _Batch) -> None:
        """Hit rows out before any line is written; then the rows the queue serves (a cache hit wins over a
        queued copy), into their new lines when reinstalling."""
        b.unique_rows = torch.empty((b.unique.size, self.storage.dim), dtype=self.storage.dtype)
        hits = np.flatnonzero(b.hit)
        if hits.size:
            b.unique_rows[torch.from_numpy(hits)] = self.data[torch.from_numpy(b.where[hits])]
        b.from_pvp = np.zeros(b.unique.size, bool)
        for u, (row, _) in b.served.items():
            if not b.hit[u]:
                b.from_pvp[u] = True
                b.unique_rows[u] = row
                if b.where[u] >= 0:  # reinstalled: its line gets the queued row, not a storage read
                    self.data[int(b.where[u])] = row

    def _fill(self, b: _Batch) -> None:
        """The misses in one storage read, into their lines where they have one; the rows in request order."""
        b.miss = np.flatnonzero(~b.hit & ~b.from_pvp)
        if b.miss.size:
            fetched = self.storage.read(torch.from_numpy(b.unique[b.miss]))
            self.stats.bytes_read += b.miss.size * self.storage.row_bytes
            b.unique_rows[torch.from_numpy(b.miss)] = fetched
            cached = b.where[b.miss] >= 0
            self.data[torch.from_numpy(b.where[b.miss][cached])] = fetched[torch.from_numpy(cached)]
        b.rows = b.unique_rows[torch.from_numpy(b.inverse)]

    def _account(self, b: _Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Counts the batch, settles the queue of ``t`` and ends the iteration; returns (rows, hit mask)."""
        served = int(b.from_pvp.sum())
        if self.pvp:
            self.queues.pop(b.t, None)
            self.pvp_stats.prefetched += len(b.taken)
            self.pvp_stats.hits += served
            self.pvp_stats.unused += len(b.taken) - served
            self.pvp_stats.bytes_saved += served * self.storage.row_bytes
        s = self.stats
        s.iterations += 1
        s.requests += b.ids.size
        s.unique += b.unique.size
        s.hits += int(b.hit.sum())
        s.pvp_hits += served
        s.misses += int(b.miss.size)
        s.evictions += b.evictions
        s.evicted_in_use += b.evicted_in_use
        s.bypassed += b.bypassed
        self.iteration += 1
        return b.rows, torch.from_numpy(b.hit | b.from_pvp)[torch.from_numpy(b.inverse)]

    def _next_uses(self, future, rank: int = 0) -> dict[int, tuple[int, int, int]]:
        """Each node's first occurrence in ``future`` (future[0] = next iteration) within the window, as
        (reuse counted from the last scan, index in that batch, rank): what a hit or installed line records."""
        since_scan = self.iteration - self.scan_base
        first: dict[int, tuple[int, int, int]] = {}
        for k in range(min(len(future), self.policy.window) - 1, -1, -1):
            batch = as_id_tensor(future[k]).numpy()
            for pos in range(batch.size - 1, -1, -1):  # first occurrence in the batch wins
                first[int(batch[pos])] = (k + 1 + since_scan, pos, rank)
        return first

    def _enqueue(self, victims: dict[int, tuple]) -> None:
        """Offers the batch's victims to their queues, in ascending order of the id that evicted them."""
        t, window = self.iteration, self.policy.window
        for u in sorted(victims):
            node, reuse, line, index, rank = victims[u]
            target = self.scan_base + reuse
            if reuse == NO_REUSE or not t < target <= t + window:
                self.pvp_stats.dropped_no_reuse += 1
            elif len(self.queues.setdefault(target, [])) >= self.pvp_capacity:
                self.pvp_stats.dropped_full += 1
            else:
                record = pack_record(reuse, rank, index)
                self.queues[target].append((node, record, self.data[line].clone()))
                self.pvp_stats.enqueued += 1

    def pvp_snapshot(self) -> dict[int, list[tuple[int, int]]]:
        """Queued lines per target iteration, as sorted (node, record) pairs."""
        return {T: sorted((node, record) for node, record, _ in lines) for T, lines in self.queues.items() if lines}

    def snapshot(self) -> dict[str, np.ndarray]:
        """Line metadata, for comparing implementations decision by decision."""
        L = self.lines
        return {"tags": L.tags.copy(), "reuse": L.reuse.copy(), "fresh": L.fresh.copy(),
                "static": L.static.copy(), "pvp_index": L.pvp_index.copy(), "rr_pointer": L.rr_pointer.copy()}
