"""lsm-gnn report: one HTML page with every figure of a homogeneous, a heterogeneous and a link-prediction run,
read back without a browser; and the TensorBoard event files hold the scalars the metrics log holds."""
import base64
import json
from html.parser import HTMLParser

import pytest

from lsm_gnn.cli import main
from lsm_gnn.cli.plot import RUN_FIGURES
from lsm_gnn.cli.report import GENERATOR

pytest.importorskip("torch_geometric")
pytest.importorskip("matplotlib")

COMMON = ["model.kind=sage", "model.hidden=16", "sampler.fanouts=[3,2]", "train.epochs=2", "log.progress=false"]


class Page(HTMLParser):
    """What a browser would show: the figures (id, decoded image), the tables (rows of cell texts), the title."""

    def __init__(self, text: str):
        super().__init__()
        self.figures, self.tables, self.title = {}, [], ""
        self._figure = self._cell = None
        self._in_title = False
        self.text = text
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "figure":
            self._figure = attrs["id"]
        elif tag == "img" and self._figure is not None:
            kind, _, data = attrs["src"].partition(";base64,")
            assert kind == "data:image/png", "figures are embedded, nothing is fetched"
            self.figures[self._figure] = base64.b64decode(data)
        elif tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = ""
        elif tag == "title":
            self._in_title = True

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append(self._cell)
            self._cell = None
        elif tag == "figure":
            self._figure = None
        elif tag == "title":
            self._in_title = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data
        if self._in_title:
            self.title += data


def report(log_dir, tmp_path, *more) -> Page:
    out = tmp_path / "page.html"
    assert main(["report", str(log_dir), "--out", str(out), *more]) == 0
    return Page(out.read_text())


def epochs_of(log_dir) -> list[dict]:
    with open(log_dir / "metrics.jsonl") as fh:
        return [json.loads(line)["epoch_summary"] for line in fh if '"epoch_summary"' in line]


def check_page(page: Page, log_dir) -> list[list[str]]:
    """Every run figure is a PNG; the epochs' table has a row per epoch with its loss; returns that table."""
    assert set(page.figures) >= set(RUN_FIGURES)
    for name, png in page.figures.items():
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 2000, f"{name} is no drawn PNG"
    epochs = epochs_of(log_dir)
    table = next(t for t in page.tables if t[0][0] == "epoch")
    header, rows = table[0], table[1:]
    assert len(rows) == len(epochs) == 2
    for row, epoch in zip(rows, epochs):
        assert row[header.index("loss")] == f"{epoch['loss']:.4f}"
        assert row[header.index("hit ratio")] == ("-" if epoch["hit_ratio"] is None else f"{epoch['hit_ratio']:.3f}")
    return table


def test_a_homogeneous_runs_page(tmp_path):
    from lsm_gnn.testing import write_tiny_dataset

    ds, _ = write_tiny_dataset(tmp_path / "ds", num_nodes=600, dim=8)
    log = tmp_path / "log"
    assert main(["train", f"dataset={ds.path}", *COMMON, "sampler.batch_size=32", "cache.capacity=70%", "train.eval_splits=[val]",
                 f"log.dir={log}"]) == 0
    page = report(log, tmp_path, "--title", "tiny <run>")
    table = check_page(page, log)
    assert "val accuracy" in table[0] and page.title == "tiny <run>"
    result = next(t for t in page.tables if t[0] == ["split", "metric", "last evaluation", "best evaluation"])
    summary = json.loads((log / "metrics.jsonl").read_text().splitlines()[-1])["run_summary"]
    assert result[1] == ["val", "accuracy", f"{summary['eval']['val']['accuracy']:.4f}",
                         f"{summary['best']['eval']['val']['accuracy']:.4f}"]


def test_a_heterogeneous_runs_page_has_hit_ratios_per_type(tmp_path):
    from lsm_gnn.testing import write_tiny_hetero_dataset

    ds = write_tiny_hetero_dataset(tmp_path / "ds")
    log = tmp_path / "log"
    assert main(["train", f"dataset={ds.path}", *COMMON, "sampler.batch_size=40", "cache.capacity=70%",
                 "cache.static_score=degree", "train.eval_splits=[val]", f"log.dir={log}"]) == 0
    table = check_page(report(log, tmp_path), log)
    header = table[0]
    for row, epoch in zip(table[1:], epochs_of(log)):
        for t in ("paper", "author"):
            assert row[header.index(f"hit {t}")] == f"{epoch['hit_ratio_by_type'][t]:.3f}"


