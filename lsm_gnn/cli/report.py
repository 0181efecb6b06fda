"""``lsm-gnn report``: one self-contained HTML page of a run, from its metrics log (``log.dir/metrics.jsonl``).

The page holds every figure ``lsm-gnn plot`` draws of the run (training curves, time per stage, the cache's hit
ratio, per node type on a typed graph), embedded as PNG data, beside tables of what the log recorded: the run's
result and best evaluation, and per epoch its loss, time, hit ratios, bytes read, pipeline efficiency and
evaluation metrics. ``--plan PLAN.json`` adds the planner's figure. Nothing is fetched when it is opened: the
page can be mailed or archived as it is. Needs matplotlib, as ``lsm-gnn plot`` does.

The log may come from anywhere: its records are checked (:func:`~lsm_gnn.training.run_log.read_log`) and every value the
page shows is escaped in one place (:func:`_text`), so no log puts markup or script into the page. The page is
marked in its head (:data:`GENERATOR`): ``--out`` replaces only a page of its own, never another file.
"""
from __future__ import annotations

import base64
import html
import os
import tempfile

from lsm_gnn.cli.plot import draw_plan, plot_run, read_input
from lsm_gnn.utils.fileio import atomic_write_bytes, check_output_file
from lsm_gnn.training.run_log import SPLITS, read_log

#: what each run figure (:data:`~lsm_gnn.cli.plot.RUN_FIGURES`) shows, in page order
CAPTIONS = {"curves.png": "The training loss per iteration, then each evaluation metric per split",
            "stages.png": "Milliseconds per iteration by stage: the training thread's (their sum is the "
                          "iteration's time; wait is what the loader did not hide), then the loader's, overlapped",
            "cache.png": "The caches' hit ratios over the run (the features', per node type on a typed graph, and "
                         "the node embedding tables'), then the MiB read from storage (and written to the tables)"}
#: the mark in a page's head that tells it is one this command wrote: only such a file is replaced
GENERATOR = '<meta name="generator" content="lsm-gnn report">'


def _text(value, digits: int = 4) -> str:
    """Every value the page shows, formatted and HTML-escaped here and nowhere else: whatever the log held
    (a name, a number, text from a hostile file) stays text."""
    if value is None:
        text = "-"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, float):
        text = f"{value:.{digits}f}"
    elif isinstance(value, int):
        text = f"{value:,}"
    else:
        text = str(value)
    return html.escape(text)


def _table(headers: list, rows: list[list], digits: list[int] | None = None, scroll: bool = False) -> str:
    """A table whose rows start with a header cell, numbers to ``digits`` per column (default 4); ``scroll``: in
    a box of its own, scrolled both ways under a header row and a first column that stay in view (no script)."""
    digits = digits or [4] * len(headers)
    # a long name may break after its underscores and before its @k (on escaped text: adds markup of our own only)
    head = "".join(f'<th scope="col">{_text(h).replace("_", "_<wbr>").replace("@", "<wbr>@")}</th>' for h in headers)
    body = "".join(f'<tr><th scope="row">{_text(row[0])}</th>'
                   + "".join(f'<td{" class=t" if isinstance(v, str) else ""}>{_text(v, d)}</td>'
                             for v, d in zip(row[1:], digits[1:])) + "</tr>" for row in rows)
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    return f'<div class="scroll">{table}</div>' if scroll else table


def _metric_columns(records: list[dict], baselines: bool = True) -> list[tuple[str, str]]:
    """The (split, metric) pairs measured in ``records`` (evaluations or epoch summaries), splits in order;
    without ``baselines``, not a random ranking's (``random_recall@20``, the same every epoch)."""
    return [(split, metric) for split in SPLITS
            for metric in sorted({m for r in records if r.get(split) for m in r[split]
                                  if m != "count" and (baselines or not m.startswith("random"))})]


def epoch_table(epochs: list[dict]) -> tuple[list[str], list[list], list[int]]:
    """The epochs' summaries as (headers, rows, digits per column): loss, time, the features' hit ratio (and per
    node type) and MiB read, the node embedding tables' hit ratio and MiB read and written, pipeline efficiency,
    then each evaluated split's metrics. Columns of what the run did not have (features, tables) are left out."""
    features = any(e["hit_ratio"] is not None or e["bytes_read"] for e in epochs)
    types = sorted({t for e in epochs for t in e["hit_ratio_by_type"] or {}})
    embedding = any(e["embedding_bytes_read"] is not None for e in epochs)
    metrics = _metric_columns(epochs, baselines=False)
    columns = [("epoch", 0), ("iterations", 0), ("loss", 4), ("seconds", 2)]
    columns += [("hit ratio", 3), *[(f"hit {t}", 3) for t in types], ("MiB read", 2)] if features else []
    columns += [("table hit ratio", 3), ("table MiB read", 2), ("table MiB written", 2)] if embedding else []
    columns += [("pipeline efficiency", 2), *[(f"{split} {metric}", 4) for split, metric in metrics]]
    mib = lambda value: None if value is None else value / 2**20  # noqa: E731
    rows = []
    for e in epochs:
        by_type = e["hit_ratio_by_type"] or {}
        rows.append([e["epoch"] if e["complete"] else f"{e['epoch']} (partial)", e["iterations"], e["loss"],
                     e["wall_s"], *([e["hit_ratio"], *[by_type.get(t) for t in types], mib(e["bytes_read"])]
                                    if features else []),
                     *([e["embedding_hit_ratio"], mib(e["embedding_bytes_read"]), mib(e["embedding_bytes_written"])]
                       if embedding else []),
                     e["pipeline_efficiency"], *[(e[split] or {}).get(metric) for split, metric in metrics]])
    return [name for name, _ in columns], rows, [d for _, d in columns]


