"""The built-in trainer: a config in, a trained model, metrics and checkpoints out.

It runs under DDP whenever torch.distributed is initialised (or the
environment of torchrun / mpirun says so), with one rank or many, and as a
plain process otherwise; the code path is the same. Per iteration it
records the time of each stage, the hit ratio and the bytes read; a
checkpoint holds everything needed to continue exactly where it stopped
(model, optimizer, loader position, RNG), so a resumed run computes the
same losses as an uninterrupted one.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch

from lsm_gnn.build import build_features, build_typed_features, resolve
from lsm_gnn.checkpoint import (CheckpointError, atomic_torch_save, load_checkpoint,
                                remove_stale_checkpoint_temporaries)
from lsm_gnn.comm.group import (TIMEOUT_ENV, CollectiveError, ProgressBoard, check_agreement, collective_timeout,
                                first_line, is_collective_failure)
from lsm_gnn.config import Config, ConfigError, selection_metric
from lsm_gnn.features import NoFeatures
from lsm_gnn.fileio import contained_path, reporting_disk_full
from lsm_gnn.parallel import batch_to, distributed_context
from lsm_gnn.run_resources import RunResources
from lsm_gnn.task_options import eval_batch_size
from lsm_gnn.tasks import make_task

__all__ = ["CheckpointError", "Trainer", "TrainingDiverged", "atomic_torch_save", "load_checkpoint", "train"]

STAGES = ("sample", "gather", "exchange", "wait", "train")  # exchange: the part of gather spent between ranks
# With model.node_embedding: reading the rows (in the loader's thread; write-back is the part of it spent writing
# dirty victims), and applying the batch's update (in training's).
EMBEDDING_STAGES = ("embedding", "write-back", "update")
ALL_STAGES = STAGES + EMBEDDING_STAGES
# Settings a resumed run must share with the checkpoint, or its losses would differ.
RESUME_KEYS = ("dataset", "model", "sampler", "train.task", "train.seed", "train.lr", "train.weight_decay")
# Counters summed over an epoch's iterations for its summary.
TOTALS = ("hits", "unique", "bytes_read", "bytes_useful", "pvp_hits", "bytes_saved", "embedding_bytes_read",
          "embedding_bytes_written")


class TrainingDiverged(RuntimeError):
    """The loss or the gradients became NaN or infinite."""


# -- metrics -----------------------------------------------------------------------------------------------------

@dataclass
class StageTimes:
    """Seconds per stage, summed over iterations. sample and gather run in the
    loader's thread, overlapped with training; wait is what training lost
    waiting for them."""

    seconds: dict = field(default_factory=lambda: dict.fromkeys(ALL_STAGES, 0.0))
    iterations: int = 0
    wall: float = 0.0

    def add(self, times: dict) -> None:
        for k in ALL_STAGES:
            self.seconds[k] += times.get(k, 0.0)
        self.iterations += 1

    def table(self) -> str:
        n = max(self.iterations, 1)
        rows = [f"{'stage':<10}{'total s':>10}{'ms/iter':>10}{'of wall':>9}"]
        for k in STAGES + tuple(k for k in EMBEDDING_STAGES if self.seconds[k]):
            share = self.seconds[k] / self.wall if self.wall else 0.0
            rows.append(f"{k:<10}{self.seconds[k]:>10.2f}{1e3 * self.seconds[k] / n:>10.1f}{share:>9.1%}")
        rows.append(f"{'wall':<10}{self.wall:>10.2f}{1e3 * self.wall / n:>10.1f}{1:>9.0%}")
        rows.append("(sample and gather run in the background, overlapped with train; wait is the stall they caused)")
        if self.seconds["embedding"]:
            rows.append("(embedding: reading the batch's rows, in the background after the last update; write-back:"
                        " the part of it writing dirty victims; update: the optimizer step on the rows)")
        return "\n".join(rows)


class MetricsLog:
    """JSON lines (rank 0) and optional TensorBoard scalars."""

    def __init__(self, cfg: Config, rank: int):
        self.file = self.board = None
        if rank != 0 or not cfg.log.dir:
            return
        os.makedirs(cfg.log.dir, exist_ok=True)
        self.path = contained_path(cfg.log.dir, "metrics.jsonl", ConfigError,
                                   fix="log.dir's metrics.jsonl must be a file of its own: remove the link")
        self.file = open(self.path, "a")
        if cfg.log.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise ConfigError("log.tensorboard=true needs the tensorboard package: pip install tensorboard") \
                    from exc
            self.board = SummaryWriter(os.path.join(cfg.log.dir, "tensorboard"))

    def write(self, record: dict) -> None:
        if self.file is not None:
            with reporting_disk_full(self.path):
                self.file.write(json.dumps(record) + "\n")
                self.file.flush()
        if self.board is not None and ("iteration" in record or "evaluation" in record):
            step = record["iteration"] if "iteration" in record else record["evaluation"]["iterations"]
            for key, value in _flatten(record).items():
                if isinstance(value, (int, float)) and not key.endswith(("iteration", "iterations", "epoch")):
                    self.board.add_scalar(key, value, step)

    def offset(self) -> int | None:
        """Bytes of the JSON-lines file written so far (None without one)."""
        return None if self.file is None else self.file.tell()

    def rewind(self, offset: int | None) -> None:
        """Drops what was logged after ``offset``: a resumed run logs those iterations again."""
        if self.file is not None and offset is not None and self.file.tell() > offset:
            self.file.truncate(offset)
            self.file.seek(offset)

    def close(self) -> None:
        for h in (self.file, self.board):
            if h is not None:
                h.close()


def _flatten(d: dict, sep: str = "/", prefix: str = "") -> dict:
    """Nested dicts as one level, keys joined by ``sep`` ("a/b" for TensorBoard, "a.b" for config keys)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, sep, f"{prefix}{k}{sep}"))
        else:
            out[f"{prefix}{k}"] = v
    return out


