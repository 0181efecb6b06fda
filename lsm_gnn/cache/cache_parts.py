"""A software cache's parts, each built once from the cache's arguments (:class:`~lsm_gnn.cache.SoftwareCache`),
and every call a cache takes but a lookup.

Each part is an object behind the small interface the lookup's stages call, chosen when the cache is built so a
stage never asks which kind it has: the line metadata (:class:`~lsm_gnn.cache.state.CacheState`), the victim
buffer's part per PVP mode (:mod:`lsm_gnn.cache.pvp_modes`), write-back (:mod:`lsm_gnn.cache.write_back`),
read-ahead (:mod:`lsm_gnn.cache.read_ahead`), the path of misses to the cache's device
(:mod:`lsm_gnn.cache.staging`) and serving hits first (:mod:`lsm_gnn.cache.hits_first`).
"""
from __future__ import annotations

import threading

import torch

from lsm_gnn.cache.geometry import cache_geometry
from lsm_gnn.cache.hits_first import HitsFirst, ServeGraphs
from lsm_gnn.cache.policies import PolicyConfig, static_ranks
from lsm_gnn.cache.pvp_modes import victim_part
from lsm_gnn.cache.read_ahead import read_ahead_for
from lsm_gnn.cache.staging import cache_device, miss_reads
from lsm_gnn.cache.state import CacheState
from lsm_gnn.cache.stats import CacheStats
from lsm_gnn.cache.write_back import write_back_for
from lsm_gnn.defaults import PERIOD, READ_AHEAD_BYTES, WAYS, WINDOW, policy_for
from lsm_gnn.features import StorageShape
from lsm_gnn.kernels import kernel_mode
from lsm_gnn.utils.hostmem import host_zeros
from lsm_gnn.utils.ids import as_id_tensor


