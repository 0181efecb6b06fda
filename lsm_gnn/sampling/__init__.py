"""Neighbor sampling in the native core: one keyed sampler for every graph, and its one-type form in plain ids."""
from lsm_gnn.sampling.hotness import sampled_access_counts
from lsm_gnn.sampling.neighbor import CSRGraph, Graph, Hop, NeighborSampler
from lsm_gnn.sampling.one_type import OneTypeSampler

__all__ = ["CSRGraph", "Graph", "Hop", "NeighborSampler", "OneTypeSampler", "sampled_access_counts"]
