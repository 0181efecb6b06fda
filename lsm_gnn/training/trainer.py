"""The built-in trainer: a config in, a trained model, metrics and checkpoints out.

It runs under DDP whenever torch.distributed is initialised (or the
environment of torchrun / mpirun says so), with one rank or many, and as a
plain process otherwise; the code path is the same. Per iteration it
records the time of each stage, the hit ratio and the bytes read; a
checkpoint holds everything needed to continue exactly where it stopped
(model, optimizer, loader position, RNG), so a resumed run computes the
same losses as an uninterrupted one.

This module is the loop; its parts live in :mod:`lsm_gnn.training` (metrics, checkpointing, model selection,
the collectives between ranks, the checks at the start).
"""
from __future__ import annotations

import math
import sys
import time
import weakref
from functools import partial

import torch

from lsm_gnn.build import cache_label, resolve
from lsm_gnn.comm.distributed import batch_to, distributed_context
from lsm_gnn.comm.group import ProgressBoard, check_agreement
from lsm_gnn.config import Config, ConfigError
from lsm_gnn.loader import keyed_features
from lsm_gnn.models import build_model, model_form
from lsm_gnn.tasks import make_task
from lsm_gnn.training import startup
from lsm_gnn.training.checkpoint_files import CheckpointError, atomic_torch_save, load_checkpoint
from lsm_gnn.training.checkpointing import RESUME_KEYS, Checkpointer
from lsm_gnn.training.metrics import (ALL_STAGES, EMBEDDING_STAGES, STAGES, TOTALS, MetricsLog, StageTimes,
                                      add_iteration, epoch_line, epoch_summary, flatten,
                                      iteration_record, last_evaluation, new_epoch_state, ratios_text,
                                      result_lines, run_hit_ratios_by_type)
from lsm_gnn.training.ranks import Ranks, distributed
from lsm_gnn.training.resources import RunResources
from lsm_gnn.training.selection import ModelSelection, best_checkpoint_path, watched_metric
from lsm_gnn.utils.progress import progress_bar

# The names after "train" are importable from here as before the split (benchmarks and tests read them).
__all__ = ["CheckpointError", "Trainer", "TrainingDiverged", "atomic_torch_save", "load_checkpoint", "train",
           "ALL_STAGES", "EMBEDDING_STAGES", "RESUME_KEYS", "STAGES", "TOTALS", "MetricsLog", "StageTimes"]


class TrainingDiverged(RuntimeError):
    """The loss or the gradients became NaN or infinite."""