def test_a_link_prediction_runs_page_with_node_embeddings_and_its_plan(tmp_path, capsys):
    """The node embedding table's cache (hit ratio, MiB read and written) and its update stage reach the log and
    the page; evaluate names the best checkpoint's epoch as train and the page do."""
    from lsm_gnn.data.bipartite import generate_bipartite

    ds = generate_bipartite(tmp_path / "g", num_users=300, num_items=200, avg_interactions=12, feature_dim=8, seed=0,
                            val_fraction=0.1, progress=False)
    log, ckpt = tmp_path / "log", tmp_path / "ckpt"
    assert main(["train", f"dataset={ds.path}", *COMMON, "train.task=link", "sampler.batch_size=64",
                 "cache.capacity=90%", "model.node_embedding.dim=8", "model.node_embedding.capacity=100%",
                 f"log.dir={log}", f"checkpoint.dir={ckpt}"]) == 0
    steps = [json.loads(line) for line in (log / "metrics.jsonl").read_text().splitlines() if '"iteration"' in line]
    assert all(0 <= r["embedding_hit_ratio"] <= 1 and r["time"]["update"] > 0 for r in steps)
    assert steps[0]["embedding_hit_ratio"] < steps[-1]["embedding_hit_ratio"] == 1.0  # the whole table cached
    plan = tmp_path / "plan.json"
    assert main(["plan", str(ds.path), "--sizes", "20%,50%", "--policies", "hybrid", "--iterations", "8",
                 "--calibration", str(tmp_path / "cal.json"), "--json", str(plan), "train.task=link",
                 "model.kind=sage", "model.hidden=16", "sampler.fanouts=[3,2]", "sampler.batch_size=64"]) == 0
    page = report(log, tmp_path, "--plan", str(plan))
    table = check_page(page, log)
    header = table[0]
    assert any(h.startswith("val recall@") for h in header)
    for row, epoch in zip(table[1:], epochs_of(log)):
        assert row[header.index("table hit ratio")] == f"{epoch['embedding_hit_ratio']:.3f}"
        assert row[header.index("table MiB written")] == f"{epoch['embedding_bytes_written'] / 2**20:.2f}"
    assert page.figures["plan.png"].startswith(b"\x89PNG")
    best = json.loads((log / "metrics.jsonl").read_text().splitlines()[-1])["run_summary"]["best"]
    assert f"at epoch {best['epoch']}," in page.text
    capsys.readouterr()
    assert main(["evaluate", str(ckpt / "best.pt")]) == 0
    assert f"resumed from {ckpt / 'best.pt'}: the end of epoch {best['epoch']}, iteration {best['iterations']}" \
        in capsys.readouterr().err


def test_what_is_no_run_log_is_refused_in_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 1
    assert "no metrics log" in capsys.readouterr().err
    log = tmp_path / "log"
    log.mkdir()
    (log / "metrics.jsonl").write_text('{"iteration": 0, "epoch": 0, "loss": 1.0, "time": {"train": 0.01}, '
                                       '"hit_ratio": null, "bytes_read": 0}\n')
    assert main(["report", str(log), "--out", str(tmp_path)]) == 1  # a folder where the page goes
    assert "is a folder; give the page's file name" in capsys.readouterr().err
    assert main(["report", str(log), "--out", str(tmp_path / "p.html"), "--plan", str(log / "metrics.jsonl")]) == 1
    assert "is no plan" in capsys.readouterr().err
    assert not (tmp_path / "p.html").exists()  # nothing half-written
    for content, why in ((b"\x89PNG\r\n\x1a\n\xff\xfe\x00", "line 1: not UTF-8 text"), (b"", "it is empty"),
                         (b"\n[1]\n", "line 2: record: [1] is no record of an lsm-gnn run")):
        (log / "metrics.jsonl").write_bytes(content)
        for command in ("report", "plot"):
            assert main([command, str(log)]) == 1
            assert capsys.readouterr().err.startswith(f"lsm-gnn: error: {log / 'metrics.jsonl'} is not an lsm-gnn "
                                                      f"metrics log: it holds no record of a run ({why}")


