"""Neighbor sampling in the native core."""
from lsm_gnn.sampling.neighbor import Hop, NeighborSampler

__all__ = ["Hop", "NeighborSampler"]
