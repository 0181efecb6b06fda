"""From a config to the feature path: resolved once, assembled in one place.

:func:`resolve` turns the config's cache section and the dataset into one
:class:`FeatureSpec` (capacity in bytes, the policy with ``auto`` decided,
PVP settings that agree with each other, the sharing mode); every check
that needs the dataset happens there and names its config key.
:func:`build_features` assembles storage -> cache -> communication from the
spec and returns a :class:`~lsm_gnn.features.Features`. This is the only
place that knows which concrete layers it composes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lsm_gnn.cache import PolicyConfig, SoftwareCache
from lsm_gnn.config import Config, ConfigError, cache_capacity_bytes, policy_config
from lsm_gnn.features import Features
from lsm_gnn.storage import open_storage


@dataclass(frozen=True)
class FeatureSpec:
    """The resolved feature path of a run."""

    source: str                  # cache | storage (no cache) | memory (the whole file in RAM)
    backend: str                 # storage backend of the miss path ("auto": io_uring where it works)
    capacity_bytes: int          # cache size asked for, in bytes (the cache may allocate less: docs/cache.md)
    ways: int
    policy: PolicyConfig         # name (``auto`` decided), window, period
    static_score: str | None     # the dataset score that ranks lines, or None
    oversubscribe: bool
    pvp: bool
    pvp_queue_capacity: int
    pvp_reinstall: bool          # only ever True with pvp
    shared: bool                 # several ranks share one cache (the communication layer)
    owner: str                   # who owns a node when shared: modulo | hotness | path to a .npy map


def resolve(cfg: Config, dataset, world_size: int = 1) -> FeatureSpec:
    """The feature path ``cfg`` asks for on ``dataset`` with ``world_size`` ranks; raises ConfigError."""
    c = cfg.cache
    static = None if c.static_score == "none" else c.static_score
    if c.features == "cache" and static is not None and static not in dataset.score_names:
        raise ConfigError(f"cache.static_score={static!r} is not in the dataset (it has "
                          f"{dataset.score_names or 'no scores'}); prepare it with 'lsm-gnn prepare scores' or set "
                          "cache.static_score=none")
    row_bytes = dataset.feature_dim * dataset.feature_dtype.itemsize
    return FeatureSpec(
        source=c.features, backend=c.backend,
        capacity_bytes=cache_capacity_bytes(c.capacity, dataset.num_nodes, row_bytes), ways=c.ways,
        policy=policy_config(c), static_score=static, oversubscribe=c.oversubscribe, pvp=c.pvp,
        pvp_queue_capacity=c.pvp_queue_capacity, pvp_reinstall=c.pvp and c.pvp_reinstall,
        shared=world_size > 1 and c.mode == "shared", owner=c.owner)


def build_features(spec: FeatureSpec, dataset, device: torch.device, *, world_size: int = 1, fanouts=None,
                   batch_size: int = 1024, seed: int = 0, num_threads: int = 0) -> Features:
    """Storage, then the cache over it, then the communication layer over the cache, as ``spec`` says.

    ``fanouts``, ``batch_size`` and ``seed`` pre-sample accesses for hotness ownership (only that owner
    samples them).
    """
    if spec.source == "memory":
        return open_storage(dataset, "memory")
    storage = open_storage(dataset, spec.backend)
    if spec.source == "storage":
        return storage
    cache = SoftwareCache(storage, spec.capacity_bytes, ways=spec.ways, policy=spec.policy,
                          static_scores=None if spec.static_score is None else dataset.score(spec.static_score),
                          oversubscribe=spec.oversubscribe, device=device, num_threads=num_threads, pvp=spec.pvp,
                          pvp_queue_capacity=spec.pvp_queue_capacity, pvp_reinstall=spec.pvp_reinstall)
    if not spec.shared:
        return cache
    from lsm_gnn.comm import SharedCache, make_owner
    from lsm_gnn.sampling import sampled_access_counts

    # Hotness ownership counts accesses over pre-sampled batches; the communication layer only takes the counts.
    owner = make_owner(spec.owner, dataset, world_size, access_counts=lambda: sampled_access_counts(
        dataset, fanouts, batch_size, seed=seed))
    return SharedCache(cache, owner)
