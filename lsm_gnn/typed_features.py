"""Features of a heterogeneous graph: every node type through one cache budget.

Node types whose rows have one format (dim and dtype) share one id space
(:class:`~lsm_gnn.storage.concat.ConcatStorage`) and so one
:class:`~lsm_gnn.features.Features`: one cache, one window, one victim
buffer, one exchange between ranks, for all of them. IGBH (every type
1024 x float32) and MAG240M (only papers have features) each have a single
such group, so their whole budget is one cache whose lines go to whichever
type's rows the policy keeps. Types with other row formats form groups of
their own, each with a share of the budget (``docs/hetero.md``). Types
without features are in no group.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lsm_gnn.features import Features


@dataclass
class FeatureGroup:
    """Node types sharing one row format, and the Features serving their id space."""

    types: list[str]           # in id-space order
    offsets: dict[str, int]    # first id of each type in the group's id space
    features: Features

    def ids(self, nodes: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[tuple[str, int]]]:
        """The group's ids of ``nodes`` (per type, local ids) and (type, count) per part, in order."""
        parts = [(t, nodes[t]) for t in self.types if t in nodes]  # empty ones too: every type gets its rows
        if not parts:
            return torch.empty(0, dtype=torch.int64), []
        ids = torch.cat([local.to(torch.int64) + self.offsets[t] for t, local in parts])
        return ids, [(t, local.numel()) for t, local in parts]


class TypedFeatures:
    """Rows of every featured node type by (type, local id), one :class:`FeatureGroup` per row format."""

    def __init__(self, groups: list[FeatureGroup]):
        self.groups = groups
        self.group_of: dict[str, int] = {t: g for g, group in enumerate(groups) for t in group.types}

    @property
    def caches(self) -> bool:
        return any(group.features.caches for group in self.groups)

    def dims(self) -> dict[str, int]:
        """Feature dim per featured type."""
        return {t: group.features.dim for group in self.groups for t in group.types}

    def group_ids(self, nodes: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """Per group, the ids of ``nodes`` in its id space (what its window holds for a batch)."""
        return [group.ids(nodes)[0] for group in self.groups]

    def gather(self, nodes: dict[str, torch.Tensor], *, futures=None
               ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(rows per type, hit mask per type) of ``nodes`` (per type, local ids; types without features are
        left out). ``futures``: one window per group (:meth:`group_ids` of each upcoming batch), or None.
        Every group gathers, even with no ids of its types in the batch: a cache's iterations then stay
        in step with its window, and a shared cache's collectives with the other ranks'."""
        rows, hits = {}, {}
        for g, group in enumerate(self.groups):
            ids, parts = group.ids(nodes)
            x, hit = group.features.gather(ids, future=None if futures is None else futures[g])
            start = 0
            for t, count in parts:
                rows[t], hits[t] = x[start:start + count], hit[start:start + count]
                start += count
        return rows, hits

    def counters(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for group in self.groups:
            for key, value in group.features.counters().items():
                total[key] = total.get(key, 0) + value
        return total

    def prefetch(self) -> None:
        for group in self.groups:
            group.features.prefetch()

    def settle(self) -> None:
        for group in self.groups:
            group.features.settle()

    def describe(self) -> str:
        return "; ".join(f"{'+'.join(group.types)}: {group.features.describe()}" for group in self.groups)

    @property
    def last_timings(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for group in self.groups:
            for key, value in group.features.last_timings.items():
                total[key] = total.get(key, 0.0) + value
        return total


class GroupWindows:
    """One window buffer per feature group, fed with a batch's nodes per type (what the loader keeps for
    :meth:`TypedFeatures.gather`'s ``futures``)."""

    def __init__(self, features: TypedFeatures, size: int):
        from lsm_gnn.cache import WindowBuffer

        self.features = features
        self.buffers = [WindowBuffer(size, group.features.num_rows) for group in features.groups]

    def push(self, nodes: dict[str, torch.Tensor]) -> None:
        for buffer, ids in zip(self.buffers, self.features.group_ids(nodes)):
            buffer.push(ids)

    def pop(self) -> None:
        for buffer in self.buffers:
            buffer.pop()

    def __len__(self) -> int:
        return len(self.buffers[0]) if self.buffers else 0
