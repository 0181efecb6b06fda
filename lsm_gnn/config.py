"""Run configuration: a typed schema, YAML files and ``key=value`` overrides.

A config is nested dataclasses, so the valid keys, their types and their
defaults live in one place; an unknown key or a value of the wrong kind
raises :class:`ConfigError` naming the key and listing what is valid.

    cfg = load_config("configs/demo.yaml", ["cache.policy=rr", "train.epochs=2"])
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import os
import typing
from dataclasses import dataclass, field

import yaml

from lsm_gnn import defaults
from lsm_gnn.cache.policies import POLICIES, PolicyConfig
from lsm_gnn.cache.pvp import queue_budget
from lsm_gnn.comm.shm import EXCHANGES
from lsm_gnn.storage import BACKENDS
from lsm_gnn.utils.units import parse_bytes


class ConfigError(ValueError):
    """A config key or value is invalid; the message names it and the valid choices."""


@dataclass
class NodeEmbeddingConfig:
    """Trainable per-node embeddings in an on-disk table, read and updated through the cache (docs/embeddings.md)."""

    dim: int = 0               # 0: none; else each node's embedding has this many values
    dtype: str = "float32"     # float32 | float16: how the embedding is stored (optimizer state is float32)
    optimizer: str = "adagrad"  # sgd | adagrad | adam: sparse and row-wise, only the batch's rows change
    lr: float = 0.01
    init_std: float = 0.1      # initial values ~ N(0, init_std^2), seeded by train.seed
    features: bool = True      # also feed the dataset's features (before the embedding); false: embeddings only
    # the table's cache: bytes ("1G") or a share of its rows ("10%"); "": cache.capacity, raised to the most rows a
    # batch can read (seeds x prod(1 + fanout), every row with a fanout of -1), at most the whole table
    capacity: str = ""
    path: str = ""             # the table's directory; "": checkpoint.dir/node_embedding
    # A heterogeneous graph's node types, each its own table: model.node_embedding.<type>.<key> (dim, dtype,
    # optimizer, lr, init_std, capacity, path); the keys above are every type's defaults, and dim goes to the
    # types without features unless a type says otherwise (docs/hetero.md)
    types: dict = field(default_factory=dict)


#: what model.node_embedding.<type> may set: a table's own settings (features is the model's, one for all types)
TYPE_EMBEDDING_KEYS = ("dim", "dtype", "optimizer", "lr", "init_std", "capacity", "path")


@dataclass
class ModelConfig:
    kind: str = "gat"          # gat | sage | gcn | lightgcn (link task, node embeddings only)
    hidden: int = 512
    heads: int = 4             # GAT only
    dropout: float = 0.0
    node_embedding: NodeEmbeddingConfig = field(default_factory=NodeEmbeddingConfig)


@dataclass
class SamplerConfig:
    fanouts: list = field(default_factory=lambda: list(defaults.FANOUTS))  # one per layer, outermost last; -1 = all
    # Heterogeneous datasets: fanouts of single relations ("src__name__dst": [...]); the others take fanouts.
    relation_fanouts: dict = field(default_factory=dict)
    batch_size: int = defaults.BATCH_SIZE
    num_threads: int = 0       # 0: OpenMP's default
    # how the sampler reads a memory-mapped topology: auto (preload one that takes at most a quarter of the
    # memory left, else random) | random (no read-around: a topology far larger than memory) | normal |
    # preload (a copy in memory, on huge pages)
    topology: str = "auto"


@dataclass
class CacheConfig:
    # cache | storage (no cache) | memory (whole file in RAM: the ceiling) | device (the whole file on the GPU)
    features: str = "cache"
    capacity: str = defaults.CAPACITY  # bytes ("4G", "512M") or a share of the nodes ("1.5%")
    ways: int = defaults.WAYS
    policy: str = "auto"       # auto: farthest, the best measured with or without pvp (docs/cache.md)
    window: int = defaults.WINDOW  # future mini-batches sampled ahead
    period: int = defaults.PERIOD  # window scan every `period` iterations
    backend: str = "auto"      # storage backend of the miss path
    static_score: str = "reverse_pagerank"  # a score stored in the dataset, or "none"
    oversubscribe: bool = False  # allow a batch larger than the cache (hit ratio studies)
    mode: str = "shared"       # with several ranks: shared (one cache over all ranks) | isolated (one per rank)
    owner: str = "hashed"      # who owns a node in shared mode: hashed | modulo | hotness | path/to/partition.npy
    # how a shared cache's rows travel between ranks over gloo: auto (through shared memory where every rank
    # sees the same /dev/shm, else in the rows collective) | shm (shared memory or an error) | collective;
    # auto defers to LSM_GNN_EXCHANGE where it is set
    exchange: str = "auto"
    pvp: bool = False          # the victim-buffer prefetcher (paper section 4.3)
    pvp_queue_bytes: str = defaults.PVP_QUEUE_BYTES  # all victim queues' memory: bytes ("256M") or a share of
    # the cache's bytes ("25%"); the queues (one per future iteration) get as many lines each as fit
    pvp_queue_capacity: int = 0  # lines per victim queue instead (0: sized by pvp_queue_bytes)
    pvp_reinstall: bool = True  # with pvp: served lines go back into the cache (False: the paper's bypass)
    # batches ahead whose misses are read while the loader does the rest: auto (2 where misses come from a
    # disk, with the cache on the CPU or a GPU, else 0) or a number (0: off); read_ahead_bytes bounds the rows held
    # (auto: 64M, or an eighth of the memory available at the start where that is less)
    read_ahead: str = "auto"
    read_ahead_bytes: str = defaults.READ_AHEAD_BYTES


@dataclass
class EarlyStoppingConfig:
    metric: str = "auto"       # split.metric that picks best.pt and stops the run, e.g. val.accuracy, val.recall@20;
    # auto: the task's first metric on val (none without a val split)
    patience: int = 0          # stop after this many evaluations without improvement (0: never stop early)
    mode: str = "auto"         # max | min | auto (min for a metric named loss, else max)
    min_delta: float = 0.0     # an improvement must exceed this


@dataclass
class TrainConfig:
    task: str = "node"         # node (classification) | link (prediction, BPR)
    epochs: int = 1
    lr: float = 0.001
    weight_decay: float = 0.0
    seed: int = 0
    max_iterations: int = 0    # stop after this many iterations in all (0: no limit)
    eval_batch_size: int = 0   # 0: sampler.batch_size (a larger one must still fit the cache)
    eval_splits: list = field(default_factory=lambda: ["val", "test"])
    eval_every: int = 0        # also evaluate every N iterations (0: at epoch ends only)
    eval_every_epochs: int = 1  # evaluate after every N-th epoch (0: never at epoch ends); the last always is
    eval_mode: str = "sampled"  # sampled (train.eval_fanouts) | full (every neighbour, layer by layer; node task)
    # sampled evaluation's fanouts, one per layer, for every relation ([]: sampler.fanouts); more neighbours
    # than training's make evaluations steadier from one to the next
    eval_fanouts: list = field(default_factory=list)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    num_negatives: int = 1     # link: negative items per positive edge
    negatives_exclude_positives: bool = False  # link: draw negatives only among the user's non-training items
    # link with node embeddings: L2 on the batch's own rows of the table, as LightGCN's loss has it (its 1e-4):
    # embedding_l2 x (|e_user|^2 + |e_pos|^2 + mean over negatives |e_neg|^2) / 2, averaged over the batch
    embedding_l2: float = 0.0
    device: str = "auto"       # auto | cpu | cuda
    threads: int = 0           # torch's threads for the training step (0: one fewer than torch's default, >= 1)


@dataclass
class CheckpointConfig:
    dir: str = ""              # "" disables checkpoints
    every: int = 0             # also every N iterations (0: at the end of each epoch only)
    resume: bool = True        # continue from dir/last.pt when it exists
    # with model.node_embedding: best.pt keeps a copy of the table as it was at the best evaluation (the
    # table's size on disk, written at each improvement); false: no best.pt with node embeddings
    best_table: bool = True


@dataclass
class LogConfig:
    dir: str = ""              # JSON-lines metrics go to dir/metrics.jsonl ("" disables)
    progress: bool = True      # a tqdm progress bar, on a terminal only
    tensorboard: bool = False  # also write TensorBoard scalars to dir/tensorboard
    every: int = 1             # log one JSON line every N iterations


@dataclass
class DataConfig:
    verify: str = "auto"       # auto | off | sampled | checksums: check the data read beside training (training.md)


@dataclass
class Config:
    dataset: str = ""
    kernels: str = "native"    # native: C++ on CPU tensors, Triton on CUDA | triton: Triton everywhere (docs/gpu.md)
    model: ModelConfig = field(default_factory=ModelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)
    data: DataConfig = field(default_factory=DataConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# Closed sets of values, checked after loading.
CHOICES = {
    "kernels": ("native", "triton"),
    "data.verify": ("auto", "off", "sampled", "checksums"),
    "model.kind": ("gat", "sage", "gcn", "lightgcn"),
    "model.node_embedding.dtype": ("float32", "float16"),
    "model.node_embedding.optimizer": ("sgd", "adagrad", "adam"),
    "cache.features": ("cache", "storage", "memory", "device"),
    "cache.policy": ("auto", *POLICIES),
    "cache.backend": ("auto", *BACKENDS),
    "cache.mode": ("shared", "isolated"),
    "cache.exchange": EXCHANGES,
    "train.task": ("node", "link"),
    "train.eval_mode": ("sampled", "full"),
    "train.early_stopping.mode": ("auto", "max", "min"),
    "train.device": ("auto", "cpu", "cuda"),
    "sampler.topology": defaults.TOPOLOGY_ACCESS,
}


def _sections(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _coerce(key: str, value, kind):
    """``value`` as ``kind`` (str values come from the command line and are parsed as YAML)."""
    if isinstance(value, str) and kind is not str:
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{key}: cannot parse {value!r}: {exc}") from None
    if kind is float and isinstance(value, str):
        try:
            value = float(value)  # YAML 1.1 reads "1e-2" as a string
        except ValueError:
            pass
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if kind is list and isinstance(value, (int, str)) and not isinstance(value, bool):
        value = [value]  # fanouts=5 means [5]
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        article = "an" if kind.__name__[0] in "aeiou" else "a"
        raise ConfigError(f"{key} must be {article} {kind.__name__}, got {value!r}")
    return value


def _apply(obj, key_prefix: str, values: dict) -> None:
    fields = _sections(type(obj))
    hints = typing.get_type_hints(type(obj))
    for name, value in values.items():
        key = f"{key_prefix}{name}"
        if isinstance(obj, NodeEmbeddingConfig) and name not in fields and isinstance(value, dict):
            name, value = "types", {name: value}  # model.node_embedding.<node type>.<key>: one type's table
        if name not in fields:
            valid = ", ".join(f"{key_prefix}{n}" for n in fields)
            if isinstance(obj, NodeEmbeddingConfig):
                valid += f", or a node type's {key_prefix}<type>.<key> ({', '.join(TYPE_EMBEDDING_KEYS)})"
            raise ConfigError(f"unknown config key {key!r}; valid keys here are: {valid}")
        kind = hints[name]
        if dataclasses.is_dataclass(kind):
            if not isinstance(value, dict):
                raise ConfigError(f"{key} is a section; give it keys like {key}.{next(iter(_sections(kind)))}")
            _apply(getattr(obj, name), f"{key}.", value)
        elif kind is dict and isinstance(value, dict):  # keys given one by one add up (a level deeper too)
            merged = dict(getattr(obj, name))
            for k, v in value.items():
                merged[k] = {**merged[k], **v} if isinstance(merged.get(k), dict) and isinstance(v, dict) else v
            setattr(obj, name, merged)
        else:
            setattr(obj, name, _coerce(key, value, kind))


def _nest(dotted: str, value) -> dict:
    out = value
    for part in reversed(dotted.split(".")):
        out = {part: out}
    return out


def parse_overrides(items) -> list[dict]:
    """``["cache.policy=rr", ...]`` as nested dicts, in order."""
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not key=value (for example cache.policy=rr)")
        out.append(_nest(key.strip(), value))
    return out


def validate(cfg: Config) -> Config:
    for key, valid in CHOICES.items():
        value = cfg
        for part in key.split("."):
            value = getattr(value, part)
        if value not in valid:
            raise ConfigError(f"{key}={value!r} is not valid; choose one of: {', '.join(valid)}")
    f = cfg.sampler.fanouts
    if not f or not all(isinstance(k, int) and not isinstance(k, bool) and k >= -1 for k in f):
        raise ConfigError(f"sampler.fanouts must be a non-empty list of ints >= -1, got {f!r}")
    for relation, given in list(cfg.sampler.relation_fanouts.items()):
        key = f"sampler.relation_fanouts.{relation}"
        ks = _coerce(key, given, list)
        if len(ks) != len(f) or not all(isinstance(k, int) and not isinstance(k, bool) and k >= -1 for k in ks):
            raise ConfigError(f"{key} must be a list of {len(f)} ints >= -1 (one per layer, as sampler.fanouts), "
                              f"got {given!r}")
        cfg.sampler.relation_fanouts[relation] = ks
    e = cfg.train.eval_fanouts
    if e and (len(e) != len(f) or not all(isinstance(k, int) and not isinstance(k, bool) and k >= -1 for k in e)):
        raise ConfigError(f"train.eval_fanouts must be [] (sampler.fanouts) or a list of {len(f)} ints >= -1, one "
                          f"per layer as sampler.fanouts, got {e!r}")
    positive = {"sampler.batch_size": cfg.sampler.batch_size, "cache.ways": cfg.cache.ways,
                "model.hidden": cfg.model.hidden, "model.heads": cfg.model.heads, "train.epochs": cfg.train.epochs,
                "log.every": cfg.log.every, "train.num_negatives": cfg.train.num_negatives}
    for key, value in positive.items():
        if value < 1:
            raise ConfigError(f"{key} must be >= 1, got {value}")
    for key, value in {"train.lr": cfg.train.lr, "train.weight_decay": cfg.train.weight_decay,
                       "train.embedding_l2": cfg.train.embedding_l2, "model.dropout": cfg.model.dropout,
                       "train.early_stopping.min_delta": cfg.train.early_stopping.min_delta}.items():
        if not math.isfinite(value):
            raise ConfigError(f"{key} must be a finite number, got {value}")
    for key, value in {"train.max_iterations": cfg.train.max_iterations,
                       "train.eval_batch_size": cfg.train.eval_batch_size, "checkpoint.every": cfg.checkpoint.every,
                       "train.lr": cfg.train.lr, "train.weight_decay": cfg.train.weight_decay,
                       "train.embedding_l2": cfg.train.embedding_l2, "train.eval_every": cfg.train.eval_every, "train.eval_every_epochs": cfg.train.eval_every_epochs,
                       "train.early_stopping.patience": cfg.train.early_stopping.patience,
                       "train.early_stopping.min_delta": cfg.train.early_stopping.min_delta}.items():
        if value < 0:
            raise ConfigError(f"{key} must be >= 0, got {value}")
    if not 0 <= cfg.train.seed < 1 << 63:  # numpy's and torch's generators take a non-negative 64-bit seed
        raise ConfigError(f"train.seed must be an integer from 0 to 2^63 - 1, got {cfg.train.seed}")
    if cfg.train.threads < 0:
        raise ConfigError(f"train.threads must be >= 0 (0: one fewer than torch's default), got {cfg.train.threads}")
    if not 0.0 <= cfg.model.dropout < 1.0:
        raise ConfigError(f"model.dropout must be in [0, 1), got {cfg.model.dropout}")
    if cfg.model.kind == "gat" and len(f) > 1 and cfg.model.hidden % cfg.model.heads:
        raise ConfigError(f"model.hidden ({cfg.model.hidden}) must be divisible by model.heads ({cfg.model.heads})")
    bad_splits = [s for s in cfg.train.eval_splits if s not in ("train", "val", "test")]
    if bad_splits:
        raise ConfigError(f"train.eval_splits has {bad_splits}; valid splits are train, val, test")
    selection_metric(cfg.train, default="?")  # its form; the task checks that it has the metric
    if cfg.cache.owner not in ("modulo", "hashed", "hotness") and not cfg.cache.owner.endswith(".npy"):
        raise ConfigError(f"cache.owner={cfg.cache.owner!r} is not valid; choose modulo, hashed, hotness or a path to a "
                          ".npy partition map")
    if cfg.cache.pvp and cfg.cache.features != "cache":
        raise ConfigError(f"cache.pvp=true needs cache.features=cache (the victim buffer holds lines the cache "
                          f"evicts), got cache.features={cfg.cache.features}")
    try:
        capacity_spec(cfg.cache.capacity)
    except ValueError as exc:
        raise ConfigError(f"cache.capacity: {exc}") from None
    if cfg.cache.pvp_queue_capacity < 0:
        raise ConfigError(f"cache.pvp_queue_capacity must be >= 0 (0: sized by cache.pvp_queue_bytes), got "
                          f"{cfg.cache.pvp_queue_capacity}")
    if not cfg.cache.pvp_queue_bytes and not cfg.cache.pvp_queue_capacity:
        raise ConfigError("give the victim queues a size: cache.pvp_queue_bytes (e.g. 25%) or "
                          "cache.pvp_queue_capacity (lines per queue)")
    if cfg.cache.pvp_queue_bytes:
        try:  # the format only: the lines follow from the cache's size, known when it is built
            queue_budget(cfg.cache.pvp_queue_bytes, cache_bytes=1)
        except ValueError as exc:
            raise ConfigError(f"cache.pvp_queue_bytes: {exc}") from None
    read_ahead_depth(cfg.cache)
    if cfg.cache.read_ahead_bytes != "auto":
        try:
            if parse_bytes(cfg.cache.read_ahead_bytes) < 1:
                raise ValueError("it must be at least one byte")
        except ValueError as exc:
            raise ConfigError(f"cache.read_ahead_bytes={cfg.cache.read_ahead_bytes!r}: {exc}; give auto or bytes "
                              "like 64M") from None
    policy_config(cfg.cache)
    check_node_embedding(cfg)
    return cfg


def check_node_embedding(cfg: Config) -> None:
    """``model.node_embedding``'s values (every node type's, ``model.node_embedding.<type>.*``) and what they need
    from the rest of the config. Which types exist is the dataset's to say (:func:`lsm_gnn.build.embedding_tables`)."""
    e = cfg.model.node_embedding
    hints = typing.get_type_hints(NodeEmbeddingConfig)
    for t, given in list(e.types.items()):
        if not isinstance(given, dict):
            raise ConfigError(f"model.node_embedding.{t} is a node type's section; give it keys like "
                              f"model.node_embedding.{t}.dim=64")
        unknown = sorted(set(given) - set(TYPE_EMBEDDING_KEYS))
        if unknown:
            raise ConfigError(f"model.node_embedding.{t} has unknown keys {unknown}; a node type sets "
                              f"{', '.join(TYPE_EMBEDDING_KEYS)}")
        e.types[t] = {k: _coerce(f"model.node_embedding.{t}.{k}", v, hints[k]) for k, v in given.items()}
    tables = [("model.node_embedding.", e)] + [(f"model.node_embedding.{t}.", type_embedding(e, t)) for t in e.types]
    if not any(settings.dim for _, settings in tables):
        if not e.features:
            raise ConfigError("model.node_embedding.features=false leaves the model no input: set "
                              "model.node_embedding.dim to a size (e.g. 64) or features=true")
        return
    for key, settings in tables:
        if settings.dim < 0:
            raise ConfigError(f"{key}dim must be >= 0 (0: no embeddings), got {settings.dim}")
        for name in ("dtype", "optimizer"):
            valid = CHOICES[f"model.node_embedding.{name}"]
            if getattr(settings, name) not in valid:
                raise ConfigError(f"{key}{name}={getattr(settings, name)!r} is not valid; choose one of: "
                                  f"{', '.join(valid)}")
        if not settings.dim:
            continue
        if not 0 < settings.lr < math.inf or not 0 <= settings.init_std < math.inf:  # nan fails both too
            raise ConfigError(f"{key}lr must be a finite number > 0 and init_std a finite number >= 0, got "
                              f"lr={settings.lr}, init_std={settings.init_std}")
        if settings.capacity:
            try:
                capacity_spec(settings.capacity)
            except ValueError as exc:
                raise ConfigError(f"{key}capacity: {exc}") from None
        if not settings.path and not cfg.checkpoint.dir:
            raise ConfigError(f"{key[:-1]} needs a directory for its table: set checkpoint.dir (the table goes "
                              f"to checkpoint.dir/node_embedding) or {key}path")
    if cfg.train.eval_mode == "full":
        raise ConfigError("train.eval_mode=full does not read node embeddings yet; use train.eval_mode=sampled")


