"""From a config to the feature path: resolved once, assembled in one place.

:func:`resolve` turns the config's cache section and the dataset into one
:class:`FeatureSpec` (capacity in bytes, the policy with ``auto`` decided,
PVP settings that agree with each other, the sharing mode); every check
that needs the dataset happens there and names its config key.
:func:`build_features` assembles storage -> cache -> communication from the
spec, one stack per row format of the graph's node types, and returns them
as one :class:`~lsm_gnn.features.TypedFeatures` (plain for a graph of one
node type). This is the only place that knows which concrete layers it
composes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from lsm_gnn import defaults
from lsm_gnn.cache import PolicyConfig, SoftwareCache, every_row_sets
from lsm_gnn.cache.pvp import QueueBudgetTooSmall
from lsm_gnn.config import Config, ConfigError, capacity_bytes_of, capacity_spec, policy_config, read_ahead_depth
from lsm_gnn.features import Features, FeatureGroup, TypedFeatures
from lsm_gnn.storage import open_storage


@dataclass(frozen=True)
class CacheSize:
    """One cache's size, resolved once: as the user wrote it (``text``, in config key ``key``, which errors
    name and fixes are given in) and in bytes."""

    text: str                    # "10%" (of the rows it caches) or "4G"
    key: str                     # cache.capacity | model.node_embedding.capacity
    bytes: int                   # the size asked for (the cache may allocate less: docs/cache.md)
    every_row: bool              # 100%: the cache gets the sets that hold all its rows (every_row_sets)

    @classmethod
    def of(cls, text: str, key: str, num_rows: int, row_bytes: int) -> CacheSize:
        kind, value = capacity_spec(text)
        return cls(str(text), key, capacity_bytes_of(kind, value, num_rows, row_bytes), (kind, value) == ("share", 1))


@dataclass(frozen=True)
class FeatureSpec:
    """The resolved feature path of a run."""

    source: str                  # cache | storage (no cache) | memory (the whole file in RAM) | device (on the GPU)
    backend: str                 # storage backend of the miss path ("auto": io_uring where it works)
    size: CacheSize              # the features' cache
    ways: int
    policy: PolicyConfig         # name (``auto`` decided), window, period
    static_score: str | None     # the dataset score that ranks lines, or None
    oversubscribe: bool
    pvp: bool
    pvp_queue_capacity: int | None  # lines per queue, or None: sized by pvp_queue_bytes
    pvp_reinstall: bool          # only ever True with pvp
    shared: bool                 # several ranks share one cache (the communication layer)
    owner: str                   # who owns a node when shared: hashed | modulo | hotness | path to a .npy map
    pvp_queue_bytes: str | None = None  # all victim queues' bytes (or a share of the cache), instead of lines
    embedding_size: CacheSize | None = None  # model.node_embedding's cache (same policy and victim buffer)
    read_ahead: int | None = None  # batches whose misses are read ahead (None: the cache's default)
    read_ahead_bytes: str = defaults.READ_AHEAD_BYTES  # the rows read ahead held at once
    exchange: str = "auto"       # how rows travel between ranks when shared: auto | shm | collective


def resolve(cfg: Config, dataset, world_size: int = 1) -> FeatureSpec:
    """The feature path ``cfg`` asks for on ``dataset`` with ``world_size`` ranks; raises ConfigError.
    For a heterogeneous dataset a capacity in % is that share of all its feature rows' bytes."""
    c = cfg.cache
    static = None if c.static_score == "none" else c.static_score
    names = sorted(set.intersection(*(set(dataset.score_names(t)) for t in dataset.feature_types)))
    if dataset.is_homogeneous:
        rows, row_bytes = dataset.num_nodes, _row_bytes(dataset)
    else:  # a share of the bytes of every type's rows: "rows" of one byte each
        rows = sum(dataset.num_nodes_of(t) * _row_bytes(dataset.node_type(t)) for t in dataset.feature_types)
        row_bytes = 1
    if c.features == "cache" and static is not None and static not in names:
        raise ConfigError(f"cache.static_score={static!r} is not in the dataset (it has "
                          f"{names or 'no scores'}); prepare it with 'lsm-gnn prepare scores' or set "
                          "cache.static_score=none")
    return FeatureSpec(
        source=c.features, backend=c.backend, size=CacheSize.of(c.capacity, "cache.capacity", rows, row_bytes),
        ways=c.ways,
        policy=policy_config(c), static_score=static, oversubscribe=c.oversubscribe, pvp=c.pvp,
        pvp_queue_capacity=c.pvp_queue_capacity or None,
        # The default budget left as None: the cache then gives each queue at least one line, as it does for a
        # default, where a figure the user gave that holds none is refused.
        pvp_queue_bytes=None if c.pvp_queue_capacity or c.pvp_queue_bytes == defaults.PVP_QUEUE_BYTES
        else c.pvp_queue_bytes, pvp_reinstall=c.pvp and c.pvp_reinstall,
        shared=world_size > 1 and c.mode == "shared", owner=c.owner, embedding_size=_embedding_size(cfg, dataset),
        read_ahead=read_ahead_depth(c), read_ahead_bytes=c.read_ahead_bytes, exchange=c.exchange)


