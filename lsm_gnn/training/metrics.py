"""What a run measures and reports: seconds per stage, the per-iteration log (JSON lines on rank 0, optional
TensorBoard scalars), the epoch's accumulators and summary, and the lines printed for them."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from lsm_gnn.config import Config, ConfigError
from lsm_gnn.utils.fileio import contained_path, reporting_disk_full

STAGES = ("sample", "gather", "exchange", "wait", "train")  # exchange: the part of gather spent between ranks
# With model.node_embedding: reading the rows (in the loader's thread; write-back is the part of it spent writing
# dirty victims), and applying the batch's update (in training's).
EMBEDDING_STAGES = ("embedding", "write-back", "update")
ALL_STAGES = STAGES + EMBEDDING_STAGES
# Counters summed over an epoch's iterations for its summary.
TOTALS = ("hits", "unique", "bytes_read", "bytes_useful", "pvp_hits", "bytes_saved", "embedding_bytes_read",
          "embedding_bytes_written", "embedding_hits", "embedding_rows", "read_seconds")
#: what the node embeddings' reads and updates of their tables add to an iteration's I/O (hits: of their caches)
EMBEDDING_COUNTERS = ("embedding_bytes_read", "embedding_bytes_written", "embedding_hits", "embedding_rows")


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

    def merge(self, other: StageTimes) -> None:
        """Adds ``other``'s seconds, iterations and wall time (an epoch's to the run's)."""
        for k in ALL_STAGES:
            self.seconds[k] += other.seconds[k]
        self.iterations += other.iterations
        self.wall += other.wall

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
            for key, value in flatten(record).items():
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


def flatten(d: dict, sep: str = "/", prefix: str = "") -> dict:
    """Nested dicts as one level, keys joined by ``sep`` ("a/b" for TensorBoard, "a.b" for config keys)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, sep, f"{prefix}{k}{sep}"))
        else:
            out[f"{prefix}{k}"] = v
    return out


# -- an epoch's accumulators (checkpointed: a resumed epoch's summary covers all of its iterations) -------------

def new_epoch_state(epoch: int) -> dict:
    return {"epoch": epoch, "losses": [], "stages": dict.fromkeys(ALL_STAGES, 0.0), "wall": 0.0,
            "totals": dict.fromkeys(TOTALS, 0)}


def add_iteration(state: dict, stage: dict, loss: float, batch) -> None:
    """One trained batch's stage seconds, loss and counters into the epoch's accumulators."""
    for k in ALL_STAGES:  # a checkpoint from before the embedding stages lacks them
        state["stages"][k] = state["stages"].get(k, 0.0) + stage.get(k, 0.0)
    state["losses"].append(loss)
    totals, io = state["totals"], batch.io
    totals["hits"] += batch.hits
    totals["unique"] += batch.gathered
    totals["bytes_read"] += io["bytes_read"]
    totals["bytes_useful"] += io["bytes_useful"]
    # With PVP, with node embeddings; read_seconds: lacking in a checkpoint from before it was counted.
    for key in ("pvp_hits", "bytes_saved", *EMBEDDING_COUNTERS, "read_seconds"):
        totals[key] = totals.get(key, 0) + io.get(key, 0)
    found = batch.hits_by_type()
    if found is not None:  # a typed batch: [hits, rows gathered] per node type
        by_type = totals.setdefault("by_type", {})
        for t, (hits, rows) in found.items():
            counts = by_type.setdefault(t, [0, 0])
            counts[0] += hits
            counts[1] += rows


def iteration_record(batch, epoch: int, loss: float, stage: dict, cached: bool) -> dict:
    """The JSON-lines record of one iteration; a typed batch's hit ratio per node type too, when cached."""
    io = batch.io
    record = {"iteration": batch.iteration, "epoch": epoch, "loss": loss,
              "time": {k: round(stage.get(k, 0.0), 6) for k in STAGES + tuple(k for k in EMBEDDING_STAGES
                                                                               if k in stage)},
              "hit_ratio": batch.hit_ratio if cached else None, "bytes_read": io["bytes_read"],
              "amplification": io["bytes_read"] / io["bytes_useful"] if io["bytes_useful"] else None}
    if "pvp_hits" in io:
        record.update(pvp_hits=io["pvp_hits"], bytes_saved=io["bytes_saved"])
    by_type = batch.hit_ratios()
    if cached and by_type:
        record["hit_ratio_by_type"] = by_type
    if "embedding_bytes_read" in io:
        record.update(embedding_bytes_read=io["embedding_bytes_read"],
                      embedding_bytes_written=io.get("embedding_bytes_written", 0))
    if "embedding_rows" in io:
        record["embedding_hit_ratio"] = embedding_hit_ratio(io)
    return record


