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

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from lsm_gnn.cache import SoftwareCache
from lsm_gnn.config import Config, ConfigError, cache_capacity_bytes
from lsm_gnn.loader import NodeLoader
from lsm_gnn.parallel import all_reduce_sum, batch_to

CHECKPOINT_FORMAT = "lsm-gnn-checkpoint"
CHECKPOINT_VERSION = 1
STAGES = ("sample", "gather", "exchange", "wait", "train")  # exchange: the part of gather spent between ranks
# Settings a resumed run must share with the checkpoint, or its losses would differ.
RESUME_KEYS = ("dataset", "model", "sampler", "train.task", "train.seed", "train.lr", "train.weight_decay")


# -- distributed -------------------------------------------------------------------------------------------------

def distributed_context(device: torch.device) -> tuple[int, int]:
    """(rank, world size); initialises torch.distributed from torchrun's or MPI's environment if needed."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    env = os.environ
    rank = env.get("RANK", env.get("OMPI_COMM_WORLD_RANK", env.get("PMI_RANK")))
    world = env.get("WORLD_SIZE", env.get("OMPI_COMM_WORLD_SIZE", env.get("PMI_SIZE")))
    if rank is None or world is None:
        return 0, 1
    if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
        raise RuntimeError("a distributed launch needs MASTER_ADDR and MASTER_PORT in the environment "
                           "(torchrun sets them; with mpirun use launch/mpirun.sh)")
    from datetime import timedelta

    backend = "nccl" if device.type == "cuda" else "gloo"
    # A finite timeout: a rank that dies makes the others fail instead of hanging.
    dist.init_process_group(backend, rank=int(rank), world_size=int(world),
                            timeout=timedelta(seconds=float(env.get("LSM_GNN_TIMEOUT_S", 300))))
    return dist.get_rank(), dist.get_world_size()


# -- features ----------------------------------------------------------------------------------------------------

def build_features(cfg: Config, dataset, device: torch.device, world_size: int = 1):
    """The feature path a config asks for: the cache over storage (shared by the ranks or one per rank),
    storage alone, or RAM."""
    from lsm_gnn.storage import open_storage

    c = cfg.cache
    if c.features == "memory":
        return open_storage(dataset, "memory")
    storage = open_storage(dataset, c.backend)
    if c.features == "storage":
        return storage
    cache = _build_cache(cfg, dataset, storage, device)
    if world_size > 1 and c.mode == "shared":
        from lsm_gnn.comm import SharedCache, make_owner

        owner = make_owner(c.owner, dataset, world_size, fanouts=cfg.sampler.fanouts,
                           batch_size=cfg.sampler.batch_size, seed=cfg.train.seed)
        return SharedCache(cache, owner)
    return cache


def _build_cache(cfg: Config, dataset, storage, device):
    c = cfg.cache
    static = None
    if c.static_score != "none":
        if c.static_score not in dataset.score_names:
            raise ConfigError(f"cache.static_score={c.static_score!r} is not in the dataset (it has "
                              f"{dataset.score_names or 'no scores'}); prepare it with scores or set "
                              "cache.static_score=none")
        static = dataset.score(c.static_score)
    capacity = cache_capacity_bytes(c.capacity, dataset.num_nodes, storage.row_bytes)
    policy = None if c.policy == "auto" else c.policy  # None: the cache picks (hybrid, or hybrid_pvp_room with PVP)
    return SoftwareCache(storage, capacity, ways=c.ways, policy=policy, window=c.window, period=c.period,
                         static_scores=static, oversubscribe=c.oversubscribe, device=device,
                         num_threads=cfg.sampler.num_threads, pvp=c.pvp, pvp_queue_capacity=c.pvp_queue_capacity,
                         pvp_reinstall=c.pvp and c.pvp_reinstall)


def _storage_of(features):
    return getattr(features, "storage", features)


# -- tasks -------------------------------------------------------------------------------------------------------

class NodeClassification:
    """Cross-entropy on the train split; accuracy on the evaluation splits."""

    name = "node"

    def __init__(self, cfg: Config, dataset):
        if dataset.labels is None or dataset.num_classes is None:
            raise ConfigError(f"dataset {dataset.path} has no labels; node classification needs them "
                              "(or set train.task=link for a user-item dataset)")
        self.cfg, self.dataset = cfg, dataset
        self.out_dim = int(dataset.num_classes)
        self.splits = sorted(dataset.meta.get("splits", {}))

    def train_loader(self, features, rank: int, world_size: int) -> NodeLoader:
        c = self.cfg
        return NodeLoader(self.dataset, features, c.sampler.fanouts, c.sampler.batch_size, shuffle=True,
                          window=c.cache.window, seed=c.train.seed, rank=rank, world_size=world_size,
                          num_threads=c.sampler.num_threads)

    def loss(self, model, batch) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(model(batch), batch.y)

    @torch.no_grad()
    def evaluate(self, model, features, split: str, device, rank: int, world_size: int) -> dict:
        seeds = np.asarray(self.dataset.split(split))
        correct = total = 0
        if seeds.size >= world_size:
            c = self.cfg
            # Equal shares per rank (fewer than world_size nodes left out): the exchange is collective.
            loader = NodeLoader(self.dataset, features, c.sampler.fanouts, c.train.eval_batch_size or c.sampler.batch_size,
                                seeds=seeds, shuffle=False, window=c.cache.window, seed=c.train.seed + 1,
                                rank=rank, world_size=world_size, num_threads=c.sampler.num_threads)
            for batch in loader:
                batch = batch_to(batch, device)
                correct += int((model(batch).argmax(1) == batch.y).sum())
                total += batch.y.numel()
        correct, total = all_reduce_sum([correct, total])
        return {"accuracy": correct / total if total else float("nan"), "count": int(total)}


def make_task(cfg: Config, dataset):
    if cfg.train.task == "node":
        return NodeClassification(cfg, dataset)
    from lsm_gnn.linkpred import LinkPrediction

    return LinkPrediction(cfg, dataset)


# -- metrics -----------------------------------------------------------------------------------------------------

@dataclass
class StageTimes:
    """Seconds per stage, summed over iterations. sample and gather run in the
    loader's thread, overlapped with training; wait is what training lost
    waiting for them."""

    seconds: dict = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    iterations: int = 0
    wall: float = 0.0

    def add(self, times: dict) -> None:
        for k in STAGES:
            self.seconds[k] += times.get(k, 0.0)
        self.iterations += 1

    def table(self) -> str:
        n = max(self.iterations, 1)
        rows = [f"{'stage':<10}{'total s':>10}{'ms/iter':>10}{'of wall':>9}"]
        for k in STAGES:
            share = self.seconds[k] / self.wall if self.wall else 0.0
            rows.append(f"{k:<10}{self.seconds[k]:>10.2f}{1e3 * self.seconds[k] / n:>10.1f}{share:>9.1%}")
        rows.append(f"{'wall':<10}{self.wall:>10.2f}{1e3 * self.wall / n:>10.1f}{1:>9.0%}")
        rows.append("(sample and gather run in the background, overlapped with train; wait is the stall they caused)")
        return "\n".join(rows)


class MetricsLog:
    """JSON lines (rank 0) and optional TensorBoard scalars."""

    def __init__(self, cfg: Config, rank: int):
        self.file = self.board = None
        if rank != 0 or not cfg.log.dir:
            return
        os.makedirs(cfg.log.dir, exist_ok=True)
        self.file = open(os.path.join(cfg.log.dir, "metrics.jsonl"), "a")
        if cfg.log.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise ConfigError("log.tensorboard=true needs the tensorboard package: pip install tensorboard") \
                    from exc
            self.board = SummaryWriter(os.path.join(cfg.log.dir, "tensorboard"))

    def write(self, record: dict) -> None:
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
        if self.board is not None and "iteration" in record:
            for key, value in _flatten(record).items():
                if isinstance(value, (int, float)) and key not in ("iteration", "epoch"):
                    self.board.add_scalar(key, value, record["iteration"])

    def close(self) -> None:
        for h in (self.file, self.board):
            if h is not None:
                h.close()


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out


# -- checkpoints -------------------------------------------------------------------------------------------------

def atomic_torch_save(obj, path: str) -> None:
    """Writes ``path`` so that readers see the old file or the whole new one, never a torn one."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".pt", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)


