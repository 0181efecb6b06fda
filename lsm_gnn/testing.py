"""Helpers for tests of lsm-gnn and of code built on it (shipped in the package, as PyG does)."""
from __future__ import annotations

import json
import os
import socket

import numpy as np

from lsm_gnn.data.format import META_FILE, Dataset
from lsm_gnn.data.writer import DatasetWriter


def id_features(num_nodes: int, dim: int, dtype: str = "float32") -> np.ndarray:
    """Features from which a row's node id can be read back: row i starts with i
    (exact in float32 below 2**24) and continues with a per-row pattern."""
    rows = np.arange(num_nodes, dtype=np.int64)[:, None]
    cols = np.arange(dim, dtype=np.int64)[None, :]
    values = np.where(cols == 0, rows, (rows * 31 + cols * 7) % 251)
    if np.dtype(dtype) == np.float16:
        values = np.where(cols == 0, rows % 2048, values)  # float16 is exact only up to 2048
    return values.astype(dtype)


def write_tiny_dataset(path: str | os.PathLike, num_nodes: int = 1000, dim: int = 16, dtype: str = "float32",
                       avg_degree: int = 4, num_classes: int = 4, seed: int = 0, features: np.ndarray | None = None,
                       chunk: int = 257) -> tuple[Dataset, np.ndarray]:
    """Writes a small random dataset and returns it opened, with the feature array it holds."""
    rng = np.random.default_rng(seed)
    if features is None:
        features = id_features(num_nodes, dim, dtype)
    with DatasetWriter(path, num_nodes=num_nodes, feature_dim=dim, feature_dtype=dtype) as writer:
        for start in range(0, num_nodes, chunk):
            writer.write_features(features[start:start + chunk])
        num_edges = num_nodes * avg_degree
        writer.write_edges([(rng.integers(0, num_nodes, num_edges), rng.integers(0, num_nodes, num_edges))])
        writer.write_labels(rng.integers(0, num_classes, num_nodes), num_classes)
        order = rng.permutation(num_nodes)
        cut1, cut2 = int(0.6 * num_nodes), int(0.8 * num_nodes)
        writer.write_split("train", order[:cut1])
        writer.write_split("val", order[cut1:cut2])
        writer.write_split("test", order[cut2:])
        dataset = writer.commit()
    return dataset, features


def power_law_trace(seed: int, iterations: int, batch: int, num_nodes: int, skew: float = 0.9) -> list[np.ndarray]:
    """Batches of ids drawn from a Zipf-like popularity over a random permutation of the nodes
    (a cache trace with hot and cold ids, for the cache tests)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, num_nodes + 1) ** skew
    p /= p.sum()
    perm = rng.permutation(num_nodes)
    return [perm[rng.choice(num_nodes, batch, p=p)] for _ in range(iterations)]


def tiny_cache_setup(path: str | os.PathLike, num_nodes: int, dim: int = 6):
    """(memory storage, features tensor, quantized degree scores) of a tiny dataset, for the cache tests."""
    import torch

    from lsm_gnn.cache import quantize_scores
    from lsm_gnn.storage import open_storage

    dataset, features = write_tiny_dataset(path, num_nodes=num_nodes, dim=dim)
    static = quantize_scores(np.diff(np.asarray(dataset.indptr)).astype(np.float64))
    return open_storage(dataset, "memory"), torch.from_numpy(features), static


def edit_meta(dataset, change) -> None:
    """Rewrites ``meta.json`` of ``dataset`` (a Dataset) after ``change(meta)``: for tests of damaged datasets."""
    path = os.path.join(dataset.path, META_FILE)
    with open(path) as f:
        meta = json.load(f)
    change(meta)
    with open(path, "w") as f:
        json.dump(meta, f)


def free_port() -> int:
    """A TCP port free on localhost now, for a test's MASTER_PORT."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