def embedding_hit_ratio(counts: dict) -> float | None:
    """The node embedding tables' caches' hits over the rows read (None without a cache or a row read)."""
    rows = counts.get("embedding_rows", 0)
    return counts.get("embedding_hits", 0) / rows if rows else None


def epoch_summary(state: dict, complete: bool, features, with_embedding: bool) -> dict:
    """The summary of the epoch ``state`` accumulated (its evaluation aside)."""
    totals, losses = state["totals"], state["losses"]
    cached = features.caches
    summary = {"epoch": state["epoch"], "complete": complete, "iterations": len(losses),
               "loss": float(np.mean(losses)) if losses else float("nan"), "wall_s": state["wall"],
               "stages_s": dict(state["stages"]),
               "hit_ratio": totals["hits"] / totals["unique"] if totals["unique"] and cached else None,
               "bytes_read": totals["bytes_read"],
               "amplification": totals["bytes_read"] / totals["bytes_useful"] if totals["bytes_useful"] else None,
               **pipeline_bound(state)}
    if cached and totals.get("by_type"):  # a typed graph's: what each node type's rows met
        summary["hit_ratio_by_type"] = by_type_ratios(totals["by_type"])
        summary["rows_by_type"] = {t: rows for t, (_, rows) in totals["by_type"].items()}
    if "pvp_hits" in features.counters():  # a cache with a victim buffer
        summary.update(pvp_hits=totals["pvp_hits"], bytes_saved=totals["bytes_saved"])
    if with_embedding:  # this rank's reads of the table and writes to it (checkpoint flushes aside)
        summary.update(embedding_bytes_read=totals.get("embedding_bytes_read", 0),
                       embedding_bytes_written=totals.get("embedding_bytes_written", 0),
                       embedding_hit_ratio=embedding_hit_ratio(totals))
    return summary


def by_type_ratios(counts: dict) -> dict[str, float | None]:
    """{type: hits / rows} from {type: [hits, rows]} (None for a type none of whose rows were gathered)."""
    return {t: hits / rows if rows else None for t, (hits, rows) in counts.items()}


def run_hit_ratios_by_type(history: list[dict]) -> dict[str, float | None]:
    """Each node type's hit ratio over the epochs of ``history`` (their summaries' ratios, weighted by rows)."""
    counts: dict[str, list[float]] = {}
    for summary in history:
        for t, ratio in summary.get("hit_ratio_by_type", {}).items():
            rows = summary["rows_by_type"][t]
            total = counts.setdefault(t, [0.0, 0])
            total[0] += (ratio or 0.0) * rows
            total[1] += rows
    return by_type_ratios(counts)