def _summary_html(summary: dict | None) -> str:
    if summary is None:
        return "<p>The log has no run summary: the run did not finish (or still runs).</p>"
    parts = [f"<p>{_text(summary['iterations'])} iterations.</p>"]
    best = summary["best"] or {}
    last, chosen = summary["eval"] or {}, best.get("eval") or {}
    columns = _metric_columns([last, chosen])
    if columns:
        parts.append(_table(["split", "metric", "last evaluation", "best evaluation"],
                            [[split, metric, (last.get(split) or {}).get(metric), (chosen.get(split) or {}).get(metric)]
                             for split, metric in columns]))
    if best:
        parts.append(f"<p>Best by {_text(best['metric'])} ({_text(best['mode'])}): {_text(best['value'])} at epoch "
                     f"{_text(best['epoch'])}, after {_text(best['iterations'])} iterations; checkpoint "
                     f"{_text(best['checkpoint'])}{', stopped early' if best['stopped_early'] else ''}.</p>")
    return "".join(parts)


def _figure(png: bytes, name: str, caption: str) -> str:
    data = base64.b64encode(png).decode()
    return (f'<figure id="{_text(name)}"><img alt="{_text(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_text(caption)}</figcaption></figure>")


STYLE = ("body{font-family:sans-serif;max-width:80em;margin:2em auto;padding:0 1em}"
         "table{border-collapse:separate;border-spacing:0;margin:.5em 0;font-size:.9em}"
         "td,th{border:1px solid #ddd;padding:.2em .5em;text-align:right;white-space:nowrap;background:#fff}"
         "thead th{background:#f4f4f4;white-space:normal;vertical-align:bottom}"
         "tbody th,td.t{font-weight:normal;text-align:left}"
         ".scroll{max-height:32em;max-width:100%;overflow:auto;border:1px solid #ccc;display:inline-block}"
         ".scroll table{margin:0}.scroll thead th{position:sticky;top:0;z-index:1}"
         ".scroll tbody th{position:sticky;left:0;background:#fafafa}"
         ".scroll thead th:first-child{left:0;z-index:2}"
         "figure{margin:1.5em 0}img{max-width:100%}figcaption{color:#555;font-size:.9em}")


def make_report(log_path: str, plan_path: str | None = None, title: str = "") -> str:
    """The HTML page of the run logged at ``log_path`` (and the plan at ``plan_path``)."""
    log = read_log(log_path)
    plan = None
    if plan_path:
        kind, plan = read_input(plan_path)
        if kind != "plan":
            raise ValueError(f"--plan {plan_path} is no plan: give the JSON of lsm-gnn plan --json FILE")
    title = title or f"lsm-gnn run: {os.path.abspath(log_path)}"
    sections = [f"<h1>{_text(title)}</h1>", "<h2>Result</h2>", _summary_html(log["summary"])]
    if log["epochs"]:
        sections += [f"<h2>Epochs</h2><p>{_text(len(log['epochs']))} epoch summaries; the table scrolls, its header "
                     "and first column stay in view.</p>", _table(*epoch_table(log["epochs"]), scroll=True)]
    sections.append("<h2>Figures</h2>")
    with tempfile.TemporaryDirectory() as folder:
        figures = [(path, CAPTIONS[os.path.basename(path)]) for path in plot_run(log, folder)]
        if plan is not None:
            draw_plan(plan, os.path.join(folder, "plan.png"))
            figures.append((os.path.join(folder, "plan.png"), "The planner's predictions per cache size"))
        for path, caption in figures:
            with open(path, "rb") as fh:
                sections.append(_figure(fh.read(), os.path.basename(path), caption))
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">{GENERATOR}<title>{_text(title)}</title>'
            f'<meta name="viewport" content="width=device-width"><style>{STYLE}</style></head>'
            f"<body>{''.join(sections)}</body></html>\n")


def is_report_page(path: str) -> bool:
    """Whether ``path`` is a page this command wrote: :data:`GENERATOR` in its head."""
    with open(path, "rb") as fh:
        return GENERATOR.encode() in fh.read(4096)


def report_command(args) -> int:
    out = args.out or os.path.join(args.log if os.path.isdir(args.log) else os.path.dirname(os.path.abspath(args.log)),
                                   "report.html")
    if os.path.isdir(out):
        raise ValueError(f"--out {out} is a folder; give the page's file name (e.g. {os.path.join(out, 'report.html')})")
    check_output_file(out, "--out", ours=is_report_page)
    page = make_report(args.log, args.plan, args.title or "")
    check_output_file(out, "--out", ours=is_report_page)  # a file that appeared meanwhile is refused the same way
    atomic_write_bytes(page.encode(), out)
    print(f"wrote {out}")
    return 0


def add_report_parser(sub) -> None:
    report = sub.add_parser("report", help="one HTML page of a run: its result, epochs and every figure",
                            description="Reads a run's metrics log (log.dir/metrics.jsonl) and writes one "
                                        "self-contained HTML page (figures embedded; needs matplotlib)")
    report.add_argument("log", metavar="LOG", help="the run's log.dir or its metrics.jsonl")
    report.add_argument("--out", help="the page to write (default: report.html beside the log); an existing file "
                                      "is replaced only if it is a page lsm-gnn report wrote")
    report.add_argument("--plan", metavar="JSON", help="also the planner's figure of this plan (lsm-gnn plan --json)")
    report.add_argument("--title", help="the page's title (default: the log's path)")
    report.set_defaults(func=report_command)