def _embedding_size(cfg: Config, dataset) -> CacheSize | None:
    """``model.node_embedding``'s cache: ``model.node_embedding.capacity`` (default: ``cache.capacity``) of
    its table's rows, one per node."""
    e = cfg.model.node_embedding
    if not e.dim:
        return None
    from lsm_gnn.embedding import RowLayout

    try:
        row_bytes = RowLayout(e.dim, e.dtype, e.optimizer).row_bytes
    except ValueError as exc:
        raise ConfigError(f"model.node_embedding: {exc}") from None
    return CacheSize.of(e.capacity or cfg.cache.capacity, "model.node_embedding.capacity", dataset.num_nodes,
                        row_bytes)


def _row_bytes(features_of) -> int:
    return features_of.feature_dim * features_of.feature_dtype.itemsize


def build_features(spec: FeatureSpec, dataset, device: torch.device, *, world_size: int = 1,
                   weights: list[float] | None = None, fanouts=None, batch_size: int = 1024, seed: int = 0,
                   num_threads: int = 0) -> TypedFeatures:
    """The graph's features as ``spec`` says: per row format one storage over its types' files, then the
    cache over it, then with several ranks sharing the communication layer over the cache. A graph of one
    node type gets plain features (:attr:`TypedFeatures.plain`).

    With several row formats each cache gets a share of ``spec.size.bytes``: ``weights`` per group, else,
    given ``fanouts``, the bytes sampled batches of ``batch_size`` seeds gather from each group (the measured
    access mix), else each group's feature bytes. ``fanouts``, ``batch_size`` and ``seed`` also pre-sample
    accesses for hotness ownership (only that owner samples them).
    """
    groups = feature_groups(dataset)
    if not groups:
        raise ConfigError(f"dataset {dataset.path} has no node type with features; nothing to gather")
    plain = dataset.is_homogeneous
    if spec.source == "device" and not plain:
        raise ConfigError("cache.features=device holds one feature table on the GPU; a heterogeneous dataset needs "
                          "cache.features=cache or memory")
    if plain:
        capacities = [spec.size.bytes]
    else:
        capacities = _group_capacities(spec, dataset, groups, weights, fanouts, batch_size, seed)
    built = []
    for types, capacity in zip(groups, capacities):
        storage = _group_storage(spec, dataset, types, device)
        features = storage
        if spec.source == "cache":
            features = _group_cache(storage, spec, dataset, types, device, capacity, world_size=world_size,
                                    fanouts=fanouts, batch_size=batch_size, seed=seed, num_threads=num_threads)
        offsets = {t: storage.offset(t) for t in types} if len(types) > 1 else {types[0]: 0}
        built.append(FeatureGroup(types, offsets, features))
    return TypedFeatures(built, plain=plain)