def test_tensorboard_event_files_hold_the_logged_scalars(tmp_path):
    """With log.tensorboard=true every iteration's loss and hit ratio and every evaluation's metrics reach the
    event files, at their iteration, with the values metrics.jsonl holds."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from lsm_gnn.testing import write_tiny_dataset

    ds, _ = write_tiny_dataset(tmp_path / "ds", num_nodes=600, dim=8)
    log = tmp_path / "log"
    assert main(["train", f"dataset={ds.path}", *COMMON, "sampler.batch_size=32", "cache.capacity=70%", "train.eval_splits=[val]",
                 f"log.dir={log}", "log.tensorboard=true"]) == 0
    board = EventAccumulator(str(log / "tensorboard"))
    board.Reload()
    with open(log / "metrics.jsonl") as fh:
        records = [json.loads(line) for line in fh]
    steps = [r for r in records if "iteration" in r]
    evaluations = [r["evaluation"] for r in records if "evaluation" in r]
    scalars = lambda tag: [(e.step, e.value) for e in board.Scalars(tag)]  # noqa: E731
    assert scalars("loss") == [(r["iteration"], pytest.approx(r["loss"], rel=1e-6)) for r in steps]
    assert scalars("hit_ratio") == [(r["iteration"], pytest.approx(r["hit_ratio"], rel=1e-6)) for r in steps]
    assert len(evaluations) == 2
    assert scalars("evaluation/val/accuracy") == [(e["iterations"], pytest.approx(e["val"]["accuracy"], rel=1e-6))
                                                  for e in evaluations]


# -- a log from anywhere: every record checked, every value escaped ------------------------------------------------

PAYLOAD = '"><img src=x onerror=alert(1)><script>alert(1)</script>'
#: one record of each kind, with every field the trainer writes (lsm_gnn.training.metrics)
RECORDS = [
    {"iteration": 0, "epoch": 0, "loss": 0.7, "time": {"sample": 0.001, "train": 0.002, "update": 0.001},
     "hit_ratio": 0.5, "hit_ratio_by_type": {"paper": 0.5}, "bytes_read": 4096, "embedding_hit_ratio": 0.8,
     "embedding_bytes_read": 512, "embedding_bytes_written": 256},
    {"evaluation": {"epoch": 0, "iterations": 1, "seconds": 0.1, "val": {"accuracy": 0.5, "count": 10}}},
    {"epoch_summary": {"epoch": 0, "complete": True, "iterations": 1, "loss": 0.7, "wall_s": 0.1, "hit_ratio": 0.5,
                       "hit_ratio_by_type": {"paper": 0.5}, "bytes_read": 4096, "pipeline_efficiency": 0.9,
                       "embedding_hit_ratio": 0.8, "embedding_bytes_read": 512, "embedding_bytes_written": 256,
                       "val": {"accuracy": 0.5, "count": 10}}},
    {"run_summary": {"iterations": 1, "eval": {"val": {"accuracy": 0.5}},
                     "best": {"metric": "val.accuracy", "mode": "max", "value": 0.5, "epoch": 0, "iterations": 1,
                              "checkpoint": "best.pt", "stopped_early": False, "eval": {"val": {"accuracy": 0.5}}}}},
]
MISSING = object()
BAD_VALUES = [MISSING, None, "abc", PAYLOAD, True, float("nan"), float("inf"), -1, 2**70, 1.5, [1], {"a": 1}]


def leaves(value, path=()):
    """(path, value) of every field of a record, nested objects' fields included."""
    for key, item in value.items():
        yield path + (key,), item
        if isinstance(item, dict):
            yield from leaves(item, path + (key,))


def replaced(record: dict, path: tuple, value) -> dict:
    record = json.loads(json.dumps(record))
    *outer, last = path
    holder = record
    for key in outer:
        holder = holder[key]
    if value is MISSING:
        del holder[last]
    else:
        holder[last] = value
    return record


def usable(original, value, path) -> bool:
    """Whether ``value`` may stand where the trainer wrote ``original``: what the readers rely on."""
    name = path[-1]
    if value is None or isinstance(original, dict):
        return value is None or isinstance(value, dict)
    if isinstance(original, (bool, str)):
        return type(value) is type(original)
    if type(value) not in (int, float):
        return False
    if value != value:  # NaN: the mean loss of an epoch without iterations only
        return path == ("epoch_summary", "loss")
    if len(path) > 1 and path[-2] in ("train", "val", "test"):  # a metric: any number ("count" is not shown)
        return abs(value) < float("inf")
    if isinstance(original, int) or name.endswith(("bytes_read", "bytes_written")):
        return type(value) is int and value >= 0
    return value <= 1 if "hit_ratio" in path[-2:] or "hit_ratio" in name else abs(value) < float("inf")


