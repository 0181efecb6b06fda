"""The neighbor sampler of a graph of one node type, in plain ids: the keyed sampler wrapped once.

:class:`~lsm_gnn.sampling.NeighborSampler` takes seeds per node type and gives hops per node type and relation on
every graph. Code written for one node type (PyG's ``SAGEConv`` layers, DGL blocks, most examples) reads plain
hops: one tensor of nodes and one ``edge_index``. :class:`OneTypeSampler` is that form, made once around a keyed
sampler: it keys the seeds by the graph's one node type and makes each hop plain (:meth:`Hop.unkeyed`), so the
keyed sampler never asks which form it was given.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from lsm_gnn.sampling.neighbor import Graph, Hop, NeighborSampler


class OneTypeSampler:
    """A :class:`NeighborSampler` of a graph of one node type and one relation, taking plain ids and giving
    plain hops. Same arguments as :class:`NeighborSampler`, same draws: ``OneTypeSampler(g, f).sample(ids, i)``
    is ``NeighborSampler(g, f).sample({t: ids}, i)`` with each hop made plain. ``sampler`` is the keyed one."""

    def __init__(self, graph: Graph, fanouts, **kwargs):
        node_types, relations = list(graph.node_types), list(graph.relations)
        if len(node_types) != 1 or len(relations) != 1:
            raise ValueError(f"OneTypeSampler needs a graph of one node type and one relation; this one has "
                             f"{len(node_types)} node types ({', '.join(map(str, node_types))}) and "
                             f"{len(relations)} relations: use NeighborSampler with seeds as {{node type: ids}}")
        self.sampler = NeighborSampler(graph, fanouts, **kwargs)
        self.node_type = self.sampler.node_types[0]

    @property
    def num_nodes(self) -> int:
        return self.sampler.num_nodes[self.node_type]

    @property
    def indptr(self) -> torch.Tensor:
        return self.sampler.indptr

    @property
    def indices(self) -> torch.Tensor:
        return self.sampler.indices

    def sample(self, ids, iteration: int = 0) -> list[Hop]:
        """The plain hops of one mini-batch from ``ids``, distinct ids of the graph's node type."""
        return _plain(self.sampler.sample({self.node_type: ids}, iteration))

    def sample_many(self, batches: Sequence[tuple[object, int]]) -> list[list[Hop]]:
        """:meth:`sample` of each ``(ids, iteration)`` in ``batches``, as :meth:`NeighborSampler.sample_many`
        spreads them over its workers."""
        keyed = self.sampler.sample_many([({self.node_type: ids}, iteration) for ids, iteration in batches])
        return [_plain(hops) for hops in keyed]

    def input_nodes(self, ids, iteration: int = 0) -> torch.Tensor:
        """Every node whose features the batch of ``ids`` needs (the last hop's nodes)."""
        return self.sample(ids, iteration)[-1].nodes


def _plain(hops: list[Hop]) -> list[Hop]:
    return [hop.unkeyed() for hop in hops]
