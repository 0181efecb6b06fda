"""Neighbor sampling in the native core: one sampler, plain hops for one-type graphs, typed hops for any."""
from lsm_gnn.sampling.hotness import sampled_access_counts
from lsm_gnn.sampling.neighbor import CSRGraph, Graph, Hop, NeighborSampler

__all__ = ["CSRGraph", "Graph", "Hop", "NeighborSampler", "sampled_access_counts"]
