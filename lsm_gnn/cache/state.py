"""The cache's line metadata as one object with named fields, and the ops over it with named results.

The fields are tensors on the cache's device in the layout of :mod:`lsm_gnn.kernels.layout`; the ops are
``torch.ops.lsm_gnn.*`` (:mod:`lsm_gnn.kernels.ops`), which run the C++ core on CPU tensors and the
Triton kernels on CUDA ones. Callers make one call and never branch on the device.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import NamedTuple

import numpy as np
import torch

from lsm_gnn.cache.geometry import set_of
from lsm_gnn.kernels.layout import INDEX_MASK, INVALID_TAG, NO_REUSE_RECORD, REUSE_SHIFT
from lsm_gnn.cache.policies import POLICY_CODE, PolicyConfig
from lsm_gnn.kernels import ops as _ops  # noqa: F401  (registers torch.ops.lsm_gnn)


class Assigned(NamedTuple):
    """What assigning one batch of distinct ids did, entry by entry (``csrc/cache/cpu_cache.h``), with its
    counts still on the cache's device (:class:`Assignment` once read)."""

    line: torch.Tensor
    hit: torch.Tensor
    evicted_tag: torch.Tensor
    evicted_record: torch.Tensor
    evicted_line: torch.Tensor
    counts: torch.Tensor          # int64 [evictions, evicted_in_use, bypassed, misses]

    def read(self, counts: list[int] | None = None) -> "Assignment":
        """As an :class:`Assignment`, given the counts read back (``None``: read them now)."""
        evictions, in_use, bypassed, _ = self.counts.tolist() if counts is None else counts
        return Assignment(*self[:5], evictions, in_use, bypassed)


class Assignment(NamedTuple):
    """What assigning one batch of distinct ids did, entry by entry (``csrc/cache/cpu_cache.h``)."""

    line: torch.Tensor            # the line each id now occupies (-1: none, an oversubscribed set)
    hit: torch.Tensor             # whether it was already cached
    evicted_tag: torch.Tensor     # the node its install evicted (INVALID_TAG: none)
    evicted_record: torch.Tensor  # that line's PVP record
    evicted_line: torch.Tensor    # and its line
    evictions: int                # valid lines evicted
    evicted_in_use: int           # of those, lines this batch had used (oversubscribed sets)
    bypassed: int                 # misses left uncached (line -1): the policy would evict them first


@dataclass
class CacheState:
    """Per-line metadata of a ``num_sets x ways`` cache, one tensor per field, all on one device."""

    tags: torch.Tensor          # int64: the node a line holds (INVALID_TAG: empty)
    records: torch.Tensor       # int64: PVP record (next reuse, rank, index in that batch) from the last scan
    flags: torch.Tensor         # uint8: FRESH while a line has no dynamic information
    static_score: torch.Tensor  # int16 view of the line's uint16 static rank
    last_use: torch.Tensor      # int64: the iteration that last used the line (-1: never)
    rr_pointer: torch.Tensor    # int32 per set: the round-robin policy's next victim
    ways: int

    @classmethod
    def empty(cls, num_sets: int, ways: int, device: torch.device) -> CacheState:
        n = num_sets * ways
        return cls(tags=torch.full((n,), INVALID_TAG, dtype=torch.int64, device=device),
                   records=torch.full((n,), NO_REUSE_RECORD, dtype=torch.int64, device=device),
                   flags=torch.zeros(n, dtype=torch.uint8, device=device),
                   static_score=torch.zeros(n, dtype=torch.int16, device=device),
                   last_use=torch.full((n,), -1, dtype=torch.int64, device=device),
                   rr_pointer=torch.zeros(num_sets, dtype=torch.int32, device=device), ways=ways)

    @property
    def num_lines(self) -> int:
        return self.tags.numel()

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The six tensors in the ops' argument order."""
        return tuple(getattr(self, f.name) for f in fields(self) if f.name != "ways")

    def clone(self) -> CacheState:
        return CacheState(*(t.clone() for t in self.tensors()), ways=self.ways)

    def assign(self, unique: torch.Tensor, node_static: torch.Tensor | None, policy: PolicyConfig, iteration: int,
               scan_base: int, queue_room: torch.Tensor | None = None, num_threads: int = 0,
               window: tuple | None = None, has_misses: bool = False) -> Assigned:
        """Hits, victims and installs of one batch of sorted distinct ids under ``policy``.

        ``window``: the window's ``(first_iteration, first_position, first_rank, front)``
        (:meth:`lsm_gnn.cache.WindowBuffer.first_occurrence`) for a policy with ``assign_next_use``:
        hit and installed lines then get their next use now rather than at the next scan. ``has_misses``: the
        caller knows some id misses; ``unique`` may then end with ``NO_ID`` padding (``lsm_gnn::cache_assign``)."""
        arrays, front = (None, None, None), 0
        if window is not None and policy.assign_next_use:
            *arrays, front = window
        return Assigned(*torch.ops.lsm_gnn.cache_assign(
            *self.tensors(), self.ways, unique, node_static, POLICY_CODE[policy.name], iteration, scan_base,
            policy.near_threshold, list(policy.level_rank), queue_room, *arrays, front, policy.window,
            policy.bypass and arrays[0] is not None, has_misses, num_threads))

    def scan(self, first_iteration: torch.Tensor, first_position: torch.Tensor, first_rank: torch.Tensor,
             front: int, limit: int, num_threads: int = 0) -> None:
        """Sets every valid line's next reuse from a window's first occurrences
        (:meth:`lsm_gnn.cache.WindowBuffer.first_occurrence`) and clears its fresh mark."""
        torch.ops.lsm_gnn.cache_scan(self.tags, self.records, self.flags, first_iteration, first_position,
                                     first_rank, front, limit, num_threads)

    @property
    def num_sets(self) -> int:
        return self.rr_pointer.numel()

    def lines_of(self, ids: torch.Tensor) -> torch.Tensor:
        """The line holding each of ``ids`` (int64, on the state's device; -1: not held), changing nothing."""
        sets = torch.from_numpy(set_of(ids.cpu().numpy(), self.num_sets)).to(self.tags.device)
        match = self.tags.view(self.num_sets, self.ways)[sets] == ids[:, None]
        way = match.to(torch.uint8).argmax(1)
        return torch.where(match.any(1), sets * self.ways + way, torch.full_like(sets, -1))

    def snapshot(self) -> dict[str, np.ndarray]:
        """The lines' metadata in the reference model's terms (:meth:`lsm_gnn.cache.ReferenceCache.snapshot`),
        for decision-by-decision comparison."""
        records = self.records.cpu().numpy().view(np.uint64)
        return {"tags": self.tags.cpu().numpy().copy(), "reuse": (records >> np.uint64(REUSE_SHIFT)).astype(np.uint16),
                "fresh": (self.flags.cpu().numpy() & 1).astype(bool),
                "static": self.static_score.cpu().numpy().view(np.uint16).copy(),
                "pvp_index": (records & np.uint64(INDEX_MASK)).astype(np.int64),
                "rr_pointer": self.rr_pointer.cpu().numpy().astype(np.int64)}

    def forget(self, lines: torch.Tensor) -> None:
        """Empties ``lines`` (e.g. lines whose row was never written)."""
        self.tags[lines] = INVALID_TAG
        self.records[lines] = NO_REUSE_RECORD
