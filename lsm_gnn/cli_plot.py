"""``lsm-gnn plot``: pictures of a run from its metrics log (``log.dir/metrics.jsonl``).

Three PNG files: ``curves.png`` (the loss per iteration, smoothed, and every evaluation's metrics over the
iterations), ``stages.png`` (each stage's milliseconds per iteration: sampling, gathering, waiting, training, and
with node embeddings their stages) and ``cache.png`` (the hit ratio per iteration, per node type on a typed
graph, and the bytes read from storage). Needs matplotlib (``pip install matplotlib``, or the ``plot`` extra).
"""
from __future__ import annotations

import json
import os

from lsm_gnn.fileio import atomic_write_bytes

SMOOTH = 25  # iterations in the moving average drawn over each per-iteration series


def read_log(path: str) -> dict[str, list]:
    """The log's iteration records and evaluations, each list in file order."""
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    if not os.path.isfile(path):
        raise ValueError(f"no metrics log at {path}: give a run's log.dir (or its metrics.jsonl)")
    iterations, evaluations = [], []
    with open(path) as fh:
        for number, line in enumerate(fh, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                raise ValueError(f"{path} line {number} is not JSON; is it an lsm-gnn metrics log?") from None
            if "iteration" in record:
                iterations.append(record)
            elif "evaluation" in record:
                evaluations.append(record["evaluation"])
    if not iterations:
        raise ValueError(f"{path} holds no iteration records (log.every larger than the run?)")
    return {"iterations": iterations, "evaluations": evaluations}


def moving_average(values: list[float], width: int = SMOOTH) -> list[float]:
    """Each value averaged with up to ``width - 1`` before it (None values skipped)."""
    out, window = [], []
    for value in values:
        if value is not None:
            window.append(value)
            window = window[-width:]
        out.append(sum(window) / len(window) if window else None)
    return out


def _save(fig, path: str) -> str:
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    atomic_write_bytes(buffer.getvalue(), path)
    return path


def plot_run(log: dict, out: str, title: str = "") -> list[str]:
    """Writes the three figures of ``log`` (:func:`read_log`) into folder ``out``; returns their paths."""
    try:
        import matplotlib
    except ImportError:
        raise ValueError("lsm-gnn plot needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out, exist_ok=True)
    records = log["iterations"]
    steps = [r["iteration"] for r in records]
    written = []

    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(steps, [r["loss"] for r in records], color="0.8", linewidth=0.8, label="loss")
    ax.plot(steps, moving_average([r["loss"] for r in records]), color="C0", label=f"loss ({SMOOTH}-it mean)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("training loss")
    evaluations = log["evaluations"]
    if evaluations:
        right = ax.twinx()
        series = sorted({(split, metric) for e in evaluations for split, metrics in e.items()
                         if isinstance(metrics, dict) for metric, v in metrics.items()
                         if isinstance(v, float) and metric != "count" and not metric.startswith("random")})
        for i, (split, metric) in enumerate(series):
            points = [(e["iterations"], e[split][metric]) for e in evaluations if split in e]
            right.plot(*zip(*points), marker="o", color=f"C{i + 1}", label=f"{split} {metric}")
        right.set_ylabel("evaluation")
        right.legend(loc="center right", fontsize=8)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(f"{title} training curves".strip())
    written.append(_save(fig, os.path.join(out, "curves.png")))
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    stages = [s for s in records[0]["time"] if any(r["time"].get(s, 0) for r in records)]
    for i, stage in enumerate(stages):
        ax.plot(steps, moving_average([1000 * r["time"].get(stage, 0.0) for r in records]), color=f"C{i}",
                label=stage)
    ax.set_xlabel("iteration")
    ax.set_ylabel(f"ms per iteration ({SMOOTH}-it mean)")
    ax.set_title(f"{title} time per stage (sample and gather overlap train; wait is what they did not hide)"
                 .strip(), fontsize=9)
    ax.legend(fontsize=8)
    written.append(_save(fig, os.path.join(out, "stages.png")))
    plt.close(fig)

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    if any(r["hit_ratio"] is not None for r in records):
        top.plot(steps, moving_average([r["hit_ratio"] for r in records]), color="C0", label="all rows")
        types = sorted({t for r in records for t in r.get("hit_ratio_by_type", {})})
        for i, t in enumerate(types):
            top.plot(steps, moving_average([r.get("hit_ratio_by_type", {}).get(t) for r in records]),
                     color=f"C{i + 1}", label=t)
        top.legend(fontsize=8)
    else:
        top.text(0.5, 0.5, "no cache in this run", ha="center", va="center", transform=top.transAxes)
    top.set_ylabel(f"hit ratio ({SMOOTH}-it mean)")
    bottom.plot(steps, moving_average([r["bytes_read"] / 2 ** 20 for r in records]), color="C3")
    bottom.set_ylabel("MiB read from storage")
    bottom.set_xlabel("iteration")
    top.set_title(f"{title} cache".strip())
    written.append(_save(fig, os.path.join(out, "cache.png")))
    plt.close(fig)
    return written


def plot_command(args) -> int:
    log = read_log(args.log)
    out = args.out or (args.log if os.path.isdir(args.log) else os.path.dirname(os.path.abspath(args.log)))
    for path in plot_run(log, out, title=args.title or ""):
        print(f"wrote {path}")
    return 0


def add_plot_parser(sub) -> None:
    plot = sub.add_parser("plot", help="draw a run's training curves, stage times and hit ratio",
                          description="Reads a run's metrics log (log.dir/metrics.jsonl) and writes curves.png, "
                                      "stages.png and cache.png (needs matplotlib)")
    plot.add_argument("log", help="the run's log.dir, or its metrics.jsonl")
    plot.add_argument("--out", help="folder for the PNG files (default: the log's folder)")
    plot.add_argument("--title", help="a title before each figure's own")
    plot.set_defaults(func=plot_command)