def _group_capacities(spec: FeatureSpec, dataset, groups: list[list[str]], weights, fanouts, batch_size: int,
                      seed: int) -> list[int]:
    """Each feature group's share of the cache budget, at least one set of lines however rare its rows are
    (a cache needs one)."""
    if weights is None and len(groups) > 1 and fanouts is not None and spec.source == "cache":
        from lsm_gnn.sampling.hotness import sampled_type_accesses

        rows = sampled_type_accesses(dataset, fanouts, batch_size, seed=seed)
        weights = [sum(rows[t] * _row_bytes(dataset.node_type(t)) for t in types) for types in groups]
    if weights is None or sum(weights) <= 0:
        weights = [sum(dataset.num_nodes_of(t) * _row_bytes(dataset.node_type(t)) for t in types) for types in groups]
    return [max(capacity, spec.ways * _row_bytes(dataset.node_type(types[0])))
            for types, capacity in zip(groups, split_capacity(spec.size.bytes, weights))]


def _group_storage(spec: FeatureSpec, dataset, types: list[str], device: torch.device):
    """The rows of ``types`` (one row format) in one id space: the features' home for ``spec.source``."""
    if spec.source == "device":  # the whole table on the training device: the GPU's ceiling
        from lsm_gnn.storage.memory import DeviceMemoryStorage

        return DeviceMemoryStorage(dataset.node_type(types[0]), device)
    backend = "memory" if spec.source == "memory" else spec.backend
    if len(types) == 1:
        return open_storage(dataset.node_type(types[0]), backend)
    from lsm_gnn.storage.concat import ConcatStorage

    return ConcatStorage([open_storage(dataset.node_type(t), backend) for t in types], types)


def _group_cache(storage, spec: FeatureSpec, dataset, types: list[str], device: torch.device, capacity: int, *,
                 world_size: int, fanouts, batch_size: int, seed: int, num_threads: int) -> Features:
    """The cache over one group's ``storage`` with ``capacity`` bytes and, with several ranks sharing, the
    communication layer over it."""
    scores = None
    if spec.static_score is not None:
        scores = dataset.score(spec.static_score, types[0]) if len(types) == 1 else \
            np.concatenate([np.asarray(dataset.score(spec.static_score, t)) for t in types])
    cache = cache_over(storage, spec, scores, device, num_threads, capacity)
    if not spec.shared:
        return cache
    return shared_over(cache, spec, world_size, access_counts=lambda: _sampled_counts(
        dataset, fanouts, batch_size, seed))


def _sampled_counts(dataset, fanouts, batch_size: int, seed: int):
    """Per node, its accesses over pre-sampled batches (what hotness ownership ranks nodes by)."""
    if not dataset.is_homogeneous:
        raise ConfigError("cache.owner=hotness is not available for heterogeneous datasets yet; use "
                          "cache.owner=hashed")
    from lsm_gnn.sampling import sampled_access_counts

    return sampled_access_counts(dataset, fanouts, batch_size, seed=seed)


@dataclass(frozen=True)
class _IdSpace:
    """What an owner map is checked against: the ids a cache serves (a feature group's, all of a one-type
    graph's nodes)."""

    num_nodes: int


def shared_over(cache, spec: FeatureSpec, world_size: int, access_counts=None):
    """The communication layer over ``cache``: each rank owns the rows ``spec.owner`` gives it."""
    from lsm_gnn.comm import SharedCache, make_owner

    return SharedCache(cache, make_owner(spec.owner, _IdSpace(cache.num_rows), world_size,
                                         access_counts=access_counts),
                       exchange=None if spec.exchange == "auto" else spec.exchange)  # auto: LSM_GNN_EXCHANGE


def cached(storage, spec: FeatureSpec, dataset, device: torch.device, *, world_size: int = 1, fanouts=None,
           batch_size: int = 1024, seed: int = 0, num_threads: int = 0) -> Features:
    """The cache over ``storage`` (rows by ``dataset``'s node ids: a trainable embedding table), and with
    several ranks sharing, the communication layer over it."""
    return _group_cache(storage, spec, dataset, dataset.node_types[:1], device,
                        spec.size.bytes, world_size=world_size, fanouts=fanouts, batch_size=batch_size, seed=seed,
                        num_threads=num_threads)


