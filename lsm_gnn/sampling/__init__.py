"""Neighbor sampling in the native core."""
from lsm_gnn.sampling.hotness import sampled_access_counts
from lsm_gnn.sampling.neighbor import Hop, NeighborSampler

__all__ = ["Hop", "NeighborSampler", "sampled_access_counts"]