def pipeline_bound(state: dict) -> dict:
    """How close the epoch ran to its bound, from its own counters: the storage's busy time (``read_s``: its
    reads of misses, at the queue depth it ran) and the training step's (``train_s``, with the node
    embeddings' update) are two resources a perfect pipeline overlaps, so no run takes less than the larger
    (``bound_s``); ``pipeline_efficiency`` is that over the training wall time (1.0: nothing else shows)."""
    stages = state["stages"]
    read_s = float(state["totals"].get("read_seconds", 0.0))
    train_s = stages.get("train", 0.0) + stages.get("update", 0.0)
    bound_s = max(read_s, train_s)
    return {"read_s": read_s, "train_s": train_s, "bound_s": bound_s,
            "pipeline_efficiency": bound_s / state["wall"] if state["wall"] > 0 and state["losses"] else None}


# -- printed lines -----------------------------------------------------------------------------------------------

def epoch_line(s: dict) -> str:
    parts = [f"epoch {s['epoch']}{'' if s['complete'] else ' (partial)'}: {s['iterations']} it",
             f"loss {s['loss']:.4f}", f"{s['wall_s']:.1f}s"]
    if s["hit_ratio"] is not None:
        parts.append(f"hit {s['hit_ratio']:.3f}" + by_type_text(s.get("hit_ratio_by_type")))
    if "pvp_hits" in s:
        parts.append(f"pvp hits {s['pvp_hits']:,} ({s['bytes_saved'] / 2**20:.1f} MiB saved)")
    if s["amplification"] is not None:
        parts.append(f"read {s['bytes_read'] / 2**20:.1f} MiB (ampl. {s['amplification']:.2f})")
    if s.get("pipeline_efficiency") is not None:
        limit = "storage" if s["read_s"] > s["train_s"] else "train"
        parts.append(f"pipeline {s['pipeline_efficiency']:.2f} of its bound ({limit})")
    if "embedding_bytes_read" in s:
        if s.get("embedding_hit_ratio") is not None:
            parts.append(f"table hit {s['embedding_hit_ratio']:.3f}")
        parts.append(f"table read {s['embedding_bytes_read'] / 2**20:.1f} MiB, written "
                     f"{s['embedding_bytes_written'] / 2**20:.1f} MiB")
    for split in ("val", "test", "train"):
        if split in s:
            metric = next(iter(s[split].items()))
            parts.append(f"{split} {metric[0]} {metric[1]:.4f}")
    if s.get("eval_s") is not None:
        parts.append(f"(evaluated in {s['eval_s']:.1f}s)")
    return "  ".join(parts)


def ratios_text(ratios: dict) -> str:
    """``paper 0.412, author 0.305``: a hit ratio per node type (``-``: none of its rows was gathered)."""
    return ", ".join(f"{t} {'-' if r is None else f'{r:.3f}'}" for t, r in ratios.items())


def by_type_text(ratios: dict | None) -> str:
    """`` (paper 0.412, author 0.305)`` after an epoch's hit ratio; empty for a plain graph."""
    return f" ({ratios_text(ratios)})" if ratios else ""


def metrics_text(metrics: dict) -> str:
    return ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())


def last_evaluation(records: list[dict], splits) -> dict:
    """Each split's metrics at its last evaluation among ``records`` (evaluations, or epoch summaries)."""
    last = {}
    for record in records:
        last.update({s: record[s] for s in splits if s in record})
    return last


def result_lines(last_eval: dict, best: dict | None, patience: int) -> list[str]:
    """What a run prints at its end: the last evaluation of each split, then the best one and how it ended."""
    lines = [f"{split}: {metrics_text(metrics)}" for split, metrics in last_eval.items()]
    if best is None:
        return lines
    if best["stopped_early"]:
        lines.append(f"stopped early: {best['metric']} did not improve on the best in {patience} evaluation(s) "
                     "after it")
    lines.append(f"best {best['metric']} {best['value']:.4f} at epoch {best['epoch']}, after "
                 f"{best['iterations']} iterations{' (stopped early)' if best['stopped_early'] else ''}"
                 f"{', ' + best['checkpoint'] if best['checkpoint'] else ''}")
    lines += [f"  {split} there: {metrics_text(metrics)}" for split, metrics in best["eval"].items()]
    return lines