# -- checkpoints -------------------------------------------------------------------------------------------------

def _with_defaults(saved: dict, defaults: dict) -> dict:
    """``saved`` with every key it lacks taken from ``defaults``, recursively."""
    out = dict(saved)
    for key, value in defaults.items():
        if key not in out:
            out[key] = value
        elif isinstance(value, dict) and isinstance(out[key], dict):
            out[key] = _with_defaults(out[key], value)
    return out


def _lookup(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d[part]
    return d


# -- the trainer -------------------------------------------------------------------------------------------------

class Trainer:
    """Trains ``cfg`` end to end: ``Trainer(cfg).fit()`` returns a summary dict.

    ``features`` replaces the feature path the config describes: any object
    :class:`~lsm_gnn.features.Features` (a storage, a SoftwareCache, a SharedCache).
    """

    def __init__(self, cfg: Config, out=None, features=None):
        if not cfg.dataset:
            raise ConfigError("no dataset: set dataset=<directory> (make one with lsm-gnn prepare)")
        # kernels= (CPU tensors: the C++ core, or the Triton kernels under the interpreter), the output locks and
        # the data check: held for the trainer's life, given back by close(), or at once by a failed start.
        self.resources = RunResources(cfg.kernels)
        try:
            self._setup(cfg, out, features)
        except BaseException:
            self.resources.close()
            raise
        # A trainer dropped without close() (a notebook cell run again) gives its locks, check and kernels= scope
        # back when it is collected.
        weakref.finalize(self, self.resources.close)

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _setup(self, cfg: Config, out, features) -> None:
        from lsm_gnn.data import open_dataset

        self.cfg = cfg
        self.out = sys.stdout if out is None else out
        self.dataset = open_dataset(cfg.dataset, check="fast")
        self.hetero = getattr(self.dataset, "is_hetero", False)  # several node types (schema 2)
        if cfg.model.node_embedding.dim and self.hetero:
            raise ConfigError("model.node_embedding supports datasets of one node type; "
                              f"{self.dataset.path} has several")
        self.device = self._device(cfg.train.device)
        if self.device.type == "cuda" and self.device.index is None:
            # One GPU per rank on a node: the launcher's local rank picks it.
            local = os.environ.get("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
            self.device = torch.device("cuda", int(local) % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        self.rank, self.world_size = distributed_context(self.device)
        # data.verify: the dataset's files, or the blocks the run reads, checked beside training (rank 0)
        self.resources.start_verify(self.dataset, cfg.data.verify, checking=self.rank == 0)
        self.progress = ProgressBoard.for_default_group("train") if self._distributed() else None
        if self._distributed():  # before any collective whose shape depends on the settings
            check_agreement(_flatten(self._agreed_settings(), sep="."))
        if self.rank == 0:
            self.resources.lock_outputs(cfg)
        self.task = make_task(cfg, self.dataset)
        missing = [s for s in cfg.train.eval_splits if s not in self.task.splits]
        if missing:  # fail now, not after the first epoch
            raise ConfigError(f"train.eval_splits has {missing}, which dataset {self.dataset.path} lacks; it has "
                              f"{self.task.splits or 'none'}: set train.eval_splits={self.task.splits}")
        #: (split, metric, mode) that picks best.pt and stops early, or None
        self.watch = selection_metric(cfg.train, self.task.metrics[0])
        if self.watch and self.watch[1] not in self.task.metrics:
            raise ConfigError(f"train.early_stopping.metric={'.'.join(self.watch[:2])}: the {self.task.name} task "
                              f"reports {', '.join(self.task.metrics)}; watch one of those")
        #: the resolved feature path (capacity in bytes, policy, PVP, sharing), checked before any work
        self.feature_spec = resolve(cfg, self.dataset, self.world_size)
        if features is None and cfg.model.node_embedding.features:
            from lsm_gnn.sizing import check_one_set

            check_one_set(self.feature_spec, cfg.cache.capacity, self.dataset)
        emb = cfg.model.node_embedding
        if features is not None:
            self.features = features
        elif not emb.features:
            self.features = NoFeatures(self.dataset.num_nodes)
        elif self.hetero:
            self.features = build_typed_features(
                self.feature_spec, self.dataset, self.device, world_size=self.world_size,
                fanouts=self.task.fanouts, batch_size=cfg.sampler.batch_size, seed=cfg.train.seed,
                num_threads=cfg.sampler.num_threads)
        else:
            self.features = build_features(
                self.feature_spec, self.dataset, self.device, world_size=self.world_size,
                fanouts=cfg.sampler.fanouts, batch_size=cfg.sampler.batch_size, seed=cfg.train.seed,
                num_threads=cfg.sampler.num_threads)
        self.checkpoint_path = os.path.join(cfg.checkpoint.dir, "last.pt") if cfg.checkpoint.dir else None
        saved = None  # the checkpoint this run resumes from
        if self.checkpoint_path and cfg.checkpoint.resume and os.path.lexists(self.checkpoint_path):
            contained_path(cfg.checkpoint.dir, "last.pt", CheckpointError,
                           fix="resume from checkpoint.dir's own last.pt: copy the file there instead of linking it")
            saved = load_checkpoint(self.checkpoint_path)
        #: trainable node embeddings (model.node_embedding), or None
        self.embedding = self._node_embedding(saved) if emb.dim else None
        self.task.embedding = self.embedding
        torch.manual_seed(cfg.train.seed)
        self._check_model_fits()
        self.module = self._model().to(self.device)
        self.model = self.module
        if self._distributed():
            from torch.nn.parallel import DistributedDataParallel

            # A typed batch may lack a relation's edges, leaving its layer's parameters out of that loss.
            self.model = DistributedDataParallel(self.module, find_unused_parameters=self.hetero)
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=cfg.train.lr,
                                          weight_decay=cfg.train.weight_decay)
        self.loader = self.task.train_loader(self.features, self.rank, self.world_size)
        #: each cache against batches sampled before training (lsm_gnn.sizing); empty without a config-built cache
        self.cache_fits = self._check_cache_size() if features is None else []
        self.iterations_done = 0
        self.history: list[dict] = []
        #: every evaluation ({"epoch", "iterations" done, split: metrics}), at epoch ends and every train.eval_every
        self.evaluations: list[dict] = []
        #: model selection: the best watched value, its evaluation, evaluations since, and whether the run stopped
        self.selection = self._new_selection()
        #: the accumulators of the epoch in progress (None between epochs); checkpointed, so a resumed
        #: epoch's summary covers all of its iterations
        self.epoch_state: dict | None = None
        self.log = MetricsLog(cfg, self.rank)
        # The embedding table is not copied at each better evaluation, so no best.pt could pair with it.
        self.best_path = os.path.join(cfg.checkpoint.dir, "best.pt") \
            if cfg.checkpoint.dir and self.watch and self.embedding is None else None
        self.resumed_from = None
        if self.checkpoint_path and self.rank == 0:
            for path in (self.checkpoint_path, self.best_path):
                if path:
                    remove_stale_checkpoint_temporaries(path)
        if saved is not None:
            self.resume(self.checkpoint_path, saved)
        if self._distributed():  # a rank that cannot see the checkpoint (another host's disk) would start over
            check_agreement({"resumed at iteration": self.iterations_done},
                            fix="Put checkpoint.dir on a file system every rank sees")

    def _check_cache_size(self) -> list:
        """Samples a few batches (every rank's, so every rank decides alike) and raises a ConfigError naming
        a capacity with headroom when the largest would not fit: before any training, not at that batch."""
        from lsm_gnn.sizing import batches_per_rank, cache_fits, too_small_message

        c, e = self.cfg.cache, self.cfg.model.node_embedding
        if self.feature_spec.source != "cache" or c.oversubscribe:
            return []
        count = batches_per_rank(self.world_size)
        # Training batches, then each evaluation split's in the order evaluation reads them (its batch size is
        # train.eval_batch_size): a cache too small for either is refused now, not after an epoch of training.
        checks = [("training", [self.loader.sample_input_nodes(count, rank=r) for r in range(self.world_size)])]
        for split in self.cfg.train.eval_splits:
            per_rank = [self.task.eval_input_nodes(self.features, split, r, self.world_size, count)
                        for r in range(self.world_size)]
            if all(nodes for nodes in per_rank):
                checks.append((f"evaluating on {split}", per_rank))
        fits = []
        for features, what, key, capacity in (
                (self.features, "the cache", "cache.capacity", c.capacity),
                (self.embedding.source if self.embedding else None, "the node embeddings' cache",
                 "model.node_embedding.capacity", e.capacity or c.capacity)):
            if features is None:
                continue
            for stage, batches in checks:
                found = cache_fits(features, batches, what)
                tight = min(found, key=lambda f: f.lines / max(f.largest, 1), default=None)
                if tight is not None and not tight.fits:
                    self.loader.close()
                    smaller = "" if stage == "training" else \
                        f"; or lower train.eval_batch_size (now {eval_batch_size(self.cfg)})"
                    raise ConfigError(("" if stage == "training" else f"{stage}: ")
                                      + too_small_message(tight, capacity, c.ways, key) + smaller)
                if stage == "training":
                    fits += found
        return fits

    @contextlib.contextmanager
    def _sized(self, where: str):
        """A batch the cache refuses mid-run (sampling missed one as large) names the config keys to change."""
        from lsm_gnn.cache import CacheTooSmall
        from lsm_gnn.sizing import config_fix

        try:
            yield
        except CacheTooSmall as exc:
            if not self.cache_fits:  # a cache the caller built: its own keywords apply
                raise
            c = self.cfg.cache
            smaller = f"; or lower train.eval_batch_size (now {eval_batch_size(self.cfg)})" \
                if where.startswith("evaluating") else ""
            raise ConfigError(f"{where}, a batch has {exc.distinct:,} distinct nodes but the cache holds "
                              f"{exc.lines:,} lines (cache.capacity={c.capacity}); "
                              + config_fix(c.capacity, exc.lines, exc.distinct, c.ways) + smaller) from exc

    def _check_model_fits(self) -> None:
        """A model too large for memory is refused with its key before it is allocated (the kernel would kill
        the process without a word). A lower bound: each layer's hidden x hidden weights (the first layer's
        input x hidden), with their gradients and Adam's two moments."""
        from lsm_gnn.memcap import available_memory
        from lsm_gnn.units import format_bytes

        m, layers = self.cfg.model, len(self.cfg.sampler.fanouts)
        widest_input = max(self.features.dims().values()) if self.hetero else getattr(self.features, "dim", 0)
        weights = m.hidden * (widest_input + m.hidden * (layers - 1) + self.task.out_dim)
        need = 4 * weights * 4  # float32 weights, gradients, two Adam moments
        if self.device.type == "cuda":
            free = torch.cuda.mem_get_info(self.device)[0]
        else:
            free = available_memory()
        if free is not None and need > free:
            raise ConfigError(f"model.hidden={m.hidden} makes a model of at least {weights:,} weights, "
                              f"{format_bytes(need)} with their gradients and optimizer state, more than the "
                              f"{format_bytes(free)} of memory free on {self.device}; lower model.hidden")

    def _model(self) -> torch.nn.Module:
        from lsm_gnn.models import HETERO_MODEL_KINDS, HeteroHopGNN, HopGNN

        m, layers = self.cfg.model, len(self.cfg.sampler.fanouts)
        if not self.hetero:
            in_dim = (self.dataset.feature_dim if m.node_embedding.features else 0) + m.node_embedding.dim
            return HopGNN(m.kind, in_dim, m.hidden, self.task.out_dim, num_layers=layers,
                          heads=m.heads, dropout=m.dropout)
        if m.kind not in HETERO_MODEL_KINDS:
            raise ConfigError(f"model.kind={m.kind} has no heterogeneous form; use one of "
                              f"{', '.join(HETERO_MODEL_KINDS)} (R-SAGE, R-GAT)")
        dims = self.features.dims()
        return HeteroHopGNN(m.kind, {t: dims.get(t, 0) for t in self.dataset.node_types}, self.dataset.relations,
                            self.dataset.target, m.hidden, self.task.out_dim, num_layers=layers, heads=m.heads,
                            dropout=m.dropout)

    def _node_embedding(self, saved: dict | None):
        """The run's trainable node embeddings: the table opened (made on a fresh start) at the generation
        ``saved`` (the checkpoint resumed from) recorded, behind the cache the config describes."""
        from lsm_gnn.build import build_node_embedding

        state = (saved or {}).get("embedding")
        if saved is not None and state is None:
            raise ConfigError(f"{self.checkpoint_path} was trained without model.node_embedding; resume without it, "
                              "or start fresh with checkpoint.resume=false or another checkpoint.dir")
        e = self.cfg.model.node_embedding
        path = e.path or os.path.join(self.cfg.checkpoint.dir, "node_embedding")
        return build_node_embedding(self.feature_spec, self.cfg, self.dataset, path, self.device,
                                    rank=self.rank, world_size=self.world_size, state=state,
                                    barrier=self._barrier)

    def _barrier(self) -> None:
        if self._distributed():
            import torch.distributed as dist

            with self._collectives("a barrier of the embedding table"):
                dist.barrier()

    @staticmethod
    def _device(name: str) -> torch.device:
        if name == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if name == "cuda" and not torch.cuda.is_available():
            raise ConfigError("train.device=cuda but torch sees no CUDA device; use train.device=cpu")
        return torch.device(name)

    def _distributed(self) -> bool:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()

    def _agreed_settings(self) -> dict:
        """What every rank must share: the config (less logging and thread counts, which are local) and
        the dataset's identity (its path may differ between hosts, its contents may not)."""
        settings = self.cfg.to_dict()
        settings.pop("log")
        settings["sampler"].pop("num_threads")
        meta = self.dataset.meta
        settings["dataset"] = {"checksums": meta.get("checksums", {})}
        if not self.hetero:  # a heterogeneous dataset's counts and dims are in its checksummed files' sizes
            settings["dataset"].update(num_nodes=self.dataset.num_nodes, num_edges=self.dataset.num_edges,
                                       feature_dim=self.dataset.feature_dim)
        return settings

    def _print(self, *args) -> None:
        if self.rank == 0:
            print(*args, file=self.out, flush=True)

    # -- checkpoints ---------------------------------------------------------------------------------------------

    @staticmethod
    def _rng_state() -> dict:
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return rng

    def _rng_by_rank(self) -> list[dict]:
        """Every rank's generators, for rank 0's checkpoint: each rank draws its own dropout masks, so a resume
        that gave every rank rank 0's state trained on other masks (losses off by 1e-4 from the next step)."""
        own = self._rng_state()
        if not self._distributed():
            return [own]
        import torch.distributed as dist

        states = [None] * self.world_size
        with self._collectives(f"the checkpoint after iteration {self.iterations_done}"):
            dist.all_gather_object(states, own)
        return states

    def state_dict(self, rng_by_rank: list[dict] | None = None) -> dict:
        """The trainer's state as a checkpoint holds it; ``rng_by_rank`` (every rank's generators, which
        :meth:`save_checkpoint` gathers) defaults to this process's alone."""
        rng_by_rank = rng_by_rank or [self._rng_state()]
        return {"config": self.cfg.to_dict(), "model": self.module.state_dict(),
                "optimizer": self.optimizer.state_dict(), "loader": self.loader.state_dict(),
                "iterations_done": self.iterations_done, "history": self.history, "epoch_state": self.epoch_state,
                "evaluations": self.evaluations, "selection": self.selection,
                "log_offset": self.log.offset(), "rng": rng_by_rank[0], "rng_by_rank": rng_by_rank,
                "world_size": self.world_size, "time": time.time()}

    def save_checkpoint(self, path: str | None = None) -> str | None:
        path = path or self.checkpoint_path
        if path is None:
            return None
        rng_by_rank = self._rng_by_rank()  # a collective: every rank saves together
        if self.embedding is None:
            if self.rank == 0:
                atomic_torch_save(self.state_dict(rng_by_rank), path)
            return path
        # Every rank's dirty rows on disk first; then the checkpoint names the table's next generation, and only
        # then does the table take it (a crash in between: the table is rolled forward or back to match last.pt).
        self.embedding.flush()
        self._barrier()
        generation = self.embedding.table.generation + 1
        if self.rank == 0:
            state = self.state_dict(rng_by_rank)
            state["embedding"] = {**self.embedding.state_dict(), "generation": generation}
            atomic_torch_save(state, path)
        self._commit_table(generation)
        return path

    def _commit_table(self, generation: int) -> None:
        """The table's generation recorded (rank 0) and every rank's undo journal started afresh for it."""
        self._barrier()
        if self.rank == 0:
            self.embedding.table.set_generation(generation)
        self._barrier()
        self.embedding.table.reset_journal(generation)

    def resume(self, path: str, ckpt: dict | None = None) -> None:
        ckpt = load_checkpoint(path) if ckpt is None else ckpt
        try:
            # Keys added to the config since the checkpoint was written count with their defaults.
            saved, now = _with_defaults(ckpt["config"], Config().to_dict()), self.cfg.to_dict()
            differ = [k for k in RESUME_KEYS if _lookup(saved, k) != _lookup(now, k)]
            world_size = ckpt["world_size"]
        except (KeyError, TypeError) as exc:
            raise CheckpointError(f"{path} lacks the trainer state ({exc!r} is missing); it was not written by "
                                  "the lsm-gnn trainer") from None
        if differ:
            detail = "; ".join(f"{k}: saved {_lookup(saved, k)!r}, now {_lookup(now, k)!r}" for k in differ)
            raise ConfigError(f"cannot resume from {path}: the run's settings changed ({detail}). Use the saved "
                              "settings, or start fresh with checkpoint.resume=false or another checkpoint.dir")
        if world_size != self.world_size:
            raise ConfigError(f"{path} was written by {world_size} ranks; this run has {self.world_size}")
        try:
            self.module.load_state_dict(ckpt["model"])
            self.optimizer.load_state_dict(ckpt["optimizer"])
            self.loader.load_state_dict(ckpt["loader"])
            # This rank's own generators (checkpoints before lsm-gnn 0.3 kept rank 0's only).
            rng = ckpt["rng_by_rank"][self.rank] if "rng_by_rank" in ckpt else ckpt["rng"]
            torch.set_rng_state(rng["torch"])
            if "cuda" in rng and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(rng["cuda"])
            self.iterations_done = int(ckpt["iterations_done"])
            self.history = list(ckpt["history"])
            if self.embedding is not None:
                self.embedding.steps = int(ckpt["embedding"]["steps"])
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"cannot resume from {path}: its state does not fit this run ({exc}); start "
                                  "fresh with checkpoint.resume=false or another checkpoint.dir") from None
        self.epoch_state = ckpt.get("epoch_state")
        # Written before model selection existed: nothing was selected yet.
        self.evaluations = list(ckpt.get("evaluations", []))
        self.selection = ckpt.get("selection") or self._new_selection()
        self.log.rewind(ckpt.get("log_offset"))  # what was logged after the checkpoint is redone
        self.resumed_from = path
        self._print(f"resumed from {path}: epoch {ckpt['loader']['epoch']}, "
                    f"{ckpt['loader']['position']} batches into it, iteration {self.iterations_done}")

    # -- training ------------------------------------------------------------------------------------------------

    def _limit_reached(self) -> bool:
        """The run ends here: train.max_iterations reached, or early stopping."""
        limit = self.cfg.train.max_iterations
        return (bool(limit) and self.iterations_done >= limit) or self.selection["stopped"]

    def _grads_finite(self) -> bool:
        # After DDP's all-reduce every rank holds the same gradients, so every rank stops at once.
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        return not grads or bool(torch.isfinite(torch.stack([g.detach().float().sum() for g in grads])).all())

    @contextlib.contextmanager
    def _collectives(self, what: str):
        """Turns a failed or timed-out collective inside the block into one message naming the missing rank."""
        try:
            yield
        except RuntimeError as exc:
            if self.progress is None or not is_collective_failure(exc):
                raise
            raise CollectiveError(
                f"rank {self.rank}: a collective of {what} failed after at most "
                f"{collective_timeout().total_seconds():g} s ({TIMEOUT_ENV}): {self.progress.laggards()}; check "
                f"its log. ({first_line(exc)})") from None

    def _step(self, batch) -> float:
        self.resources.check_batch(batch)
        # DDP's collectives run in forward (bucket rebuilds) and backward (the gradient all-reduce).
        with self._collectives(f"DDP in iteration {self.iterations_done}"):
            return self._train_step(batch)

    def _train_step(self, batch) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        emb = getattr(batch, "emb", None)  # a heterogeneous batch has none
        if emb is not None:
            emb.requires_grad_(True)  # a leaf: its gradient is the rows' sparse gradient
        loss = self.task.loss(self.model, batch)
        loss.backward()
        loss_value = float(loss.detach())  # syncs the device, so the train time is complete
        if emb is not None and emb.grad is None:  # a model that left them out of the loss
            emb.grad = torch.zeros_like(emb)
        emb_finite = emb is None or bool(torch.isfinite(emb.grad).all())
        if not math.isfinite(loss_value) or not self._grads_finite() or not emb_finite:
            raise TrainingDiverged(
                f"the loss or its gradients became {loss_value if not math.isfinite(loss_value) else 'non-finite'} "
                f"at iteration {self.iterations_done}; the weights were not updated. Lower train.lr (now "
                f"{self.cfg.train.lr:g}), check the features for NaN/inf, and resume from the last checkpoint")
        self.optimizer.step()
        if emb is not None:
            start = time.perf_counter()
            with self._collectives(f"the node embeddings' update in iteration {self.iterations_done}"):
                io = self.embedding.step(batch.input_nodes, emb.grad)
            batch.timings["update"] = time.perf_counter() - start
            batch.io = {**batch.io, **{k: batch.io.get(k, 0) + v for k, v in io.items()}}
        return loss_value

    def _new_epoch_state(self, epoch: int) -> dict:
        return {"epoch": epoch, "losses": [], "stages": dict.fromkeys(ALL_STAGES, 0.0), "wall": 0.0,
                "totals": dict.fromkeys(TOTALS, 0)}

    def train_epoch(self, progress: bool) -> StageTimes:
        """Trains the rest of the loader's current epoch (or up to the iteration limit), adding to
        ``epoch_state``; returns this call's stage times."""
        from tqdm import tqdm

        cfg = self.cfg
        times = StageTimes()
        epoch = self.loader.state_dict()["epoch"]
        if self.epoch_state is None or self.epoch_state["epoch"] != epoch:
            self.epoch_state = self._new_epoch_state(epoch)
        state, totals = self.epoch_state, self.epoch_state["totals"]
        self.model.train()
        bar = tqdm(total=len(self.loader), initial=self.loader.state_dict()["position"], unit="batch",
                   desc=f"epoch {epoch}", disable=not progress or self.rank != 0, file=sys.stderr, leave=False,
                   mininterval=0.2 if sys.stderr.isatty() else 10.0)  # keep logs of non-interactive runs short
        cached = self.features.caches
        epoch_start = time.perf_counter()
        batches, until = self._segment()
        try:
            while not self._limit_reached():
                if self.progress is not None:
                    self.progress.mark(self.iterations_done)
                t0 = time.perf_counter()
                with self._sized(f"at iteration {self.iterations_done}"):
                    batch = next(batches, None)
                if batch is None:
                    break
                wait = time.perf_counter() - t0
                t1 = time.perf_counter()
                loss_value = self._step(batch_to(batch, self.device))
                stage = {**batch.timings, "wait": wait, "train": time.perf_counter() - t1 - batch.timings.get(
                    "update", 0.0)}
                times.add(stage)
                for k in ALL_STAGES:  # a checkpoint from before the embedding stages lacks them
                    state["stages"][k] = state["stages"].get(k, 0.0) + stage.get(k, 0.0)
                state["losses"].append(loss_value)
                self.iterations_done += 1
                io = batch.io
                totals["hits"] += batch.hits
                totals["unique"] += batch.gathered
                totals["bytes_read"] += io["bytes_read"]
                totals["bytes_useful"] += io["bytes_useful"]
                for key in ("pvp_hits", "bytes_saved", "embedding_bytes_read", "embedding_bytes_written"):
                    totals[key] = totals.get(key, 0) + io.get(key, 0)  # with PVP, with node embeddings
                record = {"iteration": batch.iteration, "epoch": epoch, "loss": loss_value,
                          "time": {k: round(stage.get(k, 0.0), 6) for k in STAGES},
                          "hit_ratio": batch.hit_ratio if cached else None, "bytes_read": io["bytes_read"],
                          "amplification": io["bytes_read"] / io["bytes_useful"] if io["bytes_useful"] else None}
                if "pvp_hits" in io:
                    record.update(pvp_hits=io["pvp_hits"], bytes_saved=io["bytes_saved"])
                if self.hetero and cached:
                    record["hit_ratio_by_type"] = batch.hit_ratios()
                if self.iterations_done % cfg.log.every == 0:
                    self.log.write(record)
                bar.update(1)
                bar.set_postfix(loss=f"{loss_value:.4f}",
                                hit="-" if record["hit_ratio"] is None else f"{record['hit_ratio']:.2f}")
                position = self.loader.state_dict()
                if position["position"] == until:  # an evaluation in mid-epoch (before this iteration's checkpoint)
                    times.wall += time.perf_counter() - epoch_start
                    batches.close()  # the loader's thread has stopped after this batch on every rank
                    if self.embedding is not None:
                        self.embedding.open()
                    self._evaluate_all(epoch)
                    epoch_start = time.perf_counter()
                    if self._limit_reached():  # stopped early
                        break
                    self.loader.load_state_dict(position)
                    batches, until = self._segment()
                if cfg.checkpoint.every and self.iterations_done % cfg.checkpoint.every == 0:
                    times.wall += time.perf_counter() - epoch_start
                    epoch_start = time.perf_counter()
                    self.save_checkpoint()
                if self.embedding is not None:  # the next batch may read the rows now
                    self.embedding.release(batch.iteration + 1)
        finally:
            bar.close()
            batches.close()
            if self.embedding is not None:
                self.embedding.open()
        times.wall += time.perf_counter() - epoch_start  # training time only, evaluations left out
        state["wall"] += times.wall
        return times

    def _segment(self):
        """(the loader's batches up to the next evaluation due by train.eval_every, that position), or
        (the rest of the epoch, None): the loader's thread must not gather alongside an evaluation."""
        every, until = self.cfg.train.eval_every, None
        if every and self.cfg.train.eval_splits:
            stop = self.loader.state_dict()["position"] + every - self.iterations_done % every
            until = stop if stop < len(self.loader) else None  # at the epoch's end: evaluated there
        if self.embedding is not None:  # each batch reads the rows after the update of the one before
            self.embedding.hold(self.loader.state_dict()["iteration"])
        return self.loader.iterate(until), until

    def _summarize_epoch(self, complete: bool) -> dict:
        """The epoch's summary from ``epoch_state``; a complete epoch is also evaluated."""
        state = self.epoch_state
        totals, losses = state["totals"], state["losses"]
        cached = self.features.caches
        summary = {"epoch": state["epoch"], "complete": complete, "iterations": len(losses),
                   "loss": float(np.mean(losses)) if losses else float("nan"), "wall_s": state["wall"],
                   "stages_s": dict(state["stages"]),
                   "hit_ratio": totals["hits"] / totals["unique"] if totals["unique"] and cached else None,
                   "bytes_read": totals["bytes_read"],
                   "amplification": totals["bytes_read"] / totals["bytes_useful"] if totals["bytes_useful"] else None}
        if "pvp_hits" in self.features.counters():  # a cache with a victim buffer
            summary.update(pvp_hits=totals["pvp_hits"], bytes_saved=totals["bytes_saved"])
        if self.embedding is not None:  # this rank's reads of the table and writes to it (checkpoint flushes aside)
            summary.update(embedding_bytes_read=totals.get("embedding_bytes_read", 0),
                           embedding_bytes_written=totals.get("embedding_bytes_written", 0))
        if complete and self.cfg.train.eval_splits and self._epoch_eval_due(state["epoch"]):
            summary.update({s: m for s, m in self._evaluate_all(state["epoch"]).items()
                            if s in self.cfg.train.eval_splits})
        if self.history and self.history[-1]["epoch"] == summary["epoch"] and not self.history[-1]["complete"]:
            self.history[-1] = summary  # a stopped epoch went on: its summary now covers all of it
        else:
            self.history.append(summary)
        return summary

    # -- model selection -----------------------------------------------------------------------------------------

    @staticmethod
    def _new_selection() -> dict:
        return {"best": None, "evaluation": None, "since_best": 0, "stopped": False}

    def _iteration_eval_due(self) -> bool:
        every = self.cfg.train.eval_every
        return bool(every) and bool(self.cfg.train.eval_splits) and self.iterations_done % every == 0

    def _epoch_eval_due(self, epoch: int) -> bool:
        """Whether a complete epoch ends in an evaluation: every train.eval_every_epochs-th, the last, and one
        whose last iteration is due by train.eval_every."""
        every = self.cfg.train.eval_every_epochs
        return ((bool(every) and (epoch + 1) % every == 0) or epoch + 1 == self.cfg.train.epochs
                or self._iteration_eval_due())

    def _evaluate_all(self, epoch: int) -> dict:
        """Evaluates every split of train.eval_splits, logs it, updates the selection (best.pt, early stop)."""
        record = {"epoch": epoch, "iterations": self.iterations_done}
        for split in self.cfg.train.eval_splits:
            record[split] = self.evaluate(split)
        self.evaluations.append(record)
        self.log.write({"evaluation": record})
        if self.watch:
            self._select(record)
        return record

    def _select(self, record: dict) -> None:
        split, metric, mode = self.watch
        es, sel = self.cfg.train.early_stopping, self.selection
        value = float(record[split][metric])
        best = sel["best"]
        if mode == "max":
            better = best is None or value > best + es.min_delta
        else:
            better = best is None or value < best - es.min_delta
        better = better and math.isfinite(value)
        if self._distributed():  # rank 0 decides for all: metrics summed over ranks may differ in the last bit
            import torch.distributed as dist

            decision = [better]
            with self._collectives(f"model selection after iteration {self.iterations_done}"):
                dist.broadcast_object_list(decision, src=0)
            better = decision[0]
        if better:
            sel.update(best=value, evaluation=record, since_best=0)
            if self.best_path is not None:  # this evaluation's state, the selection included
                self.save_checkpoint(self.best_path)
            # last.pt is not written here: the checkpoint after the epoch summary (or the next one) records this
            # selection with the log lines of the same evaluation, so a kill in between redoes both, once.
        else:
            sel["since_best"] += 1
        if es.patience and sel["since_best"] >= es.patience:
            sel["stopped"] = True

    def best_summary(self) -> dict | None:
        """The best evaluation by the watched metric: which it is, when, every split's metrics there, best.pt."""
        if not self.watch or self.selection["evaluation"] is None:
            return None
        split, metric, mode = self.watch
        record = self.selection["evaluation"]
        return {"metric": f"{split}.{metric}", "mode": mode, "value": self.selection["best"],
                "epoch": record["epoch"], "iterations": record["iterations"],
                "eval": {s: record[s] for s in self.cfg.train.eval_splits if s in record},
                "checkpoint": self.best_path, "stopped_early": self.selection["stopped"]}

    def evaluate(self, split: str) -> dict:
        self.model.eval()
        if self.progress is not None:
            self.progress.mark(self.iterations_done)  # ranks that have not finished the epoch are behind
        with self._collectives(f"the evaluation on {split} after iteration {self.iterations_done}"), \
                self._sized(f"evaluating on {split}"):
            result = self.task.evaluate(self.module, self.features, split, self.device, self.rank, self.world_size)
        self.model.train()
        return result

    def fit(self) -> dict:
        cfg = self.cfg
        size = (f"{self.dataset.total_nodes:,} nodes of {len(self.dataset.node_types)} types, target "
                f"{self.dataset.target}" if self.hetero else f"{self.dataset.num_nodes:,} nodes")
        self._print(f"training {cfg.model.kind} on {self.dataset.name} ({size}) "
                    f"with features from {self._describe_features()}; {self.world_size} rank(s), "
                    f"device {self.device}")
        if self.embedding is not None:
            self._print(f"with {self.embedding.describe()}")
        for fit in self.cache_fits:
            self._print(f"cache sizing: {fit.describe()}")
        verify_mode = self.resources.verify_mode
        if cfg.data.verify == "auto" and verify_mode == "off" and self.rank == 0:
            self._print("data.verify=auto: off for this dataset (over 64 GiB, or written without block checksums); "
                        "data.verify=checksums re-reads its files beside training")
        if self.resources.verify is not None:
            self._print(f"data.verify={verify_mode}: checking "
                        + ("every file" if verify_mode == "checksums" else "the blocks read by a sample of each "
                           "batch's input nodes") + " against its checksums, beside training")
        total = StageTimes()
        try:
            while True:
                if self.epoch_state is not None and self.loader.state_dict()["epoch"] > self.epoch_state["epoch"]:
                    # Every batch of the epoch has trained (perhaps before a restart): evaluate and summarize.
                    self._end_epoch(complete=True)
                    continue
                if self.loader.state_dict()["epoch"] >= cfg.train.epochs or self._limit_reached():
                    break
                times = self.train_epoch(cfg.log.progress)
                for k in ALL_STAGES:
                    total.seconds[k] += times.seconds[k]
                total.iterations += times.iterations
                total.wall += times.wall
                if self._limit_reached() and self.loader.state_dict()["epoch"] == self.epoch_state["epoch"]:
                    self._end_epoch(complete=False)  # stopped inside the epoch: a partial summary
            if self.embedding is not None and self.checkpoint_path is None:  # no checkpoint committed the table
                total.seconds["write-back"] += self.embedding.flush()
                self._commit_table(self.embedding.table.generation + 1)
            waited = self.resources.finish_verify()  # a run that ends normally read only data that matched
            if waited > 1:
                self._print(f"data.verify={self.resources.verify_mode}: waited {waited:.1f}s for the last checks")
            return self._finish(total)
        finally:
            self.loader.close()
            self.log.close()
            self.resources.stop_verify()

    def close(self) -> None:
        """Ends the run's hold on its files: closes the loader, the log and the embedding table, and gives up the
        directory locks (a process's exit does all of this too)."""
        self.loader.close()
        self.log.close()
        if self.embedding is not None:
            self.embedding.close()
        self.resources.close()

    def _finish(self, total: StageTimes) -> dict:
        """The run's result: prints the per-stage table, the last and the best evaluation; logs them."""
        cfg = self.cfg
        self._print("\nper-stage time (this run)\n" + total.table())
        last_eval = {}
        for record in self.evaluations or self.history:  # a checkpoint from before evaluations were kept
            last_eval.update({s: record[s] for s in cfg.train.eval_splits if s in record})
        best = self.best_summary()
        result = {"iterations": self.iterations_done, "history": self.history, "evaluations": self.evaluations,
                  "stages_s": total.seconds, "wall_s": total.wall, "eval": last_eval, "best": best,
                  "checkpoint": self.checkpoint_path}
        if self.resources.verify is not None:
            result["data_verify"] = self.resources.verify.summary()
        for split, metrics in last_eval.items():
            self._print(f"{split}: {_metrics_text(metrics)}")
        if best is not None and best["stopped_early"]:
            self._print(f"stopped early: {best['metric']} did not improve on the best in "
                        f"{cfg.train.early_stopping.patience} evaluation(s) after it")
        if best is not None:
            self._print(f"best {best['metric']} {best['value']:.4f} at epoch {best['epoch']}, after "
                        f"{best['iterations']} iterations{' (stopped early)' if best['stopped_early'] else ''}"
                        f"{', ' + best['checkpoint'] if best['checkpoint'] else ''}")
            for split, metrics in best["eval"].items():
                self._print(f"  {split} there: {_metrics_text(metrics)}")
        self.log.write({"run_summary": {"iterations": self.iterations_done, "eval": last_eval, "best": best}})
        return result

    def _end_epoch(self, complete: bool) -> None:
        if complete and self.cfg.train.eval_splits and self._epoch_eval_due(self.epoch_state["epoch"]):
            # The epoch's training is kept before its evaluation runs: an evaluation that fails (a batch the cache
            # refuses, a collective timeout) costs the evaluation only; a resumed run evaluates from here.
            self.save_checkpoint()
        summary = self._summarize_epoch(complete)
        if complete:
            self.epoch_state = None  # kept after a partial summary: a resumed run continues the epoch
        self.log.write({"epoch_summary": summary})
        self._print(self._epoch_line(summary))
        self.save_checkpoint()

    def _describe_features(self) -> str:
        mode = f" (cache.mode={self.cfg.cache.mode})" if self.world_size > 1 and self.features.caches else ""
        return self.features.describe() + mode

    @staticmethod
    def _epoch_line(s: dict) -> str:
        parts = [f"epoch {s['epoch']}{'' if s['complete'] else ' (partial)'}: {s['iterations']} it",
                 f"loss {s['loss']:.4f}", f"{s['wall_s']:.1f}s"]
        if s["hit_ratio"] is not None:
            parts.append(f"hit {s['hit_ratio']:.3f}")
        if "pvp_hits" in s:
            parts.append(f"pvp hits {s['pvp_hits']:,} ({s['bytes_saved'] / 2**20:.1f} MiB saved)")
        if s["amplification"] is not None:
            parts.append(f"read {s['bytes_read'] / 2**20:.1f} MiB (ampl. {s['amplification']:.2f})")
        if "embedding_bytes_read" in s:
            parts.append(f"table read {s['embedding_bytes_read'] / 2**20:.1f} MiB, written "
                         f"{s['embedding_bytes_written'] / 2**20:.1f} MiB")
        for split in ("val", "test", "train"):
            if split in s:
                metric = next(iter(s[split].items()))
                parts.append(f"{split} {metric[0]} {metric[1]:.4f}")
        return "  ".join(parts)


def _metrics_text(metrics: dict) -> str:
    return ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())


def train(cfg: Config, out=None) -> dict:
    """``Trainer(cfg).fit()``, closed at the end: its locks, table and ``kernels=`` scope last as long as the run."""
    with Trainer(cfg, out=out) as trainer:
        return trainer.fit()