class Trainer:
    """Trains ``cfg`` end to end: ``Trainer(cfg).fit()`` returns a summary dict.

    ``features`` replaces the feature path the config describes: the graph's
    :class:`~lsm_gnn.features.TypedFeatures` or, for a graph of one node type, any
    :class:`~lsm_gnn.features.Features` (a storage, a SoftwareCache, a SharedCache).
    """

    def __init__(self, cfg: Config, out=None, features=None, *, resume_from: str | None = None,
                 evaluation_only: bool = False):
        """``resume_from``: a checkpoint file to take the state from instead of checkpoint.dir's last.pt
        (``lsm-gnn evaluate`` and ``export`` load a trained model this way). ``evaluation_only``: the trainer
        evaluates and never trains (:meth:`fit` refuses), so it writes nothing to checkpoint.dir or log.dir and
        takes no lock on them: a run that trains there meanwhile is no conflict."""
        self.evaluation_only = evaluation_only
        if not cfg.dataset:
            raise ConfigError("no dataset: set dataset=<directory> (make one with lsm-gnn prepare)")
        # kernels= (CPU tensors: the C++ core, or the Triton kernels under the interpreter), the output locks and
        # the data check: held for the trainer's life, given back by close(), or at once by a failed start.
        self.resources = RunResources(cfg.kernels)
        try:
            self.resources.use_threads(cfg.train.threads)
            self._setup(cfg, out, features, resume_from)
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

    # -- the start ---------------------------------------------------------------------------------------------

    def _setup(self, cfg: Config, out, features, resume_from: str | None = None) -> None:
        from lsm_gnn.data import open_dataset

        self.cfg = cfg
        self.out = sys.stdout if out is None else out
        self.dataset = open_dataset(cfg.dataset, check="fast")
        self.device = startup.run_device(cfg.train.device)
        self.rank, self.world_size = distributed_context(self.device)
        # data.verify: the dataset's files, or the blocks the run reads, checked beside training (rank 0)
        self.resources.start_verify(self.dataset, cfg.data.verify, checking=self.rank == 0)
        self.progress = ProgressBoard.for_default_group("train") if distributed() else None
        self.ranks = Ranks(self.rank, self.world_size, self.progress)
        if distributed():  # before any collective whose shape depends on the settings
            check_agreement(flatten(startup.agreed_settings(cfg, self.dataset), sep="."))
        if self.rank == 0 and not self.evaluation_only:
            self.resources.lock_outputs(cfg)
        model_form(cfg, self.dataset)  # what has no typed form refused on a typed graph, before the task
        self.task = make_task(cfg, self.dataset)
        missing = [s for s in cfg.train.eval_splits if s not in self.task.splits]
        if missing:  # fail now, not after the first epoch
            raise ConfigError(f"train.eval_splits has {missing}, which dataset {self.dataset.path} lacks; it has "
                              f"{self.task.splits or 'none'}: set train.eval_splits={self.task.splits}")
        #: (split, metric, mode) that picks best.pt and stops early, or None
        self.watch = watched_metric(cfg, self.task)
        #: the resolved feature path (capacity in bytes, policy, PVP, sharing), checked before any work
        self.feature_spec = resolve(cfg, self.dataset, self.world_size, features=features is None)
        #: the graph's features by node type (a bare Features serves a graph of one node type)
        self.features = keyed_features(features, self.dataset.target) if features is not None else \
            startup.build_run_features(cfg, self.feature_spec, self.dataset, self.device, self.task, self.world_size)
        self.checkpointer = Checkpointer(self, cfg.checkpoint.dir)
        self.checkpoint_path = self.checkpointer.path
        # the checkpoint this run resumes from
        saved = load_checkpoint(resume_from) if resume_from else self.checkpointer.saved(cfg.checkpoint.resume)
        self.resumed_path = resume_from or self.checkpoint_path
        #: trainable node embeddings per node type (model.node_embedding), empty without
        self.embeddings = startup.open_node_embeddings(cfg, self.feature_spec, self.dataset, self.device, self.ranks,
                                                       saved, self.resumed_path)
        for node_type, embedding in self.embeddings.items():  # read by every loader with the features, updated
            self.features.add_trainable(node_type, embedding)  # after each batch
        self._build_model()
        self.loader = self.task.train_loader(self.features, self.rank, self.world_size)
        #: each cache against batches sampled before training (lsm_gnn.sizing); empty without a config-built cache
        self.cache_fits = [] if features is not None else startup.check_cache_size(
            cfg, self.feature_spec, self.loader, self.task, self.features, self.embeddings, self.world_size)
        self._start_state(saved)

    def _build_model(self) -> None:
        cfg = self.cfg
        torch.manual_seed(cfg.train.seed)
        startup.check_model_fits(cfg, self.features, self.task, self.device)
        self.module = build_model(cfg, self.dataset, self.features, self.task).to(self.device)
        self.model = self.module
        weights = [p for p in self.module.parameters() if p.requires_grad]
        if distributed() and weights:  # a model of none (LightGCN) has nothing for DDP to all-reduce
            from torch.nn.parallel import DistributedDataParallel

            self.model = DistributedDataParallel(
                self.module, find_unused_parameters=getattr(self.module, "leaves_parameters_unused", False))
        self.optimizer = torch.optim.Adam(weights, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay) \
            if weights else NoWeights()

    def _start_state(self, saved: dict | None) -> None:
        """The run's counters, log and selection: fresh, or as ``saved`` (the checkpoint resumed from) left them."""
        cfg = self.cfg
        self.iterations_done = 0
        self.history: list[dict] = []
        #: model selection: every evaluation, the best by the watched metric (best.pt), early stopping
        self.selection = ModelSelection(cfg.train, self.watch,
                                        best_checkpoint_path(cfg, self.watch, bool(self.embeddings)),
                                        self.ranks.rank0_decides, self.save_checkpoint)
        #: the accumulators of the epoch in progress (None between epochs); checkpointed, so a resumed
        #: epoch's summary covers all of its iterations
        self.epoch_state: dict | None = None
        self.log = MetricsLog(cfg, self.rank)
        self.resumed_from = None
        if self.checkpoint_path and self.rank == 0:
            self.checkpointer.remove_stale_temporaries(self.checkpoint_path, self.selection.best_path)
        if saved is not None:
            self.resume(self.resumed_path, saved)
        if distributed():  # a rank that cannot see the checkpoint (another host's disk) would start over
            check_agreement({"resumed at iteration": self.iterations_done},
                            fix="Put checkpoint.dir on a file system every rank sees")

    def _print(self, *args) -> None:
        if self.rank == 0:
            print(*args, file=self.out, flush=True)

    # -- checkpoints (lsm_gnn.training.checkpointing) -------------------------------------------------------------

    def state_dict(self, rng_by_rank: list[dict] | None = None) -> dict:
        """The trainer's state as a checkpoint holds it (:meth:`Checkpointer.state_dict`)."""
        return self.checkpointer.state_dict(rng_by_rank)

    def save_checkpoint(self, path: str | None = None) -> str | None:
        """Writes ``path`` (default checkpoint.dir/last.pt), every rank together; with node embeddings the table
        commits the checkpoint's generation after it."""
        return self.checkpointer.save(path)

    def resume(self, path: str, ckpt: dict | None = None) -> None:
        ckpt = self.checkpointer.resume(path, ckpt)
        epoch, position = ckpt["loader"]["epoch"], ckpt["loader"]["position"]
        # A checkpoint at an epoch's end (best.pt, last.pt) is where the next epoch would start: named by the epoch
        # it ends, as the run's epoch lines, log and best evaluation name it.
        where = f"the end of epoch {epoch - 1}" if position == 0 and epoch > 0 else \
            f"epoch {epoch}, {position} batches into it"
        self._print(f"resumed from {path}: {where}, iteration {self.iterations_done}")

    # -- training ------------------------------------------------------------------------------------------------

    def _limit_reached(self) -> bool:
        """The run ends here: train.max_iterations reached, or early stopping."""
        limit = self.cfg.train.max_iterations
        return (bool(limit) and self.iterations_done >= limit) or self.selection.stopped

    def _grads_finite(self) -> bool:
        # After DDP's all-reduce every rank holds the same gradients, so every rank stops at once.
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        return not grads or bool(torch.isfinite(torch.stack([g.detach().float().sum() for g in grads])).all())

    def _sized(self, where: str):
        return startup.sized(self.cfg, self.feature_spec, where, checked=bool(self.cache_fits))

    def _step(self, batch) -> float:
        self.resources.check_batch(batch)
        # DDP's collectives run in forward (bucket rebuilds) and backward (the gradient all-reduce).
        with self.ranks.collectives(f"DDP in iteration {self.iterations_done}"):
            return self._train_step(batch)

    def _train_step(self, batch) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        emb = batch.keyed(batch.emb)  # None without model.node_embedding; else per node type
        leaves = [] if emb is None else list(emb.values())
        for leaf in leaves:
            leaf.requires_grad_(True)  # a leaf: its gradient is the rows' sparse gradient
        loss = self.task.loss(self.model, batch)
        loss.backward()
        loss_value = float(loss.detach())  # syncs the device, so the train time is complete
        for leaf in leaves:
            if leaf.grad is None:  # a model that left them out of the loss
                leaf.grad = torch.zeros_like(leaf)
        emb_finite = all(all_finite(leaf.grad) for leaf in leaves)
        if not math.isfinite(loss_value) or not self._grads_finite() or not emb_finite:
            raise TrainingDiverged(
                f"the loss or its gradients became {loss_value if not math.isfinite(loss_value) else 'non-finite'} "
                f"at iteration {self.iterations_done}; the weights were not updated. Lower train.lr (now "
                f"{self.cfg.train.lr:g}), check the features for NaN/inf, and resume from the last checkpoint")
        self.optimizer.step()
        if emb is not None:
            start = time.perf_counter()
            with self.ranks.collectives(f"the node embeddings' update in iteration {self.iterations_done}"):
                io = self.features.update(batch.keyed(batch.input_nodes), {t: e.grad for t, e in emb.items()})
            batch.timings["update"] = time.perf_counter() - start
            batch.io = {**batch.io, **{k: batch.io.get(k, 0) + v for k, v in io.items()}}
        return loss_value

    def train_epoch(self, progress: bool) -> StageTimes:
        """Trains the rest of the loader's current epoch (or up to the iteration limit), adding to
        ``epoch_state``; returns this call's stage times."""
        times = StageTimes()
        epoch = self.loader.state_dict()["epoch"]
        if self.epoch_state is None or self.epoch_state["epoch"] != epoch:
            self.epoch_state = new_epoch_state(epoch)
        self.model.train()
        bar = progress_bar(progress and self.rank == 0, total=len(self.loader),
                           initial=self.loader.state_dict()["position"], unit="batch", desc=f"epoch {epoch}",
                           leave=False, mininterval=0.2)
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
                self._train_iteration(batch, epoch, time.perf_counter() - t0, times, bar)
                position = self.loader.state_dict()
                if position["position"] == until:  # an evaluation in mid-epoch (before this iteration's checkpoint)
                    times.wall += time.perf_counter() - epoch_start
                    self._evaluate_between(batches, epoch)
                    epoch_start = time.perf_counter()
                    if self._limit_reached():  # stopped early
                        break
                    self.loader.load_state_dict(position)
                    batches, until = self._segment()
                if self.cfg.checkpoint.every and self.iterations_done % self.cfg.checkpoint.every == 0:
                    times.wall += time.perf_counter() - epoch_start
                    epoch_start = time.perf_counter()
                    self.save_checkpoint()
        finally:
            bar.close()
            batches.close()
        times.wall += time.perf_counter() - epoch_start  # training time only, evaluations left out
        self.epoch_state["wall"] += times.wall
        return times

    def _train_iteration(self, batch, epoch: int, wait: float, times: StageTimes, bar) -> None:
        """Trains on ``batch`` (``wait``: the seconds training waited for it) and records the iteration."""
        t1 = time.perf_counter()
        loss_value = self._step(batch_to(batch, self.device))
        stage = {**batch.timings, "wait": wait, "train": time.perf_counter() - t1 - batch.timings.get(
            "update", 0.0)}
        times.add(stage)
        add_iteration(self.epoch_state, stage, loss_value, batch)
        self.iterations_done += 1
        cached = self.features.caches
        record = iteration_record(batch, epoch, loss_value, stage, cached)
        if self.iterations_done % self.cfg.log.every == 0:
            self.log.write(record)
        bar.update(1)
        bar.set_postfix(loss=f"{loss_value:.4f}",
                        hit="-" if record["hit_ratio"] is None else f"{record['hit_ratio']:.2f}")

    def _evaluate_between(self, batches, epoch: int) -> None:
        """An evaluation between two batches: the loader's thread stops after the last one on every rank."""
        batches.close()
        self._evaluate_all(epoch)

    def _segment(self):
        """(the loader's batches up to the next evaluation due by train.eval_every, that position), or
        (the rest of the epoch, None): the loader's thread must not gather alongside an evaluation. Its gathers
        also end at train.max_iterations, so every rank's thread stops after the same one: a thread that ran
        ahead would wait in a collective gather that the other rank's, stopped, never joins."""
        every, until = self.cfg.train.eval_every, None
        position = self.loader.state_dict()["position"]
        if every and self.cfg.train.eval_splits:
            stop = position + every - self.iterations_done % every
            until = stop if stop < len(self.loader) else None  # at the epoch's end: evaluated there
        last = until
        if self.cfg.train.max_iterations:
            stop = position + max(0, self.cfg.train.max_iterations - self.iterations_done)
            last = stop if last is None else min(last, stop)
        return self.loader.iterate(last if last is None or last < len(self.loader) else None), until

    # -- evaluation (the selection itself: lsm_gnn.training.selection) ---------------------------------------------

    def _epoch_eval_due(self, epoch: int) -> bool:
        return bool(self.cfg.train.eval_splits) and self.selection.epoch_eval_due(epoch, self.iterations_done)

    def _evaluate_all(self, epoch: int) -> dict:
        """Evaluates every split of train.eval_splits, logs it, updates the selection (best.pt, early stop)."""
        record = {"epoch": epoch, "iterations": self.iterations_done}
        start = time.perf_counter()
        for split in self.cfg.train.eval_splits:
            record[split] = self.evaluate(split)
        record["seconds"] = time.perf_counter() - start
        self.log.write({"evaluation": record})
        self.selection.add(record)
        return record

    def evaluate(self, split: str) -> dict:
        self.model.eval()
        if self.progress is not None:
            self.progress.mark(self.iterations_done)  # ranks that have not finished the epoch are behind
        with self.ranks.collectives(f"the evaluation on {split} after iteration {self.iterations_done}"), \
                self._sized(f"evaluating on {split}"):
            result = self.task.evaluate(self.module, self.features, split, self.device, self.rank, self.world_size)
        self.model.train()
        return result

    @property
    def evaluations(self) -> list[dict]:
        """Every evaluation ({"epoch", "iterations" done, split: metrics}), at epoch ends and every train.eval_every."""
        return self.selection.evaluations

    def best_summary(self) -> dict | None:
        """The best evaluation by the watched metric: which it is, when, every split's metrics there, best.pt."""
        return self.selection.best_summary()

    # -- the run -------------------------------------------------------------------------------------------------

    def fit(self) -> dict:
        if self.evaluation_only:
            raise RuntimeError("this trainer was made with evaluation_only=True: it holds no lock on its outputs, "
                               "so it may not train; make a Trainer without it")
        self._announce()
        total = StageTimes()
        try:
            while True:
                if self.epoch_state is not None and self.loader.state_dict()["epoch"] > self.epoch_state["epoch"]:
                    # Every batch of the epoch has trained (perhaps before a restart): evaluate and summarize.
                    self._end_epoch(complete=True)
                    continue
                if self.loader.state_dict()["epoch"] >= self.cfg.train.epochs or self._limit_reached():
                    break
                total.merge(self.train_epoch(self.cfg.log.progress))
                if self._limit_reached() and self.loader.state_dict()["epoch"] == self.epoch_state["epoch"]:
                    self._end_epoch(complete=False)  # stopped inside the epoch: a partial summary
            if self.embeddings and self.checkpoint_path is None:  # no checkpoint committed the tables
                for embedding in self.embeddings.values():
                    total.seconds["write-back"] += embedding.flush()
                    self.checkpointer.commit_table(embedding, embedding.table.generation + 1)
            waited = self.resources.finish_verify()  # a run that ends normally read only data that matched
            if waited > 1:
                self._print(f"data.verify={self.resources.verify_mode}: waited {waited:.1f}s for the last checks")
            return self._finish(total)
        finally:
            self.loader.close()
            self.log.close()
            self.resources.stop_verify()

    def _announce(self) -> None:
        """What the run trains, on what, from which features, and how its data is checked."""
        cfg = self.cfg
        mode = f" (cache.mode={self.cfg.cache.mode})" if self.world_size > 1 and self.features.caches else ""
        source = self.features.describe(partial(cache_label, self.dataset)) + mode
        self._print(f"training {cfg.model.kind} on {self.dataset.name} ({self.dataset.describe_nodes()}) "
                    f"with features from {source}; {self.world_size} rank(s), device {self.device}")
        for embedding in self.embeddings.values():
            self._print(f"with {embedding.describe()}")
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

    def _end_epoch(self, complete: bool) -> None:
        if complete and self._epoch_eval_due(self.epoch_state["epoch"]):
            # The epoch's training is kept before its evaluation runs: an evaluation that fails (a batch the cache
            # refuses, a collective timeout) costs the evaluation only; a resumed run evaluates from here.
            self.save_checkpoint()
        summary = self._summarize_epoch(complete)
        if complete:
            self.epoch_state = None  # kept after a partial summary: a resumed run continues the epoch
        self.log.write({"epoch_summary": summary})
        self._print(epoch_line(summary))
        self.save_checkpoint()

    def _summarize_epoch(self, complete: bool) -> dict:
        """The epoch's summary from ``epoch_state``; a complete epoch is also evaluated."""
        state = self.epoch_state
        summary = epoch_summary(state, complete, self.features, with_embedding=bool(self.embeddings))
        if complete and self._epoch_eval_due(state["epoch"]):
            record = self._evaluate_all(state["epoch"])
            summary.update({s: m for s, m in record.items() if s in self.cfg.train.eval_splits})
            summary["eval_s"] = record["seconds"]
        if self.history and self.history[-1]["epoch"] == summary["epoch"] and not self.history[-1]["complete"]:
            self.history[-1] = summary  # a stopped epoch went on: its summary now covers all of it
        else:
            self.history.append(summary)
        return summary

    def _finish(self, total: StageTimes) -> dict:
        """The run's result: prints the per-stage table, the last and the best evaluation; logs them."""
        self._print("\nper-stage time (this run)\n" + total.table())
        # Epoch summaries stand in for a checkpoint from before evaluations were kept.
        last_eval = last_evaluation(self.evaluations or self.history, self.cfg.train.eval_splits)
        best = self.best_summary()
        # every evaluation of the run, those before a restart included (their records keep their time)
        eval_s = sum(record.get("seconds", 0.0) for record in self.evaluations)
        result = {"iterations": self.iterations_done, "history": self.history,
                  "evaluations": self.evaluations, "stages_s": total.seconds, "wall_s": total.wall,
                  "eval_s": eval_s, "eval": last_eval, "best": best, "checkpoint": self.checkpoint_path}
        by_type = run_hit_ratios_by_type(self.history)
        if by_type:
            result["hit_ratio_by_type"] = by_type
            self._print(f"hit ratio by node type over the run: {ratios_text(by_type)}")
        if self.evaluations:
            self._print(f"evaluation: {eval_s:.1f}s in {len(self.evaluations)} evaluation(s), beside the "
                        f"{total.wall:.1f}s of training above")
        if self.resources.verify is not None:
            result["data_verify"] = self.resources.verify.summary()
        for line in result_lines(last_eval, best, self.cfg.train.early_stopping.patience):
            self._print(line)
        self.log.write({"run_summary": {"iterations": self.iterations_done, "eval": last_eval, "best": best}})
        return result

    def close(self) -> None:
        """Ends the run's hold on its files: closes the loader, the log and the embedding table, and gives up the
        directory locks and the kernels= scope (a process's exit does all of this too)."""
        self.loader.close()
        self.log.close()
        for embedding in self.embeddings.values():
            embedding.close()
        self.resources.close()


def all_finite(values: torch.Tensor) -> bool:
    """Whether every value of a float32 (or float16) tensor is finite: its float64 sum, which cannot overflow,
    is (one pass, without a mask as large as the tensor: a batch's embedding gradient is its whole rows)."""
    return bool(torch.isfinite(values.sum(dtype=torch.float64)))


class NoWeights:
    """The optimizer of a model without weights (LightGCN: only its node embeddings train, by their own
    optimizer): nothing to step, an empty state in checkpoints."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def step(self) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError("the checkpoint has optimizer state for weights this model does not have")


def train(cfg: Config, out=None) -> dict:
    """``Trainer(cfg).fit()``, closed at the end: its locks, table and ``kernels=`` scope last as long as the run."""
    with Trainer(cfg, out=out) as trainer:
        return trainer.fit()