def type_embedding(e: NodeEmbeddingConfig, node_type: str) -> NodeEmbeddingConfig:
    """The settings of ``node_type``'s table: ``model.node_embedding.<type>.*`` over the section's own keys."""
    return dataclasses.replace(e, types={}, **e.types.get(node_type, {}))


def read_ahead_depth(cache: CacheConfig) -> int | None:
    """``cache.read_ahead`` as the cache takes it: None for auto, else the number of batches."""
    text = str(cache.read_ahead).strip()
    if text == "auto":
        return None
    if not text.isdigit():
        raise ConfigError(f"cache.read_ahead must be auto or a number of batches >= 0 (0: off), got "
                          f"{cache.read_ahead!r}")
    return int(text)


def selection_metric(train: TrainConfig, default: str | None = None) -> tuple[str, str, str] | None:
    """``(split, metric, mode)`` that ``train.early_stopping`` watches, or None when nothing is watched.

    ``default`` is the task's first metric, which ``metric=auto`` watches on val (if val is evaluated).
    """
    es = train.early_stopping
    if es.metric == "auto":
        if default is None or "val" not in train.eval_splits:
            if es.patience:
                raise ConfigError("train.early_stopping.patience needs a validation split to watch: add val to "
                                  "train.eval_splits, or set train.early_stopping.metric=<split>.<metric>")
            return None
        split, metric = "val", default
    else:
        split, dot, metric = es.metric.partition(".")
        if not dot or not metric or split not in ("train", "val", "test"):
            raise ConfigError(f"train.early_stopping.metric={es.metric!r} is not <split>.<metric>; e.g. "
                              "val.accuracy (node task) or val.recall@20 (link task), or auto")
        if split not in train.eval_splits:
            raise ConfigError(f"train.early_stopping.metric={es.metric} watches split {split}, which "
                              f"train.eval_splits={train.eval_splits} does not evaluate; add it there")
    mode = es.mode if es.mode != "auto" else ("min" if "loss" in metric else "max")
    return split, metric, mode


