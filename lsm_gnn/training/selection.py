"""Model selection: when an evaluation is due, which evaluation is best by the watched metric (saved as
``best.pt``), and when the run stops early."""
from __future__ import annotations

import math
import os

from lsm_gnn.config import ConfigError, selection_metric


def watched_metric(cfg, task) -> tuple | None:
    """(split, metric, mode) that picks best.pt and stops early, or None; a metric the task lacks is refused."""
    watch = selection_metric(cfg.train, task.metrics[0])
    if watch and watch[1] not in task.metrics:
        raise ConfigError(f"train.early_stopping.metric={'.'.join(watch[:2])}: the {task.name} task "
                          f"reports {', '.join(task.metrics)}; watch one of those")
    return watch


def best_checkpoint_path(cfg, watch, with_embedding: bool) -> str | None:
    """Where the best evaluation's state goes (None: not kept). With node embeddings best.pt pairs with a copy
    of the table made at that evaluation, unless checkpoint.best_table=false declines its cost."""
    keep = cfg.checkpoint.dir and watch and (cfg.checkpoint.best_table or not with_embedding)
    return os.path.join(cfg.checkpoint.dir, "best.pt") if keep else None


class ModelSelection:
    """Every evaluation of the run, the best by ``watch`` and early stopping (train.early_stopping).

    ``rank0_decides(value, what)`` gives rank 0's decision to every rank; ``save_best(path)`` writes the state of
    the evaluation that became the best to ``best_path`` (None: kept in memory only).
    """

    def __init__(self, train_cfg, watch: tuple | None, best_path: str | None, rank0_decides, save_best):
        self.cfg = train_cfg
        self.watch = watch
        self.best_path = best_path
        self._rank0_decides = rank0_decides
        self._save_best = save_best
        #: every evaluation ({"epoch", "iterations" done, split: metrics}), at epoch ends and every train.eval_every
        self.evaluations: list[dict] = []
        #: the best watched value, its evaluation, evaluations since, and whether the run stopped (checkpointed)
        self.state = self.fresh_state()

    @staticmethod
    def fresh_state() -> dict:
        return {"best": None, "evaluation": None, "since_best": 0, "stopped": False}

    def restore(self, ckpt: dict) -> None:
        """The evaluations and the selection a checkpoint recorded; written before model selection existed:
        nothing was selected yet."""
        self.evaluations = list(ckpt.get("evaluations", []))
        self.state = ckpt.get("selection") or self.fresh_state()

    @property
    def stopped(self) -> bool:
        return self.state["stopped"]

    def iteration_eval_due(self, iterations_done: int) -> bool:
        every = self.cfg.eval_every
        return bool(every) and bool(self.cfg.eval_splits) and iterations_done % every == 0

    def epoch_eval_due(self, epoch: int, iterations_done: int) -> bool:
        """Whether a complete epoch ends in an evaluation: every train.eval_every_epochs-th, the last, and one
        whose last iteration is due by train.eval_every."""
        every = self.cfg.eval_every_epochs
        return ((bool(every) and (epoch + 1) % every == 0) or epoch + 1 == self.cfg.epochs
                or self.iteration_eval_due(iterations_done))

    def add(self, record: dict) -> None:
        """An evaluation's record; with a watched metric it may become the best (best.pt) or stop the run."""
        self.evaluations.append(record)
        if self.watch:
            self._select(record)

    def _select(self, record: dict) -> None:
        split, metric, mode = self.watch
        es, sel = self.cfg.early_stopping, self.state
        value = float(record[split][metric])
        best = sel["best"]
        if mode == "max":
            better = best is None or value > best + es.min_delta
        else:
            better = best is None or value < best - es.min_delta
        better = better and math.isfinite(value)
        # rank 0 decides for all: metrics summed over ranks may differ in the last bit
        better = self._rank0_decides(better, f"model selection after iteration {record['iterations']}")
        if better:
            sel.update(best=value, evaluation=record, since_best=0)
            if self.best_path is not None:  # this evaluation's state, the selection included
                self._save_best(self.best_path)
            # last.pt is not written here: the checkpoint after the epoch summary (or the next one) records this
            # selection with the log lines of the same evaluation, so a kill in between redoes both, once.
        else:
            sel["since_best"] += 1
        if es.patience and sel["since_best"] >= es.patience:
            sel["stopped"] = True

    def best_summary(self) -> dict | None:
        """The best evaluation by the watched metric: which it is, when, every split's metrics there, best.pt."""
        if not self.watch or self.state["evaluation"] is None:
            return None
        split, metric, mode = self.watch
        record = self.state["evaluation"]
        return {"metric": f"{split}.{metric}", "mode": mode, "value": self.state["best"],
                "epoch": record["epoch"], "iterations": record["iterations"],
                "eval": {s: record[s] for s in self.cfg.eval_splits if s in record},
                "checkpoint": self.best_path, "stopped_early": self.state["stopped"]}
