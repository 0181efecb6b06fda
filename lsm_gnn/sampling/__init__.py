"""Neighbor sampling in the native core."""
from lsm_gnn.sampling.hetero import HeteroGraph, HeteroHop, HeteroNeighborSampler
from lsm_gnn.sampling.hotness import sampled_access_counts
from lsm_gnn.sampling.neighbor import Hop, NeighborSampler

__all__ = ["HeteroGraph", "HeteroHop", "HeteroNeighborSampler", "Hop", "NeighborSampler", "sampled_access_counts"]
