"""Who owns a node: the rank whose cache slice holds its line and serves its requests.

An owner function maps an int64 id array to an int64 rank array and must
give the same answer on every rank (it is computed locally, never sent).

- ``modulo``: ``id % world_size``, the paper's striding.
- ``hashed``: ranks drawn from a hash of the id, so ids whose low bits
  carry hotness (R-MAT graphs: odd ids are asked for 2.5x as often as even
  ones) still spread evenly. It takes the hash's high 32 bits, the cache's
  set index its whole value: an owner's ids still fill all of its sets.
- ``hotness``: nodes ranked by how often pre-sampled mini-batches touch
  them, dealt to ranks in snake order (0..N-1, N-1..0, ...) so each rank's
  expected traffic is even; untouched nodes fall back to modulo.
- a ``.npy`` partition map (for example from METIS): ``map[id]`` is the owner.
"""
from __future__ import annotations

import os

import numpy as np

from lsm_gnn.utils.hashing import splitmix64


class ModuloOwner:
    name = "modulo"

    def __init__(self, world_size: int):
        self.world_size = world_size

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        return np.asarray(ids, dtype=np.int64) % self.world_size


class HashedOwner:
    name = "hashed"

    def __init__(self, world_size: int):
        self.world_size = world_size

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        high = splitmix64(np.asarray(ids, dtype=np.int64)) >> np.uint64(32)
        return (high % np.uint64(self.world_size)).astype(np.int64)


class MapOwner:
    """Owners read from a per-node array."""

    def __init__(self, owners: np.ndarray, world_size: int, name: str):
        owners = np.asarray(owners)
        if owners.ndim != 1 or owners.dtype.kind not in "iu":
            raise ValueError(f"{name}: an owner map must be a 1-D integer array, got {owners.dtype} {owners.shape}")
        if owners.size and (int(owners.min()) < 0 or int(owners.max()) >= world_size):
            raise ValueError(f"{name}: owner ranks must be in [0, {world_size}), found "
                             f"{int(owners.min())}..{int(owners.max())}; was it made for another world size?")
        self.owners, self.world_size, self.name = owners, world_size, name

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        return self.owners[np.asarray(ids, dtype=np.int64)].astype(np.int64)

    def loads(self, counts: np.ndarray) -> np.ndarray:
        """Expected requests per rank for per-node access ``counts``."""
        return np.bincount(self.owners, weights=counts, minlength=self.world_size)


def hotness_owner(counts: np.ndarray, world_size: int) -> MapOwner:
    """Owners that balance ``counts`` (per-node expected accesses) across ranks.

    The map is held for the whole run, one entry per node, so it takes the narrowest type that holds
    a rank (uint8 up to 256 ranks: 1 byte per node)."""
    counts = np.asarray(counts)
    # np.resize repeats 0..world_size-1: id % world_size for every id, with no int64 temporary.
    owners = np.resize(np.arange(world_size, dtype=np.min_scalar_type(world_size - 1)), counts.size)
    hot = np.flatnonzero(counts > 0)
    hot = hot[np.argsort(-counts[hot], kind="stable")]
    position = np.arange(hot.size) % (2 * world_size)
    owners[hot] = np.where(position < world_size, position, 2 * world_size - 1 - position)
    return MapOwner(owners, world_size, "hotness")


def make_owner(spec: str, dataset, world_size: int, *, access_counts=None):
    """The owner function a config names: ``modulo``, ``hotness`` or a path to a ``.npy`` map.

    ``access_counts`` (``hotness`` only) is the per-node access count array, or a callable returning it,
    called only when needed; the caller computes it (for example with
    :func:`lsm_gnn.sampling.sampled_access_counts`) so this layer does not depend on the sampler.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if spec == "modulo":
        return ModuloOwner(world_size)
    if spec == "hashed":
        return HashedOwner(world_size)
    if spec == "hotness":
        if access_counts is None:
            raise ValueError("hotness ownership needs per-node access counts "
                             "(see lsm_gnn.sampling.sampled_access_counts)")
        counts = np.asarray(access_counts() if callable(access_counts) else access_counts)
        if counts.shape != (dataset.num_nodes,):
            raise ValueError(f"access counts have shape {counts.shape}; the dataset has {dataset.num_nodes} nodes")
        return hotness_owner(counts, world_size)
    if spec.endswith(".npy"):
        if not os.path.exists(spec):
            raise FileNotFoundError(f"partition map {spec} does not exist (an int array of length num_nodes)")
        owners = np.load(spec, mmap_mode="r")
        if owners.shape != (dataset.num_nodes,):
            raise ValueError(f"partition map {spec} has shape {owners.shape}; the dataset has "
                             f"{dataset.num_nodes} nodes, so it must be ({dataset.num_nodes},)")
        return MapOwner(owners, world_size, spec)
    raise ValueError(f"unknown ownership {spec!r}; use 'modulo', 'hashed', 'hotness' or a path to a .npy partition map")
