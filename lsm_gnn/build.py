"""From a config to the feature path: resolved once, assembled in one place.

:func:`resolve` turns the config's cache section and the dataset into one
:class:`FeatureSpec` (capacity in bytes, the policy with ``auto`` decided,
PVP settings that agree with each other, the sharing mode); every check
that needs the dataset happens there and names its config key.
:func:`build_features` assembles storage -> cache -> communication from the
spec, one stack per row format of the graph's node types, and returns them
as one :class:`~lsm_gnn.features.TypedFeatures` (keyed by node type, a
graph of one node type's too). This is the only place that knows which concrete layers it
composes.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import numpy as np
import torch

from lsm_gnn import defaults
from lsm_gnn.cache import PolicyConfig, SoftwareCache, every_row_sets
from lsm_gnn.cache.pvp import QueueBudgetTooSmall
from lsm_gnn.config import (Config, ConfigError, NodeEmbeddingConfig, capacity_bytes_of, capacity_spec, policy_config,
                            read_ahead_depth, type_embedding)
from lsm_gnn.features import Features, FeatureGroup, TypedFeatures
from lsm_gnn.storage import open_storage
from lsm_gnn.units import round_up


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
    #: per node type with node embeddings, its table's cache (the features' policy and victim buffer, its own size)
    embedding_sizes: dict = dataclasses.field(default_factory=dict)
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
        shared=world_size > 1 and c.mode == "shared", owner=c.owner, embedding_sizes=_embedding_sizes(cfg, dataset),
        read_ahead=read_ahead_depth(c), read_ahead_bytes=c.read_ahead_bytes, exchange=c.exchange)


def embedding_tables(cfg: Config, dataset) -> dict[str, NodeEmbeddingConfig]:
    """The node embedding tables ``cfg`` asks for on ``dataset``: per node type, its settings
    (``model.node_embedding.<type>.*`` over the section's keys) with the table's directory filled in. On a graph of
    one node type that is the one table of ``model.node_embedding``; on a heterogeneous graph
    ``model.node_embedding.dim`` gives the types without features theirs, and a type's own ``dim`` adds or removes
    one (with features, the embedding follows them). Empty without node embeddings."""
    e = cfg.model.node_embedding
    unknown = sorted(set(e.types) - set(dataset.node_types))
    if unknown:
        raise ConfigError(f"model.node_embedding names node types {unknown}, which {dataset.path} does not have; its "
                          f"types are {dataset.node_types}")
    base = e.path or os.path.join(cfg.checkpoint.dir, "node_embedding")
    tables = {}
    for t in dataset.node_types:
        settings = type_embedding(e, t)
        if not dataset.is_homogeneous and "dim" not in e.types.get(t, {}) and t in dataset.feature_types:
            settings.dim = 0  # the section's dim is for the types without features
        if not settings.dim:
            continue
        if not settings.path:  # one table per type, each in a directory of its own
            settings.path = base if dataset.is_homogeneous else os.path.join(base, t)
        tables[t] = settings
    _refuse_shared_tables(tables)
    if tables and not dataset.is_homogeneous and not e.features:
        raise ConfigError("model.node_embedding.features=false takes a graph of one node type; on a heterogeneous "
                          "graph give the types to learn embeddings for (model.node_embedding.dim: every type "
                          "without features; model.node_embedding.<type>.dim: one type) and keep features=true")
    return tables


def _refuse_shared_tables(tables: dict[str, NodeEmbeddingConfig]) -> None:
    """Two node types whose paths lead to one directory (as spelled, relative, absolute or through a link) would
    read and update one table as if it were each one's own: refused whatever the types' sizes."""
    owner = {}
    for t, settings in tables.items():
        real = os.path.realpath(settings.path)
        if real in owner:
            first = owner[real]
            raise ConfigError(f"model.node_embedding.{first}.path ({tables[first].path}) and "
                              f"model.node_embedding.{t}.path ({settings.path}) are one directory, {real}: node types "
                              f"{first} and {t} would train one table together; give each type a path of its own")
        owner[real] = t


def _embedding_sizes(cfg: Config, dataset) -> dict[str, CacheSize]:
    """Each node embedding table's cache: its ``capacity`` of the table's rows, one per node of its type; by
    default :func:`fitting_size` (every batch fits)."""
    from lsm_gnn.embedding import RowLayout
    from lsm_gnn.sizing import working_set_bound

    tables = embedding_tables(cfg, dataset)
    bound = working_set_bound(cfg, dataset) if not all(e.capacity for e in tables.values()) else None
    sizes = {}
    for t, e in tables.items():
        # a typed graph's tables are sized (and advice given) per type, whether or not the type sets its own
        key = "model.node_embedding" if dataset.is_homogeneous else f"model.node_embedding.{t}"
        try:
            row_bytes = RowLayout(e.dim, e.dtype, e.optimizer).row_bytes
        except ValueError as exc:
            raise ConfigError(f"{key}: {exc}") from None
        if e.capacity:
            size = CacheSize.of(e.capacity, f"{key}.capacity", dataset.num_nodes_of(t), row_bytes)
        else:
            size = fitting_size(cfg.cache.capacity, f"{key}.capacity", dataset.num_nodes_of(t), row_bytes, bound,
                                cfg.cache.ways)
        if not dataset.is_homogeneous:  # one set at least, as each feature group's cache (a small type's share)
            size = dataclasses.replace(size, bytes=max(size.bytes, min(cfg.cache.ways, dataset.num_nodes_of(t))
                                                       * row_bytes))
        sizes[t] = size
    return sizes


def fitting_size(capacity: str, key: str, num_rows: int, row_bytes: int, batch_rows: int | None,
                 ways: int) -> CacheSize:
    """``capacity`` of ``num_rows`` rows, raised to the whole sets that hold ``batch_rows`` (the most rows one
    batch reads; None: no bound, every row), at most every row: a cache no batch overflows, never larger than
    its table needs."""
    size = CacheSize.of(capacity, key, num_rows, row_bytes)
    if batch_rows is None or batch_rows >= num_rows:
        return CacheSize.of("100%", key, num_rows, row_bytes)
    fitting = -(-max(batch_rows, ways) // ways) * ways * row_bytes
    if fitting <= size.bytes:
        return size
    return CacheSize(f"{round_up(100 * fitting / (num_rows * row_bytes)):g}%", key, fitting, False)


def _row_bytes(features_of) -> int:
    return features_of.feature_dim * features_of.feature_dtype.itemsize


def build_features(spec: FeatureSpec, dataset, device: torch.device, *, world_size: int = 1,
                   weights: list[float] | None = None, fanouts=None, batch_size: int = 1024, seed: int = 0,
                   num_threads: int = 0) -> TypedFeatures:
    """The graph's features as ``spec`` says: per row format one storage over its types' files, then the
    cache over it, then with several ranks sharing the communication layer over the cache, keyed by node
    type (a graph of one node type's too).

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
        capacities = group_capacities(spec, dataset, groups, weights, fanouts, batch_size, seed)
    built = []
    for types, capacity in zip(groups, capacities):
        storage = _group_storage(spec, dataset, types, device)
        features = storage
        if spec.source == "cache":
            features = _group_cache(storage, spec, dataset, types, device, capacity, world_size=world_size,
                                    fanouts=fanouts, batch_size=batch_size, seed=seed, num_threads=num_threads)
        built.append(FeatureGroup(types, group_offsets(storage, types), features))
    return TypedFeatures(built)


def group_offsets(storage, types: list[str]) -> dict[str, int]:
    """The first id of each of ``types`` in the id space of ``storage``, their group's (one type: its own ids;
    several: a :class:`~lsm_gnn.storage.concat.ConcatStorage` of them)."""
    return {t: storage.offset(t) for t in types} if len(types) > 1 else {types[0]: 0}


def group_capacities(spec: FeatureSpec, dataset, groups: list[list[str]], weights=None, fanouts=None,
                     batch_size: int = 1024, seed: int = 0) -> list[int]:
    """Each feature group's share of the cache budget, at least one set of lines however rare its rows are
    (a cache needs one): what :func:`build_features` gives each group's cache (the planner sizes its replayed
    caches here too, so they are the run's)."""
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
    if backend == "pinned" and torch.device(device).type != "cuda":
        raise ConfigError(f"cache.backend=pinned holds the features in page-locked host memory for a GPU to read, "
                          f"but training runs on {device} (torch.cuda.is_available() is "
                          f"{torch.cuda.is_available()}); on the CPU use cache.backend=memory or a disk backend")
    # gds and pinned read to the training device, where the cache is
    where = {"device": device} if backend in ("gds", "pinned") else {}
    if len(types) == 1:
        return open_storage(dataset.node_type(types[0]), backend, **where)
    from lsm_gnn.storage.concat import ConcatStorage

    return ConcatStorage([open_storage(dataset.node_type(t), backend, **where) for t in types], types)


def _group_cache(storage, spec: FeatureSpec, dataset, types: list[str], device: torch.device, capacity: int, *,
                 world_size: int, fanouts, batch_size: int, seed: int, num_threads: int) -> Features:
    """The cache over one group's ``storage`` with ``capacity`` bytes and, with several ranks sharing, the
    communication layer over it."""
    cache = cache_over(storage, spec, group_scores(spec, dataset, types), device, num_threads, capacity)
    if not spec.shared:
        return cache
    return shared_over(cache, spec, world_size, access_counts=lambda: _sampled_counts(
        dataset, fanouts, batch_size, seed))


def group_scores(spec: FeatureSpec, dataset, types: list[str]):
    """The static scores that rank the lines of the cache over ``types`` (one id space), or None."""
    if spec.static_score is None:
        return None
    if len(types) == 1:
        return dataset.score(spec.static_score, types[0])
    return np.concatenate([np.asarray(dataset.score(spec.static_score, t)) for t in types])


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


def cached(storage, spec: FeatureSpec, dataset, device: torch.device, *, node_type: str | None = None,
           world_size: int = 1, fanouts=None, batch_size: int = 1024, seed: int = 0, num_threads: int = 0) -> Features:
    """The cache over ``storage`` (rows by the node ids of ``node_type``, default the graph's first: a trainable
    embedding table), and with several ranks sharing, the communication layer over it. A node type without the
    static score (a type without features: converters score the featured ones) is ranked by the window alone."""
    node_type = node_type or dataset.node_types[0]
    if spec.static_score is not None and spec.static_score not in dataset.score_names(node_type):
        spec = dataclasses.replace(spec, static_score=None)
    return _group_cache(storage, spec, dataset, [node_type], device,
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


def embedding_cache_spec(spec: FeatureSpec, dataset, node_type: str, row_bytes: int) -> FeatureSpec:
    """The spec of the cache over ``node_type``'s node embedding table (rows of ``row_bytes``): the features'
    settings (policy, victim buffer, window) at the table's own size, refused below one set as the features' are.
    The run builds its table's cache from it with :func:`cached`, and the planner its replayed one."""
    from lsm_gnn.sizing import check_one_set

    spec = dataclasses.replace(spec, size=spec.embedding_sizes[node_type])
    check_one_set(spec, dataset, row_bytes)
    return spec


def build_node_embedding(spec: FeatureSpec, cfg: Config, dataset, node_type: str, device: torch.device, *,
                         rank: int = 0, world_size: int = 1, state: dict | None = None, path: str | None = None,
                         barrier=lambda: None):
    """The node embeddings of ``node_type`` (:func:`embedding_tables` gives their settings): the table at its path
    (``path`` instead: a checkpoint's copy of it), made on a fresh start, opened at the generation ``state`` (the
    resumed checkpoint's record) names, behind a write-back cache like the features' (same policy and victim
    buffer, sized by its ``capacity``), shared over ranks like them."""
    from lsm_gnn.embedding import NodeEmbedding, RowLayout, RowOptimizer, open_table

    e = embedding_tables(cfg, dataset)[node_type]
    if world_size > 1 and not (spec.source == "cache" and spec.shared):
        raise ConfigError("node embeddings over several ranks need one writer per row: set cache.features=cache and "
                          "cache.mode=shared (the owner of each row applies every rank's updates)")
    layout = RowLayout(e.dim, e.dtype, e.optimizer)
    # each type's table its own random rows (the first type's as a one-type graph's always were)
    seed = cfg.train.seed + 1_000_003 * dataset.node_types.index(node_type)
    table = open_table(path or e.path, layout, dataset.num_nodes_of(node_type), seed=seed, init_std=e.init_std,
                       rank=rank, world_size=world_size,
                       generation=None if state is None else int(state["generation"]), barrier=barrier,
                       progress=cfg.log.progress)
    source, cache = table, None
    if spec.source == "cache":
        try:
            spec = embedding_cache_spec(spec, dataset, node_type, layout.row_bytes)
        except ConfigError:
            table.close()
            raise
        source = cached(table, spec, dataset, device, node_type=node_type, world_size=world_size,
                        fanouts=cfg.sampler.fanouts, batch_size=cfg.sampler.batch_size, seed=cfg.train.seed,
                        num_threads=cfg.sampler.num_threads)
        cache = source.cache if spec.shared else source
    return NodeEmbedding(source, layout, RowOptimizer(layout, e.lr), table=table, cache=cache, world_size=world_size,
                         steps=0 if state is None else int(state["steps"]),
                         node_type=None if dataset.is_homogeneous else node_type)