class CacheParts(StorageShape):
    """The parts of a cache over ``storage`` and its calls other than :meth:`~lsm_gnn.cache.SoftwareCache.lookup`
    (the arguments: :class:`~lsm_gnn.cache.SoftwareCache`)."""

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
        self.device = cache_device(device)
        self.state = CacheState.empty(self.num_sets, self.ways, self.device)
        self.data = host_zeros((self.num_lines, storage.dim), storage.dtype) if self.device.type == "cpu" else \
            torch.zeros((self.num_lines, storage.dim), dtype=storage.dtype, device=self.device)
        self.node_static = static_ranks(static_scores, storage.num_rows, self.device)
        self.num_threads = num_threads
        self.oversubscribe = oversubscribe
        self.iteration = 0
        self.scan_base = 0
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self._writes = write_back_for(storage, self.data, self.stats)  # dirty lines: over a writable storage
        self._misses = miss_reads(storage, self.device)  # how misses reach the lines (staging.miss_path)
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.pvp_reinstall = bool(pvp_reinstall)
        # PVP's part of every lookup, by mode (lsm_gnn.cache.pvp_modes); self.pvp its victim buffer, or None.
        self._victims = victim_part(pvp, self.pvp_reinstall, pvp_queue_capacity, pvp_queue_bytes,
                                    window=self.policy.window, storage=storage, cache_bytes=self.capacity_bytes,
                                    device=self.device, num_threads=num_threads)
        self.pvp = self._victims.buffer
        self._ahead = read_ahead_for(storage, read_ahead, read_ahead_bytes, self.device, self.state,
                                     self._victims.parked)
        self._hits_first = self._serving_hits_first(hits_first, graphs)

    def _serving_hits_first(self, wanted: bool | None, graphs: bool) -> HitsFirst | None:
        """The constructor's ``hits_first`` (see the class) as the buffers it reuses, or None."""
        # The victim buffer takes part where it reinstalls (its ids pass through the cache as misses) over a
        # read-only storage (a dirty victim is written back before it is parked: the host's work).
        with_victims = self.pvp is None or (self._victims.reinstalls and self._writes.dirty is None)
        if wanted is None:
            wanted = self.device.type == "cuda" and with_victims
        if wanted and not with_victims:
            raise ValueError("hits_first=True with pvp=True needs pvp_reinstall=True over a read-only storage: in "
                             "the paper's mode the ids the victim buffer serves skip the cache, so a hit served "
                             "first could change its decisions, and a write-back cache parks victims after writing "
                             "them back on the host")
        if wanted and self.device.type == "cpu" and kernel_mode() != "triton":
            raise ValueError("hits_first=True on a CPU cache runs the device kernel under Triton's interpreter: "
                             "construct the cache under lsm_gnn.kernels.using('triton') (tests), or leave "
                             "hits_first=None (a CPU cache assigns whole batches in the C++ core)")
        if graphs and not wanted:
            raise ValueError("graphs=True captures the serving of hits first: it needs hits_first (a GPU cache "
                             "without PVP, or with PVP reinstalling over a read-only storage)")
        return HitsFirst(self.num_lines, self.device, ServeGraphs(self.device) if graphs else None) \
            if wanted else None

    def _geometry(self, capacity, num_sets: int | None, ways: int) -> tuple[int, int]:
        """(num_sets, ways) from the constructor's capacity or num_sets."""
        if num_sets is None:
            if capacity is None:
                raise ValueError("give the cache a capacity in bytes (e.g. '4G') or num_sets")
            num_sets, ways = cache_geometry(capacity, self.storage.row_bytes, ways, self.storage.num_rows)
        elif num_sets < 1 or ways < 1:
            raise ValueError(f"a cache needs at least one set and one way, got {num_sets} x {ways}")
        return int(num_sets), int(ways)

    @property
    def num_lines(self) -> int:
        return self.num_sets * self.ways

    @property
    def capacity_bytes(self) -> int:
        return self.num_lines * self.storage.row_bytes

    @property
    def miss_path(self) -> str:
        """How misses reach the lines: ``"direct"``, ``"staged"`` or ``"copied"``
        (:func:`~lsm_gnn.cache.staging.miss_path`)."""
        return self._misses.path

    @property
    def read_ahead(self):
        """The :class:`~lsm_gnn.cache.read_ahead.ReadAhead` of the constructor's ``read_ahead`` (None: off)."""
        return self._ahead if self._ahead.depth else None

    @property
    def dirty(self) -> torch.Tensor | None:
        """Per line, whether it changed since it was read or written back (None: a read-only storage)."""
        return self._writes.dirty

    @property
    def writable(self) -> bool:
        """Whether :meth:`update` works: the storage is writable and the cache writes back."""
        return self._writes.dirty is not None

    @property
    def last_timings(self) -> dict[str, float]:
        """Seconds of the last lookup's parts: ``"write-back"`` over a writable storage."""
        return self._writes.timings

    # -- writes (over a writable storage: lsm_gnn.cache.write_back) ---------------------------------------------

    def lines_of(self, ids) -> torch.Tensor:
        """The line holding each of ``ids`` (-1: not cached), without touching the policy's state."""
        return self.state.lines_of(as_id_tensor(ids).to(self.device))

    def update(self, ids, grads: torch.Tensor, apply) -> None:
        """Read-modify-write of the rows of distinct ``ids``: row ``i`` becomes row ``i`` of
        ``apply(rows, grads)`` (``grads[i]`` belongs to ``ids[i]``). Cached rows change in their lines, which
        become dirty; the others (left uncached by the policy) are read from and written to the storage."""
        if not self.writable:
            raise TypeError(f"{self.describe()}: its storage is read-only; only an embedding table's rows can be "
                            "updated")
        ids = as_id_tensor(ids)
        with self._lock:  # (the write-back refuses it where an earlier write-back failed)
            changed = self._writes.update(ids, self.lines_of(ids), grads, apply)
            if changed is not None:  # a row evicted by its own batch may be parked: that copy is now stale
                self._victims.discard(changed)

    def flush(self) -> None:
        """Writes every dirty line to the storage (a checkpoint calls it, then syncs the storage), in id order,
        a bounded number of bytes at a time (:meth:`WriteBack.flush`)."""
        if self.writable:
            with self._lock:
                self._writes.flush(self.state.tags)

    # -- the Features interface (lsm_gnn.features): a cache wraps a storage -------------------------------------

    caches = True
    owner = None  # one process's cache: every row is its own

    @property
    def cache_lines(self) -> int:
        return self.num_lines

    def counters(self) -> dict[str, int]:
        """The storage's byte counters; with PVP also the victim buffer's hits and the bytes they saved."""
        counters = self.storage.counters()
        if self.pvp is not None:
            counters.update(pvp_hits=self.stats.pvp_hits, bytes_saved=self.stats.pvp_hits * self.row_bytes)
        return counters

    def prefetch(self) -> None:
        """With PVP: starts moving the victim queue of the next iteration into the prefetch buffer, on a
        background thread, so the next lookup finds its rows there (the paper's side-stream copy)."""
        self._victims.prefetch(self.iteration)

    def settle(self) -> None:
        """Joins a prefetch in flight and stops reading ahead; the next lookup still finds its rows."""
        self._victims.close()
        self._ahead.close()

    def describe(self) -> str:
        from lsm_gnn.utils.units import format_bytes

        pvp = f" with a victim buffer ({self.pvp.capacity:,} lines per queue)" if self.pvp is not None else ""
        rows = self.storage.num_rows  # the rows this cache serves: of a typed graph, its group's types only
        share = f"room for all {rows:,} rows" if self.num_lines >= rows else \
            f"for {rows:,} rows: {self.num_lines / rows:.2%}"
        return (f"a {format_bytes(self.capacity_bytes)} {self.policy.name} cache ({self.num_lines:,} lines, "
                f"{share}){pvp} over {self.storage.backend} storage")

    def snapshot(self) -> dict:
        """Line metadata in the reference model's terms, for decision-by-decision comparison."""
        return self.state.snapshot()
