"""``lsm-gnn plot``: pictures of a run from its metrics log (``log.dir/metrics.jsonl``), or of a plan.

From a run's log, three PNG files, one panel per quantity and each legend beside its panel: ``curves.png`` (the
loss per iteration, smoothed, then each evaluation metric per split), ``stages.png`` (each stage's milliseconds
per iteration: the training thread's wait, train and the node embeddings' update, then the loader's sample,
gather and the embeddings' read and write-back) and ``cache.png`` (the hit ratio per iteration of the features'
cache, per node type on a typed graph, and of the node embedding tables' caches; the MiB read and written). From a
plan (``lsm-gnn plan --json``), ``plan.png``: the predicted hit ratio and ms per iteration against the cache size
per policy, and each policy's stages (:func:`draw_plan`). From ``benchmarks/plan_validation.py``'s JSON,
``plan_validation.png``: predicted beside measured ms per iteration and hit ratio (:func:`draw_validation`). The
input is told apart by its content (:func:`read_input`); a log's records and a plan's fields are checked first
(:mod:`lsm_gnn.training.run_log`, :func:`check_input`), and names from them are drawn as plain text. Every PNG carries a
mark (:data:`PNG_MARK`): a file without it is never replaced. Needs matplotlib (``pip install matplotlib``, or
the ``plot`` extra).
"""
from __future__ import annotations

import json
import math
import os

from lsm_gnn.training import run_log
from lsm_gnn.utils.fileio import atomic_write_bytes, check_output_file
from lsm_gnn.training.run_log import SPLITS, Unusable, read_log

SMOOTH = 25  # iterations in the moving average drawn over each per-iteration series
#: the tEXt chunk that marks a PNG lsm-gnn wrote: only such a file is replaced by a later figure
PNG_MARK = ("Software", "lsm-gnn")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


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
    """Writes ``path`` atomically as a PNG of 256 colours (a third of the full-colour file's size, the same to the
    eye for line art), or full colour where Pillow, a dependency of matplotlib, is missing; marked as lsm-gnn's
    (:data:`PNG_MARK`)."""
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight", metadata=dict([PNG_MARK]))
    data = buffer.getvalue()
    try:
        from PIL import Image, PngImagePlugin
    except ImportError:
        pass
    else:
        info = PngImagePlugin.PngInfo()
        info.add_text(*PNG_MARK)
        buffer = io.BytesIO()
        Image.open(io.BytesIO(data)).convert("RGB").quantize(256).save(buffer, format="png", optimize=True,
                                                                       pnginfo=info)
        data = buffer.getvalue()
    atomic_write_bytes(data, path)
    return path


def is_our_png(path: str) -> bool:
    """Whether ``path`` is a PNG lsm-gnn wrote: a tEXt chunk :data:`PNG_MARK` before its image data."""
    with open(path, "rb") as fh:
        head = fh.read(1 << 16)
    if not head.startswith(PNG_SIGNATURE):
        return False
    position, key, value = len(PNG_SIGNATURE), *(part.encode() for part in PNG_MARK)
    while position + 8 <= len(head):
        length, kind = int.from_bytes(head[position:position + 4], "big"), head[position + 4:position + 8]
        if kind == b"IDAT":
            return False
        if kind == b"tEXt" and head[position + 8:position + 8 + length].partition(b"\0")[::2] == (key, value):
            return True
        position += 12 + length
    return False


