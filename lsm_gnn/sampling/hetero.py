"""Neighbor sampling over a heterogeneous graph: typed nodes, typed relations, one CSR per relation.

``HeteroNeighborSampler(graph, fanouts, seed).sample({"paper": ids}, iteration)`` returns one
:class:`HeteroHop` per fanout, innermost (the seeds') first, deterministic in (seed, iteration, seeds) as
:class:`~lsm_gnn.sampling.NeighborSampler` is. Each relation's draw is one call of the homogeneous op
``torch.ops.lsm_gnn.sample_hops`` (C++ on the CPU, Triton on the GPU) with its own random streams.

With PyG, one ``HeteroConv`` layer per hop, outermost hop first; each layer ends at the previous hop's
nodes, the last one at the seeds::

    hops = sampler.sample({"paper": batch}, iteration)
    x_dict = {t: features[t][hops[-1].nodes[t]] for t in hops[-1].nodes}
    for conv, hop in zip(convs, reversed(hops)):       # convs: HeteroConv({rel: SAGEConv((-1, -1), d)})
        out = conv(x_dict, hop.edge_index)
        x_dict = {t: y[:hop.num_dst[t]] for t, y in out.items()}
    logits = x_dict["paper"]                           # one row per seed

HeteroConv outputs only the types that some relation points to, so a type that is a source must also be
a destination (give the graph reverse relations, as PyG's ``ToUndirected`` does).
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from lsm_gnn.data.format import topology_error
from lsm_gnn.data.dataset import Relation, relation_key
from lsm_gnn.hashing import mix64
from lsm_gnn.ids import as_id_tensor, first_occurrence_labels
from lsm_gnn.kernels import ops as _ops  # noqa: F401  (registers torch.ops.lsm_gnn)
from lsm_gnn.sampling.neighbor import _batch_device, _sampler_device, _SamplingCSR, _signed64

_MASK64 = (1 << 64) - 1


class HeteroGraph(Protocol):
    """What the sampler reads from a graph (a :class:`~lsm_gnn.data.Dataset` is one); node ids are local to
    their type."""

    node_types: list[str]
    relations: list[Relation]

    def num_nodes_of(self, node_type: str) -> int:
        """The node count of one type."""

    def csr(self, relation: Relation) -> tuple[np.ndarray, np.ndarray]:
        """(indptr int64 of num_nodes_of(dst) + 1 entries, int32 or int64 indices of src-type ids): row v lists
        the src-type nodes that dst-type node v aggregates from (messages flow src -> dst)."""


@dataclass
class HeteroHop:
    """One typed hop (a DGL-style block per relation).

    ``nodes[t]``: every node of type t in this hop; its first ``num_dst[t]`` are the destinations (the
    previous hop's nodes of type t, the seeds for hop 0); a type not reached has an empty tensor.
    ``edge_index[r]`` ([2, E] for every relation r = (s, name, d)): row 0 indexes ``nodes[s]``, row 1
    indexes ``nodes[d][:num_dst[d]]``; messages flow 0 -> 1, as in PyG's ``edge_index_dict``.
    """

    nodes: dict[str, torch.Tensor]
    num_dst: dict[str, int]
    edge_index: dict[Relation, torch.Tensor]

    @property
    def num_src(self) -> dict[str, int]:
        return {t: int(ids.numel()) for t, ids in self.nodes.items()}

    @property
    def dst_nodes(self) -> dict[str, torch.Tensor]:
        return {t: ids[:self.num_dst[t]] for t, ids in self.nodes.items()}

    @property
    def num_edges(self) -> dict[Relation, int]:
        return {r: int(e.shape[1]) for r, e in self.edge_index.items()}


def _draw_seed(seed: int, relation: Relation, hop: int) -> int:
    """The sample_hops seed of one relation at one hop: keyed by the relation's name (not its position, so
    adding a relation to a graph leaves the others' draws alone), mixed so that no two relations or hops
    share random streams. As a signed int64, the op's type."""
    name_key = int.from_bytes(hashlib.blake2b(relation_key(relation).encode(), digest_size=8).digest(), "little")
    return _signed64(mix64(mix64(seed ^ name_key) + hop))


def _relation_fanouts(fanouts, relations: list[Relation]) -> dict[Relation, list[int]]:
    """Per relation, its fanout per hop, from one list for all or a dict {relation or its name: list}."""
    if not isinstance(fanouts, Mapping):
        return {r: _fanout_list(fanouts, "fanouts") for r in relations}
    by_name = {relation_key(r): r for r in relations}
    chosen: dict[Relation, list[int]] = {}
    for key, value in fanouts.items():
        relation = by_name.get(key) if isinstance(key, str) else (key if key in relations else None)
        if relation is None:
            raise ValueError(f"fanouts name the relation {key!r}, which the graph does not have; its relations: "
                             f"{', '.join(by_name)}")
        if relation in chosen:
            raise ValueError(f"fanouts give the relation {relation_key(relation)} twice (as a tuple and a string)")
        chosen[relation] = _fanout_list(value, f"fanouts of {relation_key(relation)}")
    missing = [relation_key(r) for r in relations if r not in chosen]
    if missing:
        raise ValueError(f"fanouts must give every relation; missing: {', '.join(missing)}")
    first = relations[0]
    for r in relations:
        if len(chosen[r]) != len(chosen[first]):
            raise ValueError(f"every relation needs as many fanouts (hops) as the others: {relation_key(r)} has "
                             f"{len(chosen[r])}, {relation_key(first)} has {len(chosen[first])}")
    return {r: chosen[r] for r in relations}


def _fanout_list(value, what: str) -> list[int]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError(f"{what} must be a list of ints (one per hop), got {value!r}")
    ks = [int(k) for k in value]
    if not ks or any(k < -1 for k in ks):
        raise ValueError(f"{what} must be a non-empty list of ints >= 0 (or -1 for all), got {list(value)}")
    return ks


class HeteroNeighborSampler:
    """Samples typed hops outward from seed nodes of a :class:`HeteroGraph`.

    At hop h, every relation r = (s, name, d) draws ``fanouts[r][h]`` (-1: all) distinct neighbors of each
    node of type d reached so far, from r's CSR. A type's nodes at hop h are its nodes of hop h - 1
    followed by its newly reached ones, in relation order, then edge order.

    ``fanouts``: one list (per hop) for every relation, or a dict giving each relation its list (keys: the
    relation tuple or its ``"src__name__dst"`` name; all lists the same length). ``device`` as in
    :class:`~lsm_gnn.sampling.NeighborSampler`: the GPU path copies each relation's CSR there once.
    The op bounds each relation's neighbor ids by its src type's node count.
    """

    def __init__(self, graph: HeteroGraph, fanouts, seed: int = 0, num_threads: int = 0, device=None):
        self.node_types = [str(t) for t in graph.node_types]
        self.relations: list[Relation] = [tuple(r) for r in graph.relations]
        if len(set(self.node_types)) != len(self.node_types) or len(set(self.relations)) != len(self.relations):
            raise ValueError("the graph lists a node type or a relation twice")
        if not self.relations:
            raise ValueError("the graph has no relations to sample")
        for r in self.relations:
            if len(r) != 3 or r[0] not in self.node_types or r[2] not in self.node_types:
                raise ValueError(f"relation {r!r} must be (src_type, name, dst_type) with types among "
                                 f"{self.node_types}")
        self.num_nodes = {t: int(graph.num_nodes_of(t)) for t in self.node_types}
        self.fanouts = _relation_fanouts(fanouts, self.relations)
        self.num_hops = len(self.fanouts[self.relations[0]])
        self.seed = int(seed) & _MASK64
        self.num_threads = num_threads
        self.device = _sampler_device(device)
        self._draw_seeds = {r: [_draw_seed(self.seed, r, h) for h in range(self.num_hops)] for r in self.relations}
        self._csr = {r: self._relation_csr(graph, r) for r in self.relations}

    def _relation_csr(self, graph: HeteroGraph, relation: Relation) -> _SamplingCSR:
        src_type, _, dst_type = relation
        indptr, indices = graph.csr(relation)
        csr = _SamplingCSR(indptr, indices)
        if csr.num_rows != self.num_nodes[dst_type]:
            raise self._corrupt(relation, csr, f"indptr has {csr.num_rows + 1} entries, but {dst_type!r} has "
                                               f"{self.num_nodes[dst_type]} nodes (expected one more entry)", "indptr")
        return csr

    @staticmethod
    def _corrupt(relation: Relation, csr: _SamplingCSR, message: str, array: str):
        """The homogeneous sampler's DatasetError for a CSR fault, naming the relation (and its file)."""
        from lsm_gnn import _C

        fault = _C.CorruptGraphError(f"relation {relation_key(relation)}: {message}", array)
        return topology_error(fault, *csr.files)

    def sample(self, seeds, iteration: int = 0) -> list[HeteroHop]:
        """The hops of one mini-batch; ``seeds``: {type: distinct ids} or a (type, ids) pair."""
        from lsm_gnn import _C

        seeds = self._seed_map(seeds)
        device = _batch_device(self.device, *seeds.values())
        frontier = self._seed_nodes(seeds, device)
        no_ids = torch.empty(0, dtype=torch.int64, device=device)
        hops = []
        for h in range(self.num_hops):
            drawn = {}  # relation -> (neighbor ids of its src type, dst index into frontier[dst type])
            for r in self.relations:
                dst_nodes, fanout = frontier[r[2]], self.fanouts[r][h]
                if dst_nodes.numel() == 0 or fanout == 0:
                    drawn[r] = (no_ids, no_ids)
                    continue
                csr = self._csr[r]
                indptr, indices = csr.on(device)
                try:
                    nodes, src, dst = torch.ops.lsm_gnn.sample_hops(indptr, indices, dst_nodes, [fanout],
                                                                    self._draw_seeds[r][h], int(iteration),
                                                                    self.num_threads, self.num_nodes[r[0]])
                except _C.CorruptGraphError as exc:
                    raise self._corrupt(r, csr, *exc.args) from None
                # The op merges neighbors with the seeds numerically, which is wrong across types:
                # nodes[src] is each edge's neighbor id, exact either way.
                neighbors = nodes.index_select(0, src)  # not nodes[src]: 10x slower on the CPU
                drawn[r] = (neighbors, dst)
            num_dst = {t: int(ids.numel()) for t, ids in frontier.items()}
            frontier, edge_index = self._merge(frontier, drawn)
            hops.append(HeteroHop(frontier, num_dst, edge_index))
        return hops

    def input_nodes(self, seeds, iteration: int = 0) -> dict[str, torch.Tensor]:
        """Per type, every node whose features the batch needs (the last hop's nodes)."""
        return self.sample(seeds, iteration)[-1].nodes

    def _seed_map(self, seeds) -> dict:
        if isinstance(seeds, tuple) and len(seeds) == 2 and isinstance(seeds[0], str):
            seeds = {seeds[0]: seeds[1]}
        if not isinstance(seeds, Mapping):
            raise TypeError(f"seeds must be a dict {{node type: ids}} or a (node type, ids) pair, got "
                            f"{type(seeds).__name__}")
        unknown = [t for t in seeds if t not in self.num_nodes]
        if unknown:
            raise ValueError(f"seeds of node type {unknown[0]!r}, which the graph does not have; its types: "
                             f"{', '.join(self.node_types)}")
        return dict(seeds)

    def _seed_nodes(self, seeds: dict, device: torch.device) -> dict[str, torch.Tensor]:
        """Per type, its seeds as an int64 tensor on ``device`` (empty for types without), checked."""
        nodes = {}
        for t in self.node_types:
            ids = as_id_tensor(seeds.get(t, []), device)
            outside = (ids < 0) | (ids >= self.num_nodes[t])
            if bool(outside.any()):
                i = int(torch.nonzero(outside)[0])
                raise IndexError(f"seed node {int(ids[i])} of type {t!r} at position {i} is outside "
                                 f"[0, {self.num_nodes[t]})")
            ordered = torch.sort(ids).values
            repeated = ordered[1:] == ordered[:-1]
            if bool(repeated.any()):
                raise ValueError(f"seed node {int(ordered[1:][repeated][0])} of type {t!r} appears twice in the "
                                 "batch; seeds must be distinct")
            nodes[t] = ids
        return nodes

    def _merge(self, frontier: dict[str, torch.Tensor], drawn: dict[Relation, tuple[torch.Tensor, torch.Tensor]]
               ) -> tuple[dict[str, torch.Tensor], dict[Relation, torch.Tensor]]:
        """Each type's nodes (its previous ones, then the new ones by first occurrence) and each relation's
        edges in local ids."""
        nodes, edge_index = {}, {}
        for t in self.node_types:
            outgoing = [r for r in self.relations if r[0] == t]
            reached = [drawn[r][0] for r in outgoing]
            if sum(ids.numel() for ids in reached) == 0:
                nodes[t], labels = frontier[t], frontier[t][:0]
            else:
                nodes[t], labels = first_occurrence_labels(torch.cat([frontier[t], *reached]))
                labels = labels[frontier[t].numel():]
            for r, src in zip(outgoing, torch.split(labels, [ids.numel() for ids in reached])):
                edge_index[r] = torch.stack([src, drawn[r][1]])
        return nodes, {r: edge_index[r] for r in self.relations}
