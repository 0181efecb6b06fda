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
from lsm_gnn.cache import PolicyConfig, SoftwareCache, cache_sets
from lsm_gnn.cache.geometry import one_set_lines
from lsm_gnn.cache.pvp import QueueBudgetTooSmall
from lsm_gnn.config import (Config, ConfigError, NodeEmbeddingConfig, capacity_bytes_of, capacity_spec, policy_config,
                            read_ahead_depth, type_embedding)
from lsm_gnn.features import Features, FeatureGroup, TypedFeatures
from lsm_gnn.sizing import set_at_least
from lsm_gnn.storage import open_storage
from lsm_gnn.utils.units import round_up


class CacheUnderOneSet(ConfigError):
    """A size that gives a cache fewer lines than one set (``bytes``: that cache's, or a budget's that cannot give
    each of its caches one); the message names its config key and the size that makes one."""

    def __init__(self, message: str, bytes: int):
        super().__init__(message)
        self.bytes = bytes


@dataclass(frozen=True)
class CacheSize:
    """One cache's size, resolved once: as the user wrote it (``text``, in config key ``key``, which errors
    name and fixes are given in), in bytes, and the sets of ``cache.ways`` lines the cache is built with. Every
    cache a run builds reads its own (:func:`resolve`); ``sets`` is None only for a typed graph's ``cache.capacity``,
    a budget its feature groups' caches share."""

    text: str                    # "10%" (of the rows it caches) or "4G"
    key: str                     # cache.capacity | model.node_embedding[.<type>].capacity
    bytes: int                   # this cache's bytes (a feature group's: its share of the key's)
    sets: int | None             # geometry.cache_sets: 100% gets the sets that hold every row

    @classmethod
    def of(cls, text: str, key: str, num_rows: int, row_bytes: int, ways: int, *, bytes: int | None = None,
           every_row: bool | None = None) -> CacheSize:
        """The cache of ``text`` (``bytes``, where the caller sized it) over ``num_rows`` rows of ``row_bytes``;
        ``every_row`` (default: ``text`` is 100%) caches every row. The floor rule of every cache: one set at least
        (``ways`` lines, or every row of a smaller table), never raised to it: under it a ConfigError names
        ``key`` and the size that makes one."""
        kind, value = capacity_spec(text)
        if bytes is None:
            bytes = capacity_bytes_of(kind, value, num_rows, row_bytes)
            every_row = (kind, value) == ("share", 1) if every_row is None else every_row
        sets = cache_sets(bytes, row_bytes, ways, num_rows, bool(every_row))
        if sets < 1:
            raise CacheUnderOneSet(f"{key}={text} is {bytes // row_bytes} lines of {row_bytes} bytes, fewer than one "
                                   f"set of cache.ways={ways}; "
                                   + set_at_least(text, key, bytes // row_bytes, ways, row_bytes), bytes)
        return cls(str(text), key, bytes, sets)

    @classmethod
    def budget(cls, text: str, key: str, num_rows: int, row_bytes: int) -> CacheSize:
        """``text`` of ``num_rows`` rows of ``row_bytes`` in bytes, shared by several caches (no sets of its own)."""
        return cls(str(text), key, capacity_bytes_of(*capacity_spec(text), num_rows, row_bytes), None)


@dataclass(frozen=True)
class FeatureSpec:
    """The resolved feature path of a run."""

    source: str                  # cache | storage (no cache) | memory (the whole file in RAM) | device (on the GPU)
    backend: str                 # storage backend of the miss path ("auto": io_uring where it works)
    size: CacheSize              # cache.capacity: the features' cache, or on a typed graph the budget its groups share
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
    #: per feature group (build.feature_groups), its cache; empty where no features' cache is built
    feature_sizes: tuple = ()
    #: per node type with node embeddings, its table's cache (the features' policy and victim buffer, its own size);
    #: empty where no cache is built
    embedding_sizes: dict = dataclasses.field(default_factory=dict)
    read_ahead: int | None = None  # batches whose misses are read ahead (None: the cache's default)
    read_ahead_bytes: str = defaults.READ_AHEAD_BYTES  # the rows read ahead held at once
    exchange: str = "auto"       # how rows travel between ranks when shared: auto | shm | collective


def resolve(cfg: Config, dataset, world_size: int = 1, *, features: bool = True) -> FeatureSpec:
    """The feature path ``cfg`` asks for on ``dataset`` with ``world_size`` ranks, with one :class:`CacheSize` per
    cache the run builds (each feature group's, each node embedding table's); raises ConfigError, naming the key
    of a cache under one set. For a heterogeneous dataset a capacity in % is that share of all its feature rows'
    bytes, split between its feature groups (:func:`group_sizes`). ``features=False``: the caller brings its own
    features (no features' cache is sized)."""
    c = cfg.cache
    static = None if c.static_score == "none" else c.static_score
    names = sorted(set.intersection(*(set(dataset.score_names(t)) for t in dataset.feature_types)))
    one_type = one_type_keys(dataset)
    if one_type:
        rows, row_bytes = dataset.num_nodes, _row_bytes(dataset)
    else:  # a share of the bytes of every type's rows: "rows" of one byte each
        rows = sum(dataset.num_nodes_of(t) * _row_bytes(dataset.node_type(t)) for t in dataset.feature_types)
        row_bytes = 1
    if c.features == "cache" and static is not None and static not in names:
        raise ConfigError(f"cache.static_score={static!r} is not in the dataset (it has "
                          f"{names or 'no scores'}); prepare it with 'lsm-gnn prepare scores' or set "
                          "cache.static_score=none")
    cached = c.features == "cache"
    size = CacheSize.budget(c.capacity, "cache.capacity", rows, row_bytes)
    feature_sizes = _feature_sizes(cfg, dataset, size) if cached and features and cfg.model.node_embedding.features \
        else ()
    if one_type and feature_sizes:  # the budget is the one cache's
        size = feature_sizes[0]
    return FeatureSpec(
        source=c.features, backend=c.backend, size=size, feature_sizes=feature_sizes, ways=c.ways,
        policy=policy_config(c), static_score=static, oversubscribe=c.oversubscribe, pvp=c.pvp,
        pvp_queue_capacity=c.pvp_queue_capacity or None,
        # The default budget left as None: the cache then gives each queue at least one line, as it does for a
        # default, where a figure the user gave that holds none is refused.
        pvp_queue_bytes=None if c.pvp_queue_capacity or c.pvp_queue_bytes == defaults.PVP_QUEUE_BYTES
        else c.pvp_queue_bytes, pvp_reinstall=c.pvp and c.pvp_reinstall,
        shared=world_size > 1 and c.mode == "shared", owner=c.owner,
        embedding_sizes=_embedding_sizes(cfg, dataset, cached),
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
        settings, name = type_embedding(e, t), table_name(dataset, t)
        if name is not None and "dim" not in e.types.get(t, {}) and t in dataset.feature_types:
            settings.dim = 0  # a typed graph's section dim is for the types without features
        if not settings.dim:
            continue
        if not settings.path:  # one table per type, each in a directory of its own
            settings.path = base if name is None else os.path.join(base, name)
        tables[t] = settings
    _refuse_shared_tables(tables)
    return tables


def one_type_keys(dataset) -> bool:
    """Whether ``dataset``'s config keys are a graph of one node type's, the sections its one cache's and table's:
    ``cache.capacity`` its features' cache (a share of its rows), ``model.node_embedding`` its table (the section's
    ``dim`` its own). On a typed graph ``cache.capacity`` is a budget of bytes its feature groups share and a table
    is ``model.node_embedding.<type>``. The config's one-type edge."""
    return dataset.is_homogeneous


def table_name(dataset, node_type: str) -> str | None:
    """What ``node_type``'s node embedding table is named by in config keys (:func:`table_key`), its directory
    and its checkpoint's files: nothing on a graph of one node type (its table is ``model.node_embedding``'s
    own), its node type on a typed graph."""
    return None if one_type_keys(dataset) else node_type


def cache_label(dataset, types) -> str | None:
    """What messages call the features' cache over node ``types``: nothing on a graph of one node type (its one
    cache, "the cache", is ``cache.capacity``'s), the types joined by "+" on a typed graph."""
    return None if one_type_keys(dataset) else "+".join(types)


def embedding_cache_name(dataset, node_type: str) -> str:
    """What messages call ``node_type``'s node embedding table's cache (named as the table is,
    :func:`table_name`)."""
    name = table_name(dataset, node_type)
    return "the node embeddings' cache" if name is None else f"the {name} node embeddings' cache"


def table_key(dataset, node_type: str) -> str:
    """The config key of ``node_type``'s node embedding table: ``model.node_embedding`` on a graph of one node
    type, ``model.node_embedding.<type>`` on a typed graph."""
    name = table_name(dataset, node_type)
    return "model.node_embedding" if name is None else f"model.node_embedding.{name}"


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


def _embedding_sizes(cfg: Config, dataset, cached: bool) -> dict[str, CacheSize]:
    """Each node embedding table's cache (none unless ``cached``, but every table's settings checked): its
    ``capacity`` of the table's rows, one per node of its type; by default :func:`fitting_size` (every batch
    fits)."""
    from lsm_gnn.embedding import RowLayout
    from lsm_gnn.sizing import working_set_bound

    tables = embedding_tables(cfg, dataset)
    bound = working_set_bound(cfg, dataset) if cached and not all(e.capacity for e in tables.values()) else None
    sizes = {}
    for t, e in tables.items():
        # a typed graph's tables are sized (and advice given) per type, whether or not the type sets its own
        key = table_key(dataset, t)
        try:
            row_bytes = RowLayout(e.dim, e.dtype, e.optimizer).row_bytes
        except ValueError as exc:
            raise ConfigError(f"{key}: {exc}") from None
        if cached:
            sizes[t] = CacheSize.of(e.capacity, f"{key}.capacity", dataset.num_nodes_of(t), row_bytes,
                                    cfg.cache.ways) if e.capacity else \
                fitting_size(cfg.cache.capacity, f"{key}.capacity", dataset.num_nodes_of(t), row_bytes, bound,
                             cfg.cache.ways)
    return sizes


def fitting_size(capacity: str, key: str, num_rows: int, row_bytes: int, batch_rows: int | None,
                 ways: int) -> CacheSize:
    """``capacity`` of ``num_rows`` rows, raised to the whole sets that hold ``batch_rows`` (the most rows one
    batch reads; None: no bound, every row), at most every row: a cache no batch overflows, never larger than
    its table needs (a default, so raising it grows no size the user gave)."""
    if batch_rows is None or batch_rows >= num_rows:
        return CacheSize.of("100%", key, num_rows, row_bytes, ways)
    fitting = -(-max(batch_rows, ways) // ways) * ways * row_bytes
    kind, value = capacity_spec(capacity)
    if fitting <= capacity_bytes_of(kind, value, num_rows, row_bytes):
        return CacheSize.of(capacity, key, num_rows, row_bytes, ways)
    return CacheSize.of(f"{round_up(100 * fitting / (num_rows * row_bytes)):g}%", key, num_rows, row_bytes, ways,
                        bytes=fitting, every_row=False)


def _feature_sizes(cfg: Config, dataset, budget: CacheSize) -> tuple[CacheSize, ...]:
    """Each feature group's cache: ``budget`` split by the bytes the run's sampled batches gather from each."""
    from lsm_gnn.tasks.options import relation_fanouts

    groups = feature_groups(dataset)
    if not groups:  # build_features refuses it
        return ()
    weights = group_weights(dataset, groups, relation_fanouts(cfg, dataset), cfg.sampler.batch_size, cfg.train.seed)
    return group_sizes(dataset, groups, budget, cfg.cache.ways, weights)


def group_weights(dataset, groups: list[list[str]], fanouts=None, batch_size: int = 1024, seed: int = 0
                  ) -> list[int]:
    """What splits a cache budget between several feature groups: given ``fanouts``, the bytes batches of
    ``batch_size`` seeds sampled with them gather from each group (the measured access mix), else (or where they
    gather nothing) each group's feature bytes."""
    if len(groups) > 1 and fanouts is not None:
        from lsm_gnn.sampling.hotness import sampled_type_accesses

        rows = sampled_type_accesses(dataset, fanouts, batch_size, seed=seed)
        weights = [sum(rows[t] * _row_bytes(dataset.node_type(t)) for t in types) for types in groups]
        if sum(weights) > 0:
            return weights
    return [sum(dataset.num_nodes_of(t) * _row_bytes(dataset.node_type(t)) for t in types) for types in groups]


def group_sizes(dataset, groups: list[list[str]], budget: CacheSize, ways: int, weights: list) -> tuple[CacheSize, ...]:
    """Each feature group's cache: its share of ``budget`` by ``weights``, one set at least however rare its rows
    are, out of the others' shares, never beyond the budget: a budget too small for one set in each group's cache
    is refused, naming its key. What :func:`build_features` builds and the planner replays."""
    rows = [sum(dataset.num_nodes_of(t) for t in types) for types in groups]
    row_bytes = [_row_bytes(dataset.node_type(types[0])) for types in groups]
    floors = [one_set_lines(n, ways) * b for n, b in zip(rows, row_bytes)] if len(groups) > 1 else None
    shares = split_capacity(budget.bytes, weights, floors)
    if sum(shares) > budget.bytes:
        each = ", ".join(f"{'+'.join(types)}: {floor:,}" for types, floor in zip(groups, floors))
        raise CacheUnderOneSet(f"{budget.key}={budget.text} is {budget.bytes:,} bytes, less than one set of "
                               f"cache.ways={ways} lines in each of its {len(groups)} feature caches (one per row "
                               f"format; bytes of one set: {each}); "
                               + set_at_least(budget.text, budget.key, budget.bytes, sum(floors), 1), budget.bytes)
    every_row = capacity_spec(budget.text) == ("share", 1)
    return tuple(CacheSize.of(budget.text, budget.key, n, b, ways, bytes=share, every_row=every_row)
                 for n, b, share in zip(rows, row_bytes, shares))


def _row_bytes(features_of) -> int:
    return features_of.feature_dim * features_of.feature_dtype.itemsize


def build_features(spec: FeatureSpec, dataset, device: torch.device, *, world_size: int = 1, fanouts=None,
                   batch_size: int = 1024, seed: int = 0, num_threads: int = 0) -> TypedFeatures:
    """The graph's features as ``spec`` says: per row format one storage over its types' files, then the
    cache over it (its size ``spec.feature_sizes``' of the group), then with several ranks sharing the
    communication layer over the cache, keyed by node type (a graph of one node type's too). ``fanouts``,
    ``batch_size`` and ``seed`` pre-sample accesses for hotness ownership (only that owner samples them).
    """
    groups = feature_groups(dataset)
    if not groups:
        raise ConfigError(f"dataset {dataset.path} has no node type with features; nothing to gather")
    if spec.source == "device" and len(dataset.feature_types) > 1:
        raise ConfigError("cache.features=device holds one feature table on the GPU; a dataset with several node "
                          "types with features needs cache.features=cache or memory")
    if spec.source == "cache" and len(spec.feature_sizes) != len(groups):
        raise ValueError(f"the spec sizes {len(spec.feature_sizes)} feature caches, the dataset has {len(groups)} "
                         "row formats: resolve() sizes them (or group_sizes())")
    built = []
    for g, types in enumerate(groups):
        storage = _group_storage(spec, dataset, types, device)
        features = storage
        if spec.source == "cache":
            features = _group_cache(storage, spec, dataset, types, device, spec.feature_sizes[g],
                                    world_size=world_size, fanouts=fanouts, batch_size=batch_size, seed=seed,
                                    num_threads=num_threads)
        built.append(FeatureGroup(types, group_offsets(storage, types), features))
    return TypedFeatures(built)


def group_offsets(storage, types: list[str]) -> dict[str, int]:
    """The first id of each of ``types`` in the id space of ``storage``, their group's (one type: its own ids;
    several: a :class:`~lsm_gnn.storage.concat.ConcatStorage` of them)."""
    return {t: storage.offset(t) for t in types} if len(types) > 1 else {types[0]: 0}


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


def _group_cache(storage, spec: FeatureSpec, dataset, types: list[str], device: torch.device, size: CacheSize, *,
                 world_size: int, fanouts, batch_size: int, seed: int, num_threads: int) -> Features:
    """The cache of ``size`` over one group's ``storage`` and, with several ranks sharing, the communication
    layer over it."""
    cache = cache_over(storage, spec, size, group_scores(spec, dataset, types), device, num_threads)
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


def check_owner(owner: str, dataset) -> None:
    """Refuses ``cache.owner=hotness`` on a typed graph: its accesses are counted over one id space, a graph of
    one node type's."""
    if owner == "hotness" and not dataset.is_homogeneous:
        raise ConfigError(f"cache.owner=hotness is not available for heterogeneous datasets yet ({dataset.path} has "
                          f"{len(dataset.node_types)} node types); use cache.owner=hashed")


def _sampled_counts(dataset, fanouts, batch_size: int, seed: int):
    """Per node, its accesses over pre-sampled batches (what hotness ownership ranks nodes by)."""
    check_owner("hotness", dataset)
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
    embedding table, its size ``spec.size``: :func:`embedding_cache_spec`), and with several ranks sharing, the communication layer over it. A node type without the
    static score (a type without features: converters score the featured ones) is ranked by the window alone."""
    node_type = node_type or dataset.node_types[0]
    if spec.static_score is not None and spec.static_score not in dataset.score_names(node_type):
        spec = dataclasses.replace(spec, static_score=None)
    return _group_cache(storage, spec, dataset, [node_type], device,
                        spec.size, world_size=world_size, fanouts=fanouts, batch_size=batch_size, seed=seed,
                        num_threads=num_threads)


def cache_over(storage, spec: FeatureSpec, size: CacheSize, static_scores, device: torch.device,
               num_threads: int = 0) -> SoftwareCache:
    """The cache ``spec`` describes in front of ``storage``, with ``size``'s sets (a cache :func:`resolve` sized);
    the planner builds its simulated caches here too, so they are the run's."""
    try:
        return SoftwareCache(storage, ways=spec.ways, num_sets=size.sets, sized_by=size.key, policy=spec.policy,
                             static_scores=static_scores, oversubscribe=spec.oversubscribe, device=device,
                             num_threads=num_threads, pvp=spec.pvp, pvp_queue_capacity=spec.pvp_queue_capacity,
                             pvp_queue_bytes=spec.pvp_queue_bytes, pvp_reinstall=spec.pvp_reinstall,
                             read_ahead=spec.read_ahead, read_ahead_bytes=spec.read_ahead_bytes)
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


def split_capacity(capacity_bytes: int, weights: list[float], floors: list[int] | None = None) -> list[int]:
    """The budget in proportion to ``weights`` (e.g. each group's measured share of accessed bytes). With
    ``floors``, a part whose share is under its floor gets its floor, taken from the others' shares (theirs split
    again by weight); a budget under the floors' sum gives them all their floors, which the caller refuses."""
    total = float(sum(weights))
    if total <= 0:
        raise ValueError(f"capacity weights must have a positive sum, got {weights}")
    fixed: dict[int, int] = {}
    while True:
        free = [i for i in range(len(weights)) if i not in fixed]
        left, weight = capacity_bytes - sum(fixed.values()), float(sum(weights[i] for i in free))
        shares = {i: int(left * weights[i] / weight) if weight > 0 else 0 for i in free}
        low = [i for i in free if floors is not None and shares[i] < floors[i]]
        if not low:
            return [fixed[i] if i in fixed else shares[i] for i in range(len(weights))]
        fixed.update((i, floors[i]) for i in low)


def embedding_cache_spec(spec: FeatureSpec, node_type: str) -> FeatureSpec:
    """The spec of the cache over ``node_type``'s node embedding table: the features' settings (policy, victim
    buffer, window) at the table's own size (``spec.embedding_sizes``). The run builds its table's cache from it
    with :func:`cached`, and the planner its replayed one."""
    return dataclasses.replace(spec, size=spec.embedding_sizes[node_type])


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
        spec = embedding_cache_spec(spec, node_type)
        source = cached(table, spec, dataset, device, node_type=node_type, world_size=world_size,
                        fanouts=cfg.sampler.fanouts, batch_size=cfg.sampler.batch_size, seed=cfg.train.seed,
                        num_threads=cfg.sampler.num_threads)
        cache = source.cache if spec.shared else source
    return NodeEmbedding(source, layout, RowOptimizer(layout, e.lr), table=table, cache=cache, world_size=world_size,
                         steps=0 if state is None else int(state["steps"]),
                         node_type=table_name(dataset, node_type))
