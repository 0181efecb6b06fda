"""Uniform neighbor sampling without replacement, per-hop fanouts.

``NeighborSampler(dataset, fanouts, seed).sample(seeds, iteration)`` is
deterministic in (seed, iteration, seeds): a window buffer can sample batch
t + 256 now and the trainer gets the very same batch at iteration t + 256.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from lsm_gnn.storage.base import as_id_tensor


@dataclass
class Hop:
    """One hop (a DGL-style block): ``nodes[:num_dst]`` are its destination
    nodes; ``edge_index[0]`` indexes ``nodes`` (sources), ``edge_index[1]``
    indexes ``nodes[:num_dst]`` (destinations); messages flow 0 -> 1 as in PyG."""

    nodes: torch.Tensor
    num_dst: int
    edge_index: torch.Tensor

    @property
    def num_src(self) -> int:
        return int(self.nodes.numel())


def _tensor(array: np.ndarray) -> torch.Tensor:
    with warnings.catch_warnings():
        # Memory-mapped topology is read-only; the sampler only reads it.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


class NeighborSampler:
    """Samples hops outward from seed nodes over a dataset's CSR topology.

    ``fanouts[h]`` neighbors per node at hop h (-1: all). Hop 0 samples the
    seeds' neighbors; each later hop samples for every node reached so far.
    """

    def __init__(self, dataset, fanouts, seed: int = 0, num_threads: int = 0):
        self.fanouts = [int(k) for k in fanouts]
        if not self.fanouts or any(k < -1 for k in self.fanouts):
            raise ValueError(f"fanouts must be a non-empty list of ints >= 0 (or -1 for all), got {fanouts}")
        self.seed = int(seed) & ((1 << 64) - 1)
        self.num_threads = num_threads
        self.indptr = _tensor(np.ascontiguousarray(dataset.indptr, dtype=np.int64))
        indices = np.ascontiguousarray(dataset.indices)
        if indices.dtype not in (np.int32, np.int64):
            indices = indices.astype(np.int64)
        self.indices = _tensor(indices)
        self.num_nodes = self.indptr.numel() - 1

    def sample(self, seeds, iteration: int = 0) -> list[Hop]:
        """The hops for one mini-batch of distinct seed nodes."""
        from lsm_gnn import _C

        seeds = as_id_tensor(seeds)
        raw = _C.sample_hops(self.indptr, self.indices, seeds, self.fanouts, self.seed, int(iteration),
                             self.num_threads)
        return [Hop(nodes, num_dst, torch.stack([src, dst])) for nodes, num_dst, src, dst in raw]

    def input_nodes(self, seeds, iteration: int = 0) -> torch.Tensor:
        """Every node whose features the batch needs (the last hop's nodes)."""
        return self.sample(seeds, iteration)[-1].nodes
