"""Per-node access counts from pre-sampled mini-batches: the input of hotness ownership.

It lives with the sampler (which depends only on data and storage) so the
communication layer can take the counts from its caller instead of
importing the sampler itself.
"""
from __future__ import annotations

import numpy as np

from lsm_gnn.sampling.neighbor import NeighborSampler


def sampled_access_counts(dataset, fanouts, batch_size: int, num_batches: int = 64, seed: int = 0) -> np.ndarray:
    """How often ``num_batches`` sampled mini-batches of training seeds touch each node (same on every rank)."""
    sampler = NeighborSampler(dataset, fanouts, seed=seed)
    seeds = np.asarray(dataset.split("train"), dtype=np.int64)
    rng = np.random.default_rng([seed, 7])
    counts = np.zeros(dataset.num_nodes, dtype=np.int64)
    for b in range(num_batches):
        batch = rng.choice(seeds, min(batch_size, seeds.size), replace=False)
        # O(batch) per batch: a bincount of num_nodes entries per batch costs O(num_nodes) each time.
        np.add.at(counts, sampler.input_nodes({dataset.target: batch}, -1 - b)[dataset.target].numpy(), 1)
    return counts


def sampled_type_accesses(dataset, fanouts, batch_size: int, num_batches: int = 16, seed: int = 0
                          ) -> dict[str, int]:
    """Per node type of a heterogeneous dataset, the rows ``num_batches`` sampled mini-batches of target
    training seeds gather (same on every rank): the measured access mix that splits a cache budget."""
    sampler = NeighborSampler(dataset, fanouts, seed=seed)
    seeds = np.asarray(dataset.split("train"), dtype=np.int64)
    rng = np.random.default_rng([seed, 7])
    rows = dict.fromkeys(dataset.node_types, 0)
    for b in range(num_batches):
        batch = rng.choice(seeds, min(batch_size, seeds.size), replace=False)
        for t, ids in sampler.input_nodes({dataset.target: batch}, -1 - b).items():
            rows[t] += ids.numel()
    return rows