def mutated_log(tmp_path) -> tuple:
    """A log of the records above, then one line per (field, bad value): (its file, {line: (path, value,
    original)})."""
    lines, cases = [json.dumps(r) for r in RECORDS[:-1]], {}
    for record in RECORDS:
        for path, original in leaves(record):
            for value in BAD_VALUES:
                lines.append(json.dumps(replaced(record, path, value)))
                cases[len(lines)] = (path, value, original)
    lines += ["", "[1, 2]", "3", '"text"', "{not json", '{"unknown": 1}', "[" * 100_000, json.dumps(RECORDS[-1])]
    log = tmp_path / "log"
    log.mkdir(exist_ok=True)
    (log / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return log / "metrics.jsonl", cases, len(lines)


def test_every_field_of_every_record_kind_is_checked_or_skipped_by_name(tmp_path, capsys, monkeypatch):
    """Each field of each record kind given each bad value (missing, null, text, markup, a boolean, NaN, inf, a
    negative, a huge and a fractional number, a list, an object): the reader keeps the line only with a value its
    readers can use, and otherwise skips it with a warning naming file:line:field; lines that are no record
    (empty, a list, a number, text, broken JSON, unknown, nested past the parser) are skipped by line too."""
    from lsm_gnn.training import run_log

    monkeypatch.setattr(run_log, "MAX_WARNINGS", 10**6)
    file, cases, count = mutated_log(tmp_path)
    log = run_log.read_log(str(file))
    warnings = {}
    for line in capsys.readouterr().err.splitlines():
        assert line.startswith(f"lsm-gnn: warning: {file}:") and line.endswith("; the line is skipped"), line
        number, _, why = line[len(f"lsm-gnn: warning: {file}:"):].partition(": ")
        warnings[int(number)] = why
    kept = {}  # line -> (kind, record) for the lines read
    lists = {"iteration": log["iterations"], "evaluation": log["evaluations"], "epoch_summary": log["epochs"]}
    position = dict.fromkeys(lists, 0)
    for number in range(1, count + 1):
        if number in warnings:
            continue
        raw = (file.read_text().splitlines()[number - 1])
        if not raw:
            continue
        kind = next(k for k in run_log.KINDS if k in json.loads(raw))
        if kind != "run_summary":
            kept[number] = lists[kind][position[kind]]
            position[kind] += 1
    assert position == {k: len(v) for k, v in lists.items()}
    for number, (path, value, original) in cases.items():
        kind = path[0] if path[0] in run_log.KINDS[1:] else "iteration"
        field = "record" if value is MISSING and path[0] in run_log.KINDS and len(path) == 1 else ".".join(path)
        if number in warnings:
            assert warnings[number].startswith(field + ":") or warnings[number].startswith(field + "."), \
                (number, field, value, warnings[number])
        else:
            record = kept.get(number, log["summary"])
            for key in path[1:-1] if kind != "iteration" else path[:-1]:
                record = record[key] if record is not None else None
            if record is not None and path[-1] in record:
                assert usable(original, record[path[-1]], path), (field, value)
    for line in range(count - 7, count):  # the lines that are no record of a run
        assert line in warnings or not file.read_text().splitlines()[line - 1], line
    assert log["summary"] == {**RECORDS[-1]["run_summary"], "eval": {"val": {"accuracy": 0.5}, "train": None,
                                                                      "test": None},
                              "best": {**RECORDS[-1]["run_summary"]["best"],
                                       "eval": {"val": {"accuracy": 0.5}, "train": None, "test": None}}}


class Markup(HTMLParser):
    """Every tag and attribute a browser would make of a page."""

    def __init__(self, text: str):
        super().__init__()
        self.tags = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


@pytest.mark.slow
def test_script_in_any_field_of_a_log_or_a_plan_never_reaches_the_page(tmp_path, capsys):
    """Markup in every text field and name of every record kind (metric, split, stage and node type names, the
    best's metric, mode and checkpoint), in a plan's fields, the title and the log's path; and numbers' fields
    holding it: the page holds it as text only (no script, no handler, no image but the figures), and plot and
    report finish with the bad lines named. Names with mathtext's ``$`` draw as they are."""
    file, _, _ = mutated_log(tmp_path)
    names = {"iteration": {"time": {PAYLOAD: 0.001, "$\\x$": 0.002, "train": 0.001},
                           "hit_ratio_by_type": {PAYLOAD: 0.5, "a$b": 0.25}},
             "epoch_summary": {"hit_ratio_by_type": {PAYLOAD: 0.5}, "val": {PAYLOAD: 0.5, "$\\x$": 0.1},
                               PAYLOAD: {"accuracy": 0.5}},
             "evaluation": {"val": {PAYLOAD: 0.5, "$\\x$": 0.1, "un$balanced": 0.2}, PAYLOAD: {"x": 1.0}},
             "run_summary": {"eval": {"val": {PAYLOAD: 0.5}}, "best": {"metric": PAYLOAD, "mode": PAYLOAD,
                                                                      "checkpoint": PAYLOAD}}}
    lines = file.read_text().splitlines()
    for record in RECORDS:
        kind = next(k for k in ("evaluation", "epoch_summary", "run_summary") if k in record) \
            if "iteration" not in record else "iteration"
        body = json.loads(json.dumps(record if kind == "iteration" else record[kind]))
        for key, value in names[kind].items():
            body[key] = {**body[key], **value} if isinstance(body.get(key), dict) and key != "best" else value
        if kind == "run_summary":
            body["best"] = {**record[kind]["best"], **names[kind]["best"]}
            lines.append(json.dumps({kind: body}))
            body["best"]["mode"] = "max"  # a mode of its own: the best is shown
        lines.append(json.dumps(body if kind == "iteration" else {kind: body}))
    folder = tmp_path / PAYLOAD.replace("/", "|")
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    plan = {"rows": [{"policy": PAYLOAD, "pvp": False, "capacity": "$x", "capacity_bytes": 2**20, "hit_ratio": 0.5,
                      "ms_per_iteration": 2.0, "steady_ms": 1.0, "stages_ms": dict.fromkeys(
                          ("sample", "cache", "read", "train"), 0.5)},
                     {"policy": PAYLOAD, "pvp": True, "capacity": "a$b", "capacity_bytes": 2**10, "error": PAYLOAD}],
            "recommendation": None, "dataset": {"num_nodes": 10, "row_bytes": 4},
            "run": {"fanouts": [2], "batch_size": 4, "model": PAYLOAD, "hidden": 4, "iterations": 8, "cores": 1}}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = tmp_path / "page.html"
    capsys.readouterr()
    assert main(["report", str(folder), "--out", str(out), "--plan", str(tmp_path / "plan.json"),
                 "--title", "$" + PAYLOAD]) == 0
    err = capsys.readouterr().err
    assert "lsm-gnn: warning:" in err and "more lines skipped" in err and "Traceback" not in err
    text = out.read_text()
    for tag, attrs in Markup(text).tags:
        assert tag != "script" and not any(name.startswith("on") for name in attrs), (tag, attrs)
        assert tag != "img" or attrs["src"].startswith("data:image/png;base64,")
    page = Page(text)
    assert page.title == "$" + PAYLOAD and PAYLOAD in page.text.replace("&quot;", '"').replace("&lt;", "<") \
        .replace("&gt;", ">")
    assert set(page.figures) == {*RUN_FIGURES, "plan.png"}
    epochs = next(t for t in page.tables if t[0][0] == "epoch")
    assert f"hit {PAYLOAD}" in epochs[0] and f"val {PAYLOAD}" in epochs[0]
    assert main(["plot", str(folder), "--out", str(tmp_path / "pics"), "--title", "a$b"]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_a_file_report_did_not_write_is_never_replaced(tmp_path, capsys):
    """--out (or the default report.html) naming a dataset's meta.json, a page of someone else's, a link, is
    refused before any work and left as it was; the page report wrote is replaced."""
    log = tmp_path / "log"
    log.mkdir()
    (log / "metrics.jsonl").write_text(json.dumps(RECORDS[0]) + "\n")
    foreign = {"meta.json": b'{"num_nodes": 10}', "page.html": b"<!DOCTYPE html><html><head><title>mine</title>",
               "report.html": b"<html>notes</html>"}
    for name, content in foreign.items():
        (tmp_path / name).write_bytes(content)
    (tmp_path / "link.html").symlink_to(tmp_path / "page.html")
    for out in ("meta.json", "page.html", "link.html"):
        assert main(["report", str(log), "--out", str(tmp_path / out)]) == 1
        assert "was not written by lsm-gnn" in capsys.readouterr().err or out == "link.html"
    (log / "report.html").write_bytes(foreign["report.html"])  # the default page's name, taken
    assert main(["report", str(log)]) == 1
    assert f"--out {log / 'report.html'} exists and was not written by lsm-gnn" in capsys.readouterr().err
    assert all((tmp_path / name).read_bytes() == content for name, content in foreign.items())
    assert (log / "report.html").read_bytes() == foreign["report.html"]
    (log / "report.html").write_text(f"<!DOCTYPE html><html><head>{GENERATOR}<title>an older page</title>")
    assert main(["report", str(log), "--title", "again"]) == 0  # a page of its own: replaced
    assert Page((log / "report.html").read_text()).title == "again"