def policy_name(cache: CacheConfig) -> str:
    """``cache.policy`` with ``auto`` resolved: the best measured policy with or without PVP."""
    return defaults.policy_for(cache.pvp) if cache.policy == "auto" else cache.policy


def policy_config(cache: CacheConfig) -> PolicyConfig:
    """The cache section's policy, window and period, checked once (the window's range is PolicyConfig's)."""
    try:
        return PolicyConfig(policy_name(cache), window=cache.window, period=cache.period)
    except ValueError as exc:  # "window must ...", "period must ...": name the key
        raise ConfigError(f"cache.{exc}") from None


def capacity_spec(text: str) -> tuple[str, float]:
    """("share", 0.015) for "1.5%", ("bytes", n) for "4G"."""
    text = str(text).strip()
    if text.endswith("%"):
        share = float(text[:-1]) / 100
        if not 0 < share <= 1:
            raise ValueError(f"a share of the nodes must be in (0%, 100%], got {text}")
        return "share", share
    return "bytes", float(parse_bytes(text))


def cache_capacity_bytes(text: str, num_nodes: int, row_bytes: int) -> int:
    return capacity_bytes_of(*capacity_spec(text), num_nodes, row_bytes)


def capacity_bytes_of(kind: str, value: float, num_nodes: int, row_bytes: int) -> int:
    """The bytes of a parsed capacity (:func:`capacity_spec`): as given, or that share of ``num_nodes`` rows."""
    return int(value) if kind == "bytes" else max(1, round(value * num_nodes)) * row_bytes


