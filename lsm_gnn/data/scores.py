"""Static per-node scores for the cache's static policy, computed by the native core."""
from __future__ import annotations

import numpy as np
import torch

from lsm_gnn.data.format import check_neighbor_ids, source_file, topology_error
from lsm_gnn.data.csr_build import EDGE_CHUNK
from lsm_gnn.utils.ids import read_only_tensor

SCORE_NAMES = ("reverse_pagerank", "degree")


def reverse_pagerank(indptr: np.ndarray, indices: np.ndarray, damping: float = 0.85, max_iterations: int = 100,
                     tolerance: float = 1e-7, num_threads: int = 0) -> np.ndarray:
    """PageRank of the walk that steps from a node to a uniform member of its
    CSR row, the direction neighbor sampling moves; a node's score estimates
    how often sampling reaches it. Returns float32 scores summing to 1."""
    from lsm_gnn import _C

    files = source_file(indptr), source_file(indices)  # before the arrays are converted and lose their files
    indices = np.ascontiguousarray(indices)
    if indices.dtype not in (np.int32, np.int64):
        indices = indices.astype(np.int64)
    # memory-mapped arrays are read-only; the native core only reads them
    indptr_t = read_only_tensor(np.ascontiguousarray(indptr, dtype=np.int64))
    indices_t = read_only_tensor(indices)
    try:
        scores, _, _ = _C.reverse_pagerank(indptr_t, indices_t, damping, max_iterations, tolerance, num_threads)
    except _C.CorruptGraphError as exc:  # the native code bounds-checks the whole CSR first
        raise topology_error(exc, *files) from None
    return scores.numpy()


def sampled_degree(indices: np.ndarray, num_nodes: int) -> np.ndarray:
    """How many CSR rows list each node: the number of nodes whose sampling can reach it."""
    check_neighbor_ids(indices, num_nodes)  # bincount would fail (negative) or grow (too large) with no clear error
    counts = np.zeros(num_nodes, dtype=np.int64)
    # Each bincount allocates and adds num_nodes counts: chunks of at least num_nodes ids keep that cost
    # to about avg-degree passes over the nodes (not one per EDGE_CHUNK ids) and memory to 12 bytes a node.
    chunk = max(EDGE_CHUNK, num_nodes)
    for start in range(0, indices.shape[0], chunk):
        counts += np.bincount(np.asarray(indices[start:start + chunk]), minlength=num_nodes)
    return counts.astype(np.float32)


def check_score_names(names) -> tuple[str, ...]:
    """``names`` as a tuple (None or empty: no scores); unknown names raise ValueError listing the valid ones."""
    names = tuple(names or ())
    unknown = sorted(set(names) - set(SCORE_NAMES))
    if unknown:
        raise ValueError(f"unknown score(s) {unknown}; valid names are {', '.join(SCORE_NAMES)}")
    return names


def compute_scores(indptr: np.ndarray, indices: np.ndarray, names=SCORE_NAMES) -> dict[str, np.ndarray]:
    """Computes the named scores; unknown names raise ValueError listing the valid ones."""
    names = check_score_names(names)
    num_nodes = indptr.shape[0] - 1
    out = {}
    for name in names:
        out[name] = reverse_pagerank(indptr, indices) if name == "reverse_pagerank" else sampled_degree(indices, num_nodes)
    return out