def check_figure_path(path: str, option: str = "--out") -> str:
    """Refuses, before drawing, a figure's ``path`` that holds a file lsm-gnn did not write (:func:`is_our_png`)."""
    check_output_file(path, option, ours=is_our_png)
    return path


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend, or a ValueError saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise ValueError("lsm-gnn plot needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plain_text(draw):
    """``draw`` with every text drawn as it is: a name from a file (a metric, a node type, a title) holding ``$``
    is no formula for matplotlib to parse (or to fail on)."""
    import functools

    @functools.wraps(draw)
    def drawing(*args, **kwargs):
        with pyplot().rc_context({"text.parse_math": False}):
            return draw(*args, **kwargs)
    return drawing


def _legend_beside(ax) -> None:
    """The axis's legend right of it, off the curves (savefig's tight box keeps it in the file)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def _panels(plt, count: int, title: str):
    """A figure of ``count`` panels one above the other, sharing the iteration axis."""
    fig, axes = plt.subplots(count, 1, figsize=(8, 1.2 + 2.3 * count), sharex=True, squeeze=False)
    axes = [row[0] for row in axes]
    axes[0].set_title(title, fontsize=10)
    axes[-1].set_xlabel("iteration")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    return fig, axes


def _smoothed(ax, steps: list, values: list, label: str, color: str) -> None:
    if any(v is not None for v in values):
        ax.plot(steps, moving_average(values), color=color, label=label)


#: the run's figures (:func:`plot_run`), in the order drawn
RUN_FIGURES = ("curves.png", "stages.png", "cache.png")
#: the stages of an iteration on the training thread (their sum is its time) and on the loader's, overlapped
TRAINING_STAGES = ("wait", "train", "update")


@plain_text
def plot_run(log: dict, out: str, title: str = "") -> list[str]:
    """Writes the figures of ``log`` (:func:`~lsm_gnn.training.run_log.read_log`) into folder ``out``, named as
    :data:`RUN_FIGURES`; returns their paths. One panel per quantity, each legend beside its panel."""
    plt = pyplot()
    os.makedirs(out, exist_ok=True)
    records, evaluations = log["iterations"], log["evaluations"]
    steps = [r["iteration"] for r in records]
    written = []

    # curves.png: the loss, then one panel per evaluation metric with a line per split
    metrics = sorted({metric for e in evaluations for split in e if isinstance(e[split], dict)
                      for metric in e[split] if metric != "count" and not metric.startswith("random")})
    fig, axes = _panels(plt, 1 + len(metrics), f"{title} training curves".strip())
    loss = [r["loss"] for r in records]
    axes[0].plot(steps, loss, color="0.8", linewidth=0.8, label="per iteration")
    axes[0].plot(steps, moving_average(loss), color="C0", label=f"{SMOOTH}-it mean")
    axes[0].set_ylabel("training loss")
    for ax, metric in zip(axes[1:], metrics):
        for i, split in enumerate(SPLITS):
            points = [(e["iterations"], e[split][metric]) for e in evaluations
                      if isinstance(e[split], dict) and e[split].get(metric) is not None]
            if points:
                ax.plot(*zip(*points), marker="o", markersize=3, color=f"C{i + 1}", label=split)
        ax.set_ylabel(metric)
    for ax in axes:
        _legend_beside(ax)
    written.append(_save(fig, os.path.join(out, RUN_FIGURES[0])))
    plt.close(fig)

    # stages.png: the training thread's stages (their sum is the iteration's time), then the loader's
    stages = [s for s in dict.fromkeys(k for r in records for k in r["time"]) if any(r["time"].get(s) for r in records)]
    threads = [[s for s in stages if s in TRAINING_STAGES], [s for s in stages if s not in TRAINING_STAGES]]
    fig, axes = _panels(plt, 2, f"{title} milliseconds per iteration by stage ({SMOOTH}-it mean)".strip())
    for ax, names, what in zip(axes, threads, ("training thread", "loader thread (overlapped)")):
        for stage in names:
            _smoothed(ax, steps, [1000 * r["time"].get(stage, 0.0) for r in records], stage,
                      f"C{stages.index(stage)}")
        ax.set_ylabel(f"ms: {what}", fontsize=9)
        _legend_beside(ax)
    written.append(_save(fig, os.path.join(out, RUN_FIGURES[1])))
    plt.close(fig)

    # cache.png: the hit ratios (the features' cache, per node type, the node embedding tables' caches), then MiB
    fig, (hit, read) = _panels(plt, 2, f"{title} cache ({SMOOTH}-it mean)".strip())
    _smoothed(hit, steps, [r["hit_ratio"] for r in records], "features", "C0")
    types = sorted({t for r in records for t in r["hit_ratio_by_type"] or {}})
    for i, t in enumerate(types):
        _smoothed(hit, steps, [(r["hit_ratio_by_type"] or {}).get(t) for r in records], f"features: {t}", f"C{i + 2}")
    _smoothed(hit, steps, [r["embedding_hit_ratio"] for r in records], "node embeddings", "C1")
    if hit.get_lines():
        hit.set_ylim(0, 1.02)
    else:
        hit.text(0.5, 0.5, "no cache in this run", ha="center", va="center", transform=hit.transAxes)
    hit.set_ylabel("hit ratio")
    if any(r["bytes_read"] for r in records) or records[0]["embedding_bytes_read"] is None:
        _smoothed(read, steps, [r["bytes_read"] / 2**20 for r in records], "features", "C0")
    for key, label, style in (("embedding_bytes_read", "node embeddings read", "-"),
                              ("embedding_bytes_written", "node embeddings written", "--")):
        values = [None if r[key] is None else r[key] / 2**20 for r in records]
        if any(values):
            read.plot(steps, moving_average(values), color="C1", linestyle=style, label=label)
    read.set_ylabel("MiB per iteration")
    for ax in (hit, read):
        _legend_beside(ax)
    written.append(_save(fig, os.path.join(out, RUN_FIGURES[2])))
    plt.close(fig)
    return written


INPUTS = ("a run's log.dir (or its metrics.jsonl), a plan (lsm-gnn plan --json FILE) or the JSON of "
          "benchmarks/plan_validation.py")


def read_input(path: str, measured: bool = False) -> tuple[str, dict]:
    """What ``path`` holds, by its content: ``("run", read_log(path))`` for a run's log folder or metrics log,
    ``("plan", plan)`` for ``lsm-gnn plan``'s JSON, ``("validation", result)`` for plan_validation.py's (checked
    for its ``measured`` runs only, where it is read for those, :func:`check_input`)."""
    if os.path.isdir(path) or path.endswith(".jsonl"):
        return "run", read_log(path)
    if not os.path.isfile(path):
        raise ValueError(f"no metrics log, plan or plan validation at {path}: give {INPUTS}")
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, nested past the parser
        first = data.split(b"\n", 1)[0]
        try:  # a metrics log not named .jsonl: one JSON object a line
            document = json.loads(first)
        except (ValueError, RecursionError):
            document = None
    kind = _kind(document)
    if kind is None:
        raise ValueError(f"{path} is neither a metrics log, a plan nor a plan validation: give {INPUTS}")
    if kind != "run":
        check_input("measured" if measured and kind == "validation" else kind, document, path)
    return kind, (read_log(path) if kind == "run" else document)


def _kind(document) -> str | None:
    if not isinstance(document, dict):
        return None
    if isinstance(document.get("rows"), list) and "recommendation" in document and "run" in document:
        return "plan"
    results = document.get("results")
    if isinstance(results, list) and results and all(isinstance(r, dict) and "predicted" in r and "measured" in r
                                                     for r in results):
        return "validation"
    if any(key in document for key in ("iteration", "evaluation", "epoch_summary", "run_summary")):
        return "run"
    return None


# -- a plan: predictions against the cache size ------------------------------------------------------------------

#: the stages a plan predicts, as its rows' ``stages_ms`` name them, in the order drawn
PLAN_STAGES = ("sample", "cache", "read", "train")
#: with node embeddings, also (plans before them lack them)
EMBEDDING_PLAN_STAGES = ("embedding", "update")


def _plan_row(row, field):
    """A plan's row: its predictions, or the error of a cache too small to run."""
    common = {"policy": run_log.text, "pvp": run_log.boolean, "capacity": run_log.text,
              "capacity_bytes": run_log.count}
    if type(row) is dict and "error" in row:
        return run_log.fields({**common, "error": run_log.text})(row, field)
    # hit_ratio null: a run of node embeddings alone has no features' cache (its tables' are under embedding)
    return run_log.fields({**common, "hit_ratio": run_log.optional(run_log.ratio), "ms_per_iteration": run_log.seconds,
                           "steady_ms": run_log.seconds,
                           "embedding": run_log.optional(run_log.each(run_log.fields({"hit_ratio": run_log.ratio}))),
                           "stages_ms": run_log.fields({**dict.fromkeys(PLAN_STAGES, run_log.seconds),
                                                        **dict.fromkeys(EMBEDDING_PLAN_STAGES,
                                                                        run_log.optional(run_log.seconds))})})(row, field)


_MEASURES = run_log.fields({"ms_per_iteration": run_log.seconds, "hit_ratio": run_log.ratio})
_REPEATS = run_log.optional(run_log.items(run_log.fields({"ms_per_iteration": run_log.seconds})))
#: what the figures read of each input (a file may come from anywhere, as a log may)
CHECKS = {
    "plan": run_log.fields({
        "rows": run_log.items(_plan_row), "recommendation": run_log.optional(run_log.fields({})),
        "run": run_log.fields({"batch_size": run_log.count, "model": run_log.text, "hidden": run_log.count,
                               "iterations": run_log.count, "cores": run_log.count,
                               "fanouts": run_log.items(run_log.real())}),
        "dataset": run_log.fields({"num_nodes": run_log.count, "row_bytes": run_log.optional(run_log.count),
                                   "node_types": run_log.optional(run_log.each(run_log.fields({})))})}),
    "validation": run_log.fields({
        "settings": run_log.optional(run_log.fields({})),
        "summary": run_log.optional(run_log.fields({"median_abs_error_ms": run_log.optional(run_log.real()),
                                                    "max_abs_error_ms": run_log.optional(run_log.real())})),
        "results": run_log.items(run_log.fields({
            "name": run_log.optional(run_log.text), "settings": run_log.optional(run_log.fields({})),
            "predicted": _MEASURES, "measured": _MEASURES, "plans": _REPEATS, "runs": _REPEATS}))}),
    # a validation given as --measured: only its measured runs are drawn
    "measured": run_log.fields({
        "settings": run_log.optional(run_log.fields({})),
        "results": run_log.items(run_log.fields({"settings": run_log.optional(run_log.fields({})),
                                                 "measured": _MEASURES}))}),
}
WHAT = {"plan": "the JSON of lsm-gnn plan --json FILE", "validation": "the JSON of benchmarks/plan_validation.py",
        "measured": "the JSON of benchmarks/plan_validation.py"}


def check_input(kind: str, document: dict, path: str) -> None:
    """Refuses a plan or a plan validation whose fields the figures read are not of the types their writers
    write, naming the file and the field."""
    try:
        CHECKS[kind](document, "")
    except Unusable as exc:
        raise ValueError(f"{path}: {exc}; is it {WHAT[kind]}?") from None


def measured_runs(plan: dict, validation: dict) -> dict[tuple, dict]:
    """The measured figures of ``validation`` (plan_validation.py's JSON) that ran one of ``plan``'s settings:
    ``{(policy, pvp, capacity): measured}`` for each result of the same graph size, row size, model, fanouts and
    batch size as the plan, keyed as the plan's rows are."""
    settings, run, ds = validation.get("settings") or {}, plan["run"], plan["dataset"]
    if "row_bytes" not in ds:  # a heterogeneous graph's plan: the validation runs graphs of one row format
        return {}
    graph = {"num_nodes": ds["num_nodes"], "model": run["model"], "hidden": run["hidden"]}
    if any(settings.get(key, value) != value for key, value in graph.items()):
        return {}
    out = {}
    for r in validation["results"]:
        s = r.get("settings") or {}
        try:  # plan_validation.py writes them as text
            fanouts = json.loads(s["fanouts"]) if isinstance(s.get("fanouts"), str) else s.get("fanouts")
        except ValueError:
            continue
        if (s.get("row_bytes"), fanouts, s.get("batch_size")) == (ds["row_bytes"], list(run["fanouts"]),
                                                                  run["batch_size"]):
            out[(s.get("policy"), bool(s.get("pvp")), s.get("capacity"))] = r["measured"]
    return out


def plan_series(plan: dict, measured: dict | None = None) -> list[dict]:
    """The plan's rows as the figure draws them: one series per (policy, PVP) in the plan's order, each
    ``{label, policy, pvp, capacity, capacity_bytes, hit_ratio (NaN: no features' cache), table_hit_ratio: {node
    type: hit ratios of its node embedding table's cache}, ms_per_iteration, steady_ms, stages: {stage: ms},
    recommended (index into the lists, or None), cannot_run: [(capacity, capacity_bytes, error)]}``, its points
    in the plan's order (sizes as given). A row a cache too small cannot run is left out of the lines and listed
    under ``cannot_run``. ``measured`` (:func:`measured_runs`) adds ``measured: {capacity_bytes, hit_ratio,
    ms_per_iteration}``, the points of the series that ran."""
    best = plan.get("recommendation")
    series, by_key = [], {}
    for row in plan["rows"]:
        key = (row["policy"], bool(row["pvp"]))
        s = by_key.get(key)
        if s is None or row["capacity"] in s["capacity"] + [c for c, _, _ in s["cannot_run"]]:
            label = row["policy"] + ("+pvp" if row["pvp"] else "")
            same = sum(1 for t in series if t["policy"] == row["policy"] and t["pvp"] == bool(row["pvp"]))
            s = {"label": label if not same else f"{label} ({same + 1})", "policy": row["policy"],
                 "pvp": bool(row["pvp"]), "capacity": [], "capacity_bytes": [], "hit_ratio": [],
                 "ms_per_iteration": [], "steady_ms": [], "table_hit_ratio": {},
                 "stages": {stage: [] for stage in PLAN_STAGES + EMBEDDING_PLAN_STAGES},
                 "recommended": None, "cannot_run": [],
                 "measured": {"capacity_bytes": [], "hit_ratio": [], "ms_per_iteration": []}}
            series.append(s)
            by_key[key] = s
        if "error" in row:
            s["cannot_run"].append((row["capacity"], row["capacity_bytes"], row["error"]))
            continue
        if best is not None and all(best.get(k) == row.get(k) for k in
                                    ("policy", "pvp", "capacity", "capacity_bytes", "ms_per_iteration")):
            s["recommended"] = len(s["capacity"])
            best = None  # one point only, should two rows be equal
        s["capacity"].append(row["capacity"])
        s["capacity_bytes"].append(row["capacity_bytes"])
        s["hit_ratio"].append(math.nan if row["hit_ratio"] is None else row["hit_ratio"])
        for t, table in (row.get("embedding") or {}).items():
            s["table_hit_ratio"].setdefault(t, []).append(table["hit_ratio"])
        s["ms_per_iteration"].append(row["ms_per_iteration"])
        s["steady_ms"].append(row["steady_ms"])
        for stage in PLAN_STAGES + EMBEDDING_PLAN_STAGES:
            s["stages"][stage].append(row["stages_ms"].get(stage) or 0.0)
        ran = (measured or {}).get((row["policy"], bool(row["pvp"]), row["capacity"]))
        if ran is not None:
            s["measured"]["capacity_bytes"].append(row["capacity_bytes"])
            s["measured"]["hit_ratio"].append(ran["hit_ratio"])
            s["measured"]["ms_per_iteration"].append(ran["ms_per_iteration"])
    return series


def _size_axis(ax, series: list[dict]) -> None:
    """Cache size in MiB on a log axis when the sizes span more than 4x, ticks labelled as the plan gave them."""
    from lsm_gnn.utils.units import format_bytes

    ticks = {}
    for s in series:
        for capacity, size in zip(s["capacity"], s["capacity_bytes"]):
            ticks.setdefault(size, capacity)
        for capacity, size, _ in s["cannot_run"]:
            ticks.setdefault(size, capacity)
    sizes = sorted(ticks)
    if sizes and sizes[0] > 0 and sizes[-1] / sizes[0] > 4:
        ax.set_xscale("log")
    ax.set_xticks([b / 2**20 for b in sizes])
    ax.set_xticklabels([ticks[b] if ticks[b] == format_bytes(b) else f"{ticks[b]}\n{format_bytes(b)}"
                        for b in sizes], fontsize=7)
    ax.minorticks_off()
    ax.set_xlabel("cache size")


@plain_text
def draw_plan(plan: dict, path: str, title: str = "", measured: dict | None = None) -> list[dict]:
    """Writes ``path``, a PNG of ``plan`` (:func:`lsm_gnn.planner.make_plan`'s result): the predicted hit ratio
    and ms per iteration against the cache size, one line per policy (and PVP on/off), the recommended point
    starred, and per series its stages' ms per iteration; with ``measured`` (plan_validation.py's JSON) the
    measured runs of the plan's settings as hollow squares. Returns the series drawn (:func:`plan_series`)."""
    plt = pyplot()
    series = plan_series(plan, None if measured is None else measured_runs(plan, measured))
    if measured is not None and not any(s["measured"]["capacity_bytes"] for s in series):
        raise ValueError("no measured run of the plan's settings: --measured must hold runs of the same graph size, "
                         "row size, model, fanouts, batch size, policy, PVP and capacity as the plan")
    if not series:
        raise ValueError("the plan has no rows to draw")
    panels = (len(series) + 1) // 2
    fig, axes = plt.subplots(1 + panels, 2, figsize=(10, 3.6 * (1 + panels)), squeeze=False)
    hit, total = axes[0]
    for i, s in enumerate(series):
        mib = [b / 2**20 for b in s["capacity_bytes"]]
        if not all(math.isnan(h) for h in s["hit_ratio"]):
            hit.plot(mib, s["hit_ratio"], marker="o", color=f"C{i}", label=s["label"])
        for t, ratios in s["table_hit_ratio"].items():
            hit.plot(mib[:len(ratios)], ratios, marker="^", ls="--", color=f"C{i}",
                     label=f"{s['label']}: node embeddings of {t}")
        total.plot(mib, s["ms_per_iteration"], marker="o", color=f"C{i}", label=s["label"])
        ran = s["measured"]
        if ran["capacity_bytes"]:
            for ax, figure in ((hit, "hit_ratio"), (total, "ms_per_iteration")):
                ax.plot([b / 2**20 for b in ran["capacity_bytes"]], ran[figure], ls="none", marker="s", markersize=10,
                        markerfacecolor="none", markeredgewidth=1.5, color=f"C{i}", label=f"{s['label']} measured")
        if s["recommended"] is not None:
            k = s["recommended"]
            total.plot(mib[k], s["ms_per_iteration"][k], marker="*", markersize=16, color="gold",
                       markeredgecolor="black", zorder=5, label=f"recommended: {s['label']} at {s['capacity'][k]}")
    small = sorted({b / 2**20 for s in series for _, b, _ in s["cannot_run"]})
    for ax in (hit, total) if small else ():
        ax.plot(small, [0] * len(small), "x", color="0.4", markersize=9, clip_on=False,
                label="cannot run (a batch does not fit)")
    hit.set_ylabel("predicted hit ratio")
    hit.set_ylim(0, 1)
    total.set_ylabel("predicted ms per iteration")
    total.set_ylim(bottom=0)
    for ax in (hit, total):
        _size_axis(ax, series)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for i, s in enumerate(series):
        ax = axes[1 + i // 2][i % 2]
        mib = [b / 2**20 for b in s["capacity_bytes"]]
        drawn = PLAN_STAGES + tuple(stage for stage in EMBEDDING_PLAN_STAGES if any(s["stages"][stage]))
        for j, stage in enumerate(drawn):
            ax.plot(mib, s["stages"][stage], marker=".", color=f"C{j}", label=stage)
        ax.plot(mib, s["ms_per_iteration"], color="black", lw=2, label="ms/it (run)")
        ax.plot(mib, s["steady_ms"], color="black", lw=1, ls="--", label="steady")
        if s["recommended"] is not None:
            k = s["recommended"]
            ax.plot(mib[k], s["ms_per_iteration"][k], marker="*", markersize=16, color="gold",
                    markeredgecolor="black", zorder=5)
        ax.set_title(f"{s['label']}: ms per iteration by stage", fontsize=9)
        ax.set_ylabel("ms per iteration")
        ax.set_ylim(bottom=0)
        _size_axis(ax, [s])
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    if len(series) % 2:
        axes[-1][1].set_visible(False)
    from lsm_gnn.planner.plan import dataset_text

    run = plan["run"]
    fig.suptitle(f"{title} plan: {dataset_text(plan['dataset'])}\nfanouts {run['fanouts']}, batch "
                 f"{run['batch_size']}, {run['model']}, {run['iterations']} iterations on {run['cores']} core(s)\n"
                 "(stages each alone: sample, cache, read on the loader thread, overlapped with train; embedding and "
                 "update, where drawn, between two steps)".strip(),
                 fontsize=9)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return series


# -- the plan against measured runs ------------------------------------------------------------------------------

def validation_series(result: dict) -> dict:
    """plan_validation.py's result as its figure draws it: ``{names, predicted: {ms_per_iteration, hit_ratio},
    measured: {...}, error: [relative error of ms/it], range: {predicted: [(min, max)], measured: [...]}}``, one
    entry per configuration in the file's order; ``range`` spans the ms/it of the repeated plans and runs whose
    medians the file keeps ((None, None) for a single one)."""
    out = {"names": [], "error": [], "range": {"predicted": [], "measured": []},
           **{side: {"ms_per_iteration": [], "hit_ratio": []} for side in ("predicted", "measured")}}
    for r in result["results"]:
        out["names"].append(r.get("name") or str(len(out["names"])))
        for side, repeats in (("predicted", r.get("plans") or ()), ("measured", r.get("runs") or ())):
            times = [each["ms_per_iteration"] for each in repeats]
            out["range"][side].append((min(times), max(times)) if len(times) > 1 else (None, None))
        for side in ("predicted", "measured"):
            for figure in ("ms_per_iteration", "hit_ratio"):
                out[side][figure].append(r[side][figure])
        p, m = r["predicted"]["ms_per_iteration"], r["measured"]["ms_per_iteration"]
        out["error"].append((p - m) / m if m else None)
    return out


@plain_text
def draw_validation(result: dict, path: str, title: str = "") -> dict:
    """Writes ``path``, a PNG of plan_validation.py's ``result``: per configuration the predicted beside the
    measured ms per iteration (the error written above) and hit ratio. Returns the data drawn
    (:func:`validation_series`)."""
    plt = pyplot()
    data = validation_series(result)
    n = len(data["names"])
    fig, (ms, hit) = plt.subplots(2, 1, figsize=(max(7.0, 0.8 * n + 2), 7), sharex=True)
    x = list(range(n))
    width = 0.38
    for k, (side, color) in enumerate((("predicted", "C0"), ("measured", "C1"))):
        ms.bar([i + (k - 0.5) * width for i in x], data[side]["ms_per_iteration"], width, color=color, label=side)
        hit.plot(x, data[side]["hit_ratio"], ls="none", marker="o" if k == 0 else "x",
                 markersize=9 if k == 0 else 8, markerfacecolor="none" if k == 0 else None, color=color, label=side)
    tops = [max(p, m) for p, m in zip(data["predicted"]["ms_per_iteration"], data["measured"]["ms_per_iteration"])]
    label = "range of the repeats"
    for k, side in enumerate(("predicted", "measured")):  # the ms/it of the repeats, around their median
        spread = [(i, lo, hi) for i, (lo, hi) in enumerate(data["range"][side]) if lo is not None]
        if spread:
            medians = [data[side]["ms_per_iteration"][i] for i, _, _ in spread]
            ms.errorbar([i + (k - 0.5) * width for i, _, _ in spread], medians, fmt="none", ecolor="black",
                        capsize=3, lw=1, yerr=[[m - lo for m, (_, lo, _) in zip(medians, spread)],
                                               [hi - m for m, (_, _, hi) in zip(medians, spread)]], label=label)
            label = None
            for i, _, hi in spread:
                tops[i] = max(tops[i], hi)
    for i, (error, top) in enumerate(zip(data["error"], tops)):
        if error is not None:
            ms.annotate(f"{error:+.0%}", (i, top), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=7)
    ms.set_ylabel("ms per iteration")
    ms.set_ylim(0, 1.2 * max(tops, default=1))
    ms.legend(fontsize=8, loc="upper center", ncol=3)
    hit.set_ylabel("hit ratio")
    hit.set_ylim(0, 1)
    hit.legend(fontsize=8)
    hit.set_xticks(x)
    hit.set_xticklabels(data["names"], rotation=30, ha="right", fontsize=8)
    for ax in (ms, hit):
        ax.grid(True, axis="y", alpha=0.3)
    summary = result.get("summary") or {}
    line = (f"|error| of ms/it: median {summary['median_abs_error_ms']:.0%}, max {summary['max_abs_error_ms']:.0%}"
            if summary.get("median_abs_error_ms") is not None and summary.get("max_abs_error_ms") is not None else "")
    ms.set_title(f"{title} planner predicted vs measured (labels: the prediction's error){'; ' + line if line else ''}"
                 .strip(), fontsize=9)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return data


# -- the command -------------------------------------------------------------------------------------------------

def plot_command(args) -> int:
    kind, document = read_input(args.log)
    out = args.out or (args.log if os.path.isdir(args.log) else os.path.dirname(os.path.abspath(args.log)))
    one_file = out.lower().endswith(".png") and not os.path.isdir(out)
    if args.measured and kind != "plan":
        raise ValueError(f"--measured goes with a plan's JSON; {args.log} is a "
                         + {"run": "run's log", "validation": "plan validation, which holds its measured runs"}[kind])
    if kind == "run":
        if one_file:
            raise ValueError(f"--out {out}: a run is drawn in three files ({', '.join(RUN_FIGURES)}); give a folder")
        for name in RUN_FIGURES:
            check_figure_path(os.path.join(out, name))
        written = plot_run(document, out, title=args.title or "")
    else:
        name, draw = {"plan": ("plan.png", draw_plan), "validation": ("plan_validation.png", draw_validation)}[kind]
        path = check_figure_path(out if one_file else os.path.join(out, name))
        if kind == "plan" and args.measured:
            what, validation = read_input(args.measured, measured=True)
            if what != "validation":
                raise ValueError(f"--measured {args.measured} is no plan validation: give the JSON of "
                                 "benchmarks/plan_validation.py")
            draw_plan(document, path, title=args.title or "", measured=validation)
        else:
            draw(document, path, title=args.title or "")
        written = [path]
    for path in written:
        print(f"wrote {path}")
    return 0


def add_plot_parser(sub) -> None:
    plot = sub.add_parser("plot", help="draw a run's training curves, stage times and hit ratio, or a plan",
                          description="Reads a run's metrics log (log.dir/metrics.jsonl) and writes curves.png, "
                                      "stages.png and cache.png; or a plan (lsm-gnn plan --json) and writes "
                                      "plan.png; or benchmarks/plan_validation.py's JSON and writes "
                                      "plan_validation.png (needs matplotlib)")
    plot.add_argument("log", metavar="INPUT", help="the run's log.dir or its metrics.jsonl, a plan's JSON, or a "
                                                   "plan validation's JSON (told apart by their content)")
    plot.add_argument("--out", help="folder for the PNG files (default: the input's folder); for a plan or a "
                                    "validation, one figure, a file name ending .png is taken as it is")
    plot.add_argument("--measured", metavar="JSON", help="with a plan: benchmarks/plan_validation.py's JSON, whose "
                                                         "runs of the plan's settings are drawn beside the prediction")
    plot.add_argument("--title", help="a title before each figure's own")
    plot.set_defaults(func=plot_command)
