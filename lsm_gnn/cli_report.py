"""``lsm-gnn report``: one self-contained HTML page of a run, from its metrics log (``log.dir/metrics.jsonl``).

The page holds every figure ``lsm-gnn plot`` draws of the run (training curves, time per stage, the cache's hit
ratio, per node type on a typed graph), embedded as PNG data, beside tables of what the log recorded: the run's
result and best evaluation, and per epoch its loss, time, hit ratios, bytes read, pipeline efficiency and
evaluation metrics. ``--plan PLAN.json`` adds the planner's figure. Nothing is fetched when it is opened: the
page can be mailed or archived as it is. Needs matplotlib, as ``lsm-gnn plot`` does.
"""
from __future__ import annotations

import base64
import html
import json
import os
import tempfile

from lsm_gnn.cli_plot import draw_plan, plot_run, read_input, read_log
from lsm_gnn.fileio import atomic_write_bytes

#: the run's figures, in page order, with what each shows
RUN_FIGURES = (("curves.png", "Training loss per iteration and every evaluation's metrics"),
               ("stages.png", "Milliseconds per iteration by stage (sample and gather overlap training; wait is "
                              "what they did not hide)"),
               ("cache.png", "The cache's hit ratio over the run (per node type on a typed graph) and the bytes "
                             "read from storage"))


def read_run(path: str) -> dict:
    """The log at ``path`` (a log.dir or its metrics.jsonl): :func:`~lsm_gnn.cli_plot.read_log`'s iterations and
    evaluations, plus the epochs' summaries and the run's (``None`` for a run that did not finish)."""
    log = read_log(path)
    file = os.path.join(path, "metrics.jsonl") if os.path.isdir(path) else path
    log["epochs"], log["summary"] = [], None
    with open(file) as fh:
        for line in fh:
            record = json.loads(line)
            if "epoch_summary" in record:
                log["epochs"].append(record["epoch_summary"])
            elif "run_summary" in record:
                log["summary"] = record["run_summary"]
    return log


def _number(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else html.escape(str(value))


def _table(headers: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_number(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def epoch_table(epochs: list[dict]) -> tuple[list[str], list[list]]:
    """The epochs' summaries as (headers, rows): loss, time, hit ratio (and per node type), MiB read, pipeline
    efficiency, then each evaluated split's metrics."""
    types = sorted({t for e in epochs for t in (e.get("hit_ratio_by_type") or {})})
    metrics = sorted({(split, metric) for e in epochs for split in ("train", "val", "test")
                      if isinstance(e.get(split), dict) for metric in e[split] if metric != "count"})
    headers = ["epoch", "iterations", "loss", "seconds", "hit ratio", *[f"hit {t}" for t in types], "MiB read",
               "pipeline efficiency", *[f"{split} {metric}" for split, metric in metrics]]
    rows = []
    for e in epochs:
        by_type = e.get("hit_ratio_by_type") or {}
        rows.append([e["epoch"] if e["complete"] else f"{e['epoch']} (partial)", e["iterations"], e["loss"],
                     e["wall_s"], e["hit_ratio"], *[by_type.get(t) for t in types], e["bytes_read"] / 2 ** 20,
                     e.get("pipeline_efficiency"),
                     *[e.get(split, {}).get(metric) for split, metric in metrics]])
    return headers, rows


def _summary_html(summary: dict | None) -> str:
    if summary is None:
        return "<p>The log has no run summary: the run did not finish (or still runs).</p>"
    parts = [f"<p>{summary['iterations']:,} iterations.</p>"]
    for title, evaluation in (("Last evaluation", summary.get("eval")),
                              ("Best evaluation", (summary.get("best") or {}).get("eval"))):
        if evaluation:
            rows = [[split, metric, value] for split, metrics in evaluation.items() if isinstance(metrics, dict)
                    for metric, value in metrics.items()]
            parts.append(f"<h3>{title}</h3>" + _table(["split", "metric", "value"], rows))
    best = summary.get("best")
    if best:
        parts.append(f"<p>Selected by {html.escape(str(best['metric']))} ({best['mode']}): epoch {best['epoch']}, "
                     f"after {best['iterations']:,} iterations; checkpoint {html.escape(str(best['checkpoint']))}"
                     f"{', stopped early' if best.get('stopped_early') else ''}.</p>")
    return "".join(parts)


def _figure(png: bytes, name: str, caption: str) -> str:
    data = base64.b64encode(png).decode()
    return (f'<figure id="{html.escape(name)}"><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


STYLE = ("body{font-family:sans-serif;max-width:70em;margin:2em auto;padding:0 1em}"
         "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.2em .5em;"
         "text-align:right}th{background:#f4f4f4}figure{margin:1.5em 0}img{max-width:100%}"
         "figcaption{color:#555;font-size:.9em}")


def make_report(log_path: str, plan_path: str | None = None, title: str = "") -> str:
    """The HTML page of the run logged at ``log_path`` (and the plan at ``plan_path``)."""
    log = read_run(log_path)
    title = title or f"lsm-gnn run: {os.path.abspath(log_path)}"
    sections = [f"<h1>{html.escape(title)}</h1>", "<h2>Result</h2>", _summary_html(log["summary"])]
    if log["epochs"]:
        sections += ["<h2>Epochs</h2>", _table(*epoch_table(log["epochs"]))]
    sections.append("<h2>Figures</h2>")
    with tempfile.TemporaryDirectory() as folder:
        plot_run(log, folder)
        for name, caption in RUN_FIGURES:
            with open(os.path.join(folder, name), "rb") as fh:
                sections.append(_figure(fh.read(), name, caption))
        if plan_path:
            kind, plan = read_input(plan_path)
            if kind != "plan":
                raise ValueError(f"--plan {plan_path} is no plan: give the JSON of lsm-gnn plan --json FILE")
            draw_plan(plan, os.path.join(folder, "plan.png"))
            with open(os.path.join(folder, "plan.png"), "rb") as fh:
                sections.append(_figure(fh.read(), "plan.png", "The planner's predictions per cache size"))
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body>{''.join(sections)}</body></html>\n")


def report_command(args) -> int:
    out = args.out or os.path.join(args.log if os.path.isdir(args.log) else os.path.dirname(os.path.abspath(args.log)),
                                   "report.html")
    if os.path.isdir(out):
        raise ValueError(f"--out {out} is a folder; give the page's file name (e.g. {os.path.join(out, 'report.html')})")
    atomic_write_bytes(make_report(args.log, args.plan, args.title or "").encode(), out)
    print(f"wrote {out}")
    return 0


def add_report_parser(sub) -> None:
    report = sub.add_parser("report", help="one HTML page of a run: its result, epochs and every figure",
                            description="Reads a run's metrics log (log.dir/metrics.jsonl) and writes one "
                                        "self-contained HTML page (figures embedded; needs matplotlib)")
    report.add_argument("log", metavar="LOG", help="the run's log.dir or its metrics.jsonl")
    report.add_argument("--out", help="the page to write (default: report.html beside the log)")
    report.add_argument("--plan", metavar="JSON", help="also the planner's figure of this plan (lsm-gnn plan --json)")
    report.add_argument("--title", help="the page's title (default: the log's path)")
    report.set_defaults(func=report_command)