def cache_over(storage, spec: FeatureSpec, static_scores, device: torch.device, num_threads: int = 0,
               capacity_bytes: int | None = None) -> SoftwareCache:
    """The cache ``spec`` describes in front of ``storage`` (``capacity_bytes`` replaces its size's bytes, for a
    share of it); the planner builds its simulated caches here too, so they are the run's."""
    # 100% means every row cached: N lines in hashed sets would leave rows of the fullest sets without a way
    num_sets = every_row_sets(storage.num_rows, spec.ways) if spec.size.every_row else None
    try:
        return SoftwareCache(storage, spec.size.bytes if capacity_bytes is None else capacity_bytes,
                             ways=spec.ways, num_sets=num_sets, policy=spec.policy, static_scores=static_scores,
                             oversubscribe=spec.oversubscribe, device=device, num_threads=num_threads, pvp=spec.pvp,
                             pvp_queue_capacity=spec.pvp_queue_capacity, pvp_queue_bytes=spec.pvp_queue_bytes,
                             pvp_reinstall=spec.pvp_reinstall, read_ahead=spec.read_ahead,
                             read_ahead_bytes=spec.read_ahead_bytes)
    except QueueBudgetTooSmall as exc:  # the spec came from config keys: name them, not the Python keyword
        raise ConfigError(f"cache.pvp_queue_bytes={spec.pvp_queue_bytes}: {exc}; or set "
                          "cache.pvp_queue_capacity (lines per queue)") from None


def feature_groups(dataset) -> list[list[str]]:
    """The dataset's featured node types grouped by row format (dim, dtype), in type order."""
    groups: dict[tuple, list[str]] = {}
    for t in dataset.feature_types:
        layout = dataset.node_type(t).features
        groups.setdefault((layout.dim, layout.dtype), []).append(t)
    return list(groups.values())


def split_capacity(capacity_bytes: int, weights: list[float]) -> list[int]:
    """The budget in proportion to ``weights`` (e.g. each group's measured share of accessed bytes)."""
    total = float(sum(weights))
    if total <= 0:
        raise ValueError(f"capacity weights must have a positive sum, got {weights}")
    return [int(capacity_bytes * w / total) for w in weights]


def build_node_embedding(spec: FeatureSpec, cfg: Config, dataset, path: str, device: torch.device, *, rank: int = 0,
                         world_size: int = 1, state: dict | None = None, barrier=lambda: None):
    """``model.node_embedding``: its table at ``path`` (made on a fresh start; opened at the generation
    ``state``, the resumed checkpoint's record, names), behind a write-back cache like the features' (same
    policy and victim buffer, sized by ``model.node_embedding.capacity``), shared over ranks like them."""
    from lsm_gnn.embedding import NodeEmbedding, RowLayout, RowOptimizer, open_table

    e = cfg.model.node_embedding
    if world_size > 1 and not (spec.source == "cache" and spec.shared):
        raise ConfigError("node embeddings over several ranks need one writer per row: set cache.features=cache and "
                          "cache.mode=shared (the owner of each row applies every rank's updates)")
    layout = RowLayout(e.dim, e.dtype, e.optimizer)
    table = open_table(path, layout, dataset.num_nodes, seed=cfg.train.seed, init_std=e.init_std, rank=rank,
                       world_size=world_size, generation=None if state is None else int(state["generation"]),
                       barrier=barrier, progress=cfg.log.progress)
    source, cache = table, None
    if spec.source == "cache":
        from lsm_gnn.sizing import check_one_set

        spec = dataclasses.replace(spec, size=spec.embedding_size)  # the features' cache settings, its own size
        try:
            check_one_set(spec, dataset, layout.row_bytes)
        except ConfigError:
            table.close()
            raise
        source = cached(table, spec, dataset, device, world_size=world_size, fanouts=cfg.sampler.fanouts,
                        batch_size=cfg.sampler.batch_size, seed=cfg.train.seed, num_threads=cfg.sampler.num_threads)
        cache = source.cache if spec.shared else source
    return NodeEmbedding(source, layout, RowOptimizer(layout, e.lr), table=table, cache=cache, world_size=world_size,
                         steps=0 if state is None else int(state["steps"]))