def _read_yaml(path) -> dict:
    if not os.path.exists(path):
        raise ConfigError(f"config file {path} does not exist; the shipped configs are in configs/")
    if os.path.isdir(path):
        hint = (f"to train on the dataset there, give dataset={path}" if os.path.isfile(os.path.join(path, "meta.json"))
                else "give a YAML file (see configs/)")
        raise ConfigError(f"config file {path} is a directory; {hint}")
    with open(path, "rb") as fh:  # bytes: yaml names the file and the position of a byte that is not UTF-8
        try:
            data = yaml.safe_load(fh) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of config keys, got {type(data).__name__}")
    return data


def build_config(*layers: dict) -> Config:
    cfg = Config()
    for layer in layers:
        _apply(cfg, "", layer)
    return validate(cfg)


def load_config(path=None, overrides=()) -> Config:
    """The defaults, then the YAML file (if any), then ``key=value`` overrides."""
    base = _read_yaml(path) if path else {}
    base.pop("grid", None)
    return build_config(base, *parse_overrides(overrides))


def load_grid(path, overrides=()) -> list[tuple[dict, Config]]:
    """Every run of a config with a ``grid:`` section (``key: [values]``, the Cartesian product).

    Returns ``(assignment, config)`` pairs; overrides apply to every run.
    """
    if not path:
        raise ConfigError("--grid needs a config file with a grid: section (grid: {cache.policy: [rr, hybrid]}); "
                          "key=value overrides give one value each")
    data = _read_yaml(path)
    grid = data.pop("grid", None)
    if not isinstance(grid, dict) or not grid:
        raise ConfigError(f"{path} has no grid section (grid: {{cache.policy: [rr, hybrid], ...}})")
    keys = list(grid)
    for key in keys:
        if not isinstance(grid[key], list) or not grid[key]:
            raise ConfigError(f"grid key {key!r} must map to a non-empty list of values")
    runs = []
    for values in itertools.product(*(grid[k] for k in keys)):
        assignment = dict(zip(keys, values))
        layers = [copy.deepcopy(data)] + [_nest(k, v) for k, v in assignment.items()] + parse_overrides(overrides)
        runs.append((assignment, build_config(*layers)))
    return runs