def load_checkpoint(path: str) -> dict:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise ValueError(f"{path} is not a readable lsm-gnn checkpoint: {exc}") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not an lsm-gnn checkpoint")
    if ckpt.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"{path} has checkpoint version {ckpt.get('version')}; this lsm-gnn reads version "
                         f"{CHECKPOINT_VERSION}")
    return ckpt


def _lookup(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d[part]
    return d


# -- the trainer -------------------------------------------------------------------------------------------------

class Trainer:
    """Trains ``cfg`` end to end: ``Trainer(cfg).fit()`` returns a summary dict.

    ``features`` replaces the feature path the config describes: any object
    with ``read(ids)`` and ``stats()`` (a storage) or a SoftwareCache.
    """

    def __init__(self, cfg: Config, out=None, features=None):
        from lsm_gnn.data import open_dataset
        from lsm_gnn.models import HopGNN

        if not cfg.dataset:
            raise ConfigError("no dataset: set dataset=<directory> (make one with lsm-gnn prepare)")
        self.cfg = cfg
        self.out = sys.stdout if out is None else out
        self.dataset = open_dataset(cfg.dataset, check="fast")
        self.device = self._device(cfg.train.device)
        if self.device.type == "cuda" and self.device.index is None:
            # One GPU per rank on a node: the launcher's local rank picks it.
            local = os.environ.get("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
            self.device = torch.device("cuda", int(local) % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        self.rank, self.world_size = distributed_context(self.device)
        self.task = make_task(cfg, self.dataset)
        missing = [s for s in cfg.train.eval_splits if s not in self.task.splits]
        if missing:  # fail now, not after the first epoch
            raise ConfigError(f"train.eval_splits has {missing}, which dataset {self.dataset.path} lacks; it has "
                              f"{self.task.splits or 'none'}: set train.eval_splits={self.task.splits}")
        self.features = (build_features(cfg, self.dataset, self.device, self.world_size) if features is None
                         else features)
        torch.manual_seed(cfg.train.seed)
        self.module = HopGNN(cfg.model.kind, self.dataset.feature_dim, cfg.model.hidden, self.task.out_dim,
                             num_layers=len(cfg.sampler.fanouts), heads=cfg.model.heads,
                             dropout=cfg.model.dropout).to(self.device)
        self.model = self.module
        if self._distributed():
            from torch.nn.parallel import DistributedDataParallel

            self.model = DistributedDataParallel(self.module)
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=cfg.train.lr,
                                          weight_decay=cfg.train.weight_decay)
        self.loader = self.task.train_loader(self.features, self.rank, self.world_size)
        self.iterations_done = 0
        self.history: list[dict] = []
        self.log = MetricsLog(cfg, self.rank)
        self.checkpoint_path = os.path.join(cfg.checkpoint.dir, "last.pt") if cfg.checkpoint.dir else None
        self.resumed_from = None
        if self.checkpoint_path and cfg.checkpoint.resume and os.path.exists(self.checkpoint_path):
            self.resume(self.checkpoint_path)

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

    def _print(self, *args) -> None:
        if self.rank == 0:
            print(*args, file=self.out, flush=True)

    # -- checkpoints ---------------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "config": self.cfg.to_dict(),
                "model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                "loader": self.loader.state_dict(), "iterations_done": self.iterations_done,
                "history": self.history, "rng": rng, "world_size": self.world_size, "time": time.time()}

    def save_checkpoint(self, path: str | None = None) -> str | None:
        path = path or self.checkpoint_path
        if path is None:
            return None
        if self.rank == 0:
            atomic_torch_save(self.state_dict(), path)
        return path

    def resume(self, path: str) -> None:
        ckpt = load_checkpoint(path)
        saved, now = ckpt["config"], self.cfg.to_dict()
        differ = [k for k in RESUME_KEYS if _lookup(saved, k) != _lookup(now, k)]
        if differ:
            detail = "; ".join(f"{k}: saved {_lookup(saved, k)!r}, now {_lookup(now, k)!r}" for k in differ)
            raise ConfigError(f"cannot resume from {path}: the run's settings changed ({detail}). Use the saved "
                              "settings, or start fresh with checkpoint.resume=false or another checkpoint.dir")
        if ckpt["world_size"] != self.world_size:
            raise ConfigError(f"{path} was written by {ckpt['world_size']} ranks; this run has {self.world_size}")
        self.module.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.loader.load_state_dict(ckpt["loader"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        if "cuda" in ckpt["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
        self.iterations_done = ckpt["iterations_done"]
        self.history = list(ckpt["history"])
        self.resumed_from = path
        self._print(f"resumed from {path}: epoch {ckpt['loader']['epoch']}, "
                    f"{ckpt['loader']['position']} batches into it, iteration {self.iterations_done}")

    # -- training ------------------------------------------------------------------------------------------------

    def _limit_reached(self) -> bool:
        limit = self.cfg.train.max_iterations
        return bool(limit) and self.iterations_done >= limit

    def train_epoch(self, progress: bool) -> tuple[StageTimes, float, dict]:
        """One epoch (or what is left of it); returns (stage times, mean loss, counter deltas)."""
        from tqdm import tqdm

        cfg = self.cfg
        times = StageTimes()
        epoch = self.loader.state_dict()["epoch"]
        totals = dict.fromkeys(("hits", "unique", "bytes_read", "bytes_useful", "pvp_hits", "bytes_saved"), 0)
        losses = []
        self.model.train()
        bar = tqdm(total=len(self.loader), initial=self.loader.state_dict()["position"], unit="batch",
                   desc=f"epoch {epoch}", disable=not progress or self.rank != 0, file=sys.stderr, leave=False,
                   mininterval=0.2 if sys.stderr.isatty() else 10.0)  # keep logs of non-interactive runs short
        cached = hasattr(self.features, "lookup")
        epoch_start = time.perf_counter()
        batches = iter(self.loader)
        try:
            while not self._limit_reached():
                t0 = time.perf_counter()
                batch = next(batches, None)
                if batch is None:
                    break
                wait = time.perf_counter() - t0
                t1 = time.perf_counter()
                batch = batch_to(batch, self.device)
                self.optimizer.zero_grad(set_to_none=True)
                loss = self.task.loss(self.model, batch)
                loss.backward()
                self.optimizer.step()
                loss_value = float(loss.detach())  # syncs the device, so the train time is complete
                stage = {**batch.timings, "wait": wait, "train": time.perf_counter() - t1}
                times.add(stage)
                losses.append(loss_value)
                self.iterations_done += 1
                io = batch.io
                totals["hits"] += int(batch.hit_mask.sum())
                totals["unique"] += batch.hit_mask.numel()
                totals["bytes_read"] += io["bytes_read"]
                totals["bytes_useful"] += io["bytes_useful"]
                for key in ("pvp_hits", "bytes_saved"):  # with the victim-buffer prefetcher on
                    totals[key] += io.get(key, 0)
                record = {"iteration": batch.iteration, "epoch": epoch, "loss": loss_value,
                          "time": {k: round(stage.get(k, 0.0), 6) for k in STAGES},
                          "hit_ratio": batch.hit_ratio if cached else None, "bytes_read": io["bytes_read"],
                          "amplification": io["bytes_read"] / io["bytes_useful"] if io["bytes_useful"] else None}
                if "pvp_hits" in io:
                    record.update(pvp_hits=io["pvp_hits"], bytes_saved=io["bytes_saved"])
                if self.iterations_done % cfg.log.every == 0:
                    self.log.write(record)
                bar.update(1)
                bar.set_postfix(loss=f"{loss_value:.4f}",
                                hit="-" if record["hit_ratio"] is None else f"{record['hit_ratio']:.2f}")
                if cfg.checkpoint.every and self.iterations_done % cfg.checkpoint.every == 0:
                    self.save_checkpoint()
        finally:
            bar.close()
            if hasattr(batches, "close"):
                batches.close()
        times.wall = time.perf_counter() - epoch_start
        return times, (float(np.mean(losses)) if losses else float("nan")), totals

    def evaluate(self, split: str) -> dict:
        self.model.eval()
        result = self.task.evaluate(self.module, self.features, split, self.device, self.rank, self.world_size)
        self.model.train()
        return result

    def fit(self) -> dict:
        cfg = self.cfg
        self._print(f"training {cfg.model.kind} on {self.dataset.name} ({self.dataset.num_nodes:,} nodes) "
                    f"with features from {self._describe_features()}; {self.world_size} rank(s), "
                    f"device {self.device}")
        total = StageTimes()
        last_eval: dict = {}
        try:
            while self.loader.state_dict()["epoch"] < cfg.train.epochs and not self._limit_reached():
                epoch = self.loader.state_dict()["epoch"]
                cached = hasattr(self.features, "lookup")
                times, mean_loss, delta = self.train_epoch(cfg.log.progress)
                finished = self.loader.state_dict()["epoch"] > epoch
                for k in STAGES:
                    total.seconds[k] += times.seconds[k]
                total.iterations += times.iterations
                total.wall += times.wall
                summary = {"epoch": epoch, "complete": finished, "iterations": times.iterations,
                           "loss": mean_loss, "wall_s": times.wall, "stages_s": times.seconds,
                           "hit_ratio": delta["hits"] / delta["unique"] if delta["unique"] and cached else None,
                           "bytes_read": delta["bytes_read"],
                           "amplification": delta["bytes_read"] / delta["bytes_useful"] if delta["bytes_useful"]
                           else None}
                if self.loader.pvp is not None:
                    summary.update(pvp_hits=delta["pvp_hits"], bytes_saved=delta["bytes_saved"])
                if finished:
                    for split in cfg.train.eval_splits:
                        summary[split] = last_eval[split] = self.evaluate(split)
                self.history.append(summary)
                self.log.write({"epoch_summary": summary})
                self._print(self._epoch_line(summary))
                self.save_checkpoint()
        finally:
            self.loader.close()
            self.log.close()
        self._print("\nper-stage time (this run)\n" + total.table())
        result = {"iterations": self.iterations_done, "history": self.history, "stages_s": total.seconds,
                  "wall_s": total.wall, "eval": last_eval, "checkpoint": self.checkpoint_path}
        for split, metrics in last_eval.items():
            self._print(f"{split}: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                                 for k, v in metrics.items()))
        return result

    def _describe_features(self) -> str:
        f = self.features
        shared = hasattr(f, "owner") and isinstance(getattr(f, "cache", None), SoftwareCache)
        if shared:
            f = f.cache
        if isinstance(f, SoftwareCache):
            from lsm_gnn.units import format_bytes

            scope = (f"per rank, shared by {self.world_size} ranks ({self.features.owner.name} ownership)" if shared
                     else "per rank, isolated" if self.world_size > 1 else "")
            return (f"a {format_bytes(f.capacity_bytes)} {f.policy.name} cache ({f.num_lines:,} lines, "
                    f"{f.num_lines / self.dataset.num_nodes:.2%} of nodes){' ' + scope if scope else ''} over "
                    f"{f.storage.backend} storage")
        return f"{_storage_of(f).backend} storage, no cache"

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
        for split in ("val", "test", "train"):
            if split in s:
                metric = next(iter(s[split].items()))
                parts.append(f"{split} {metric[0]} {metric[1]:.4f}")
        return "  ".join(parts)


def train(cfg: Config, out=None) -> dict:
    """``Trainer(cfg).fit()``."""
    return Trainer(cfg, out=out).fit()
