"""lsm-gnn report: one HTML page with every figure of a homogeneous, a heterogeneous and a link-prediction run,
read back without a browser; and the TensorBoard event files hold the scalars the metrics log holds."""
import base64
import json
from html.parser import HTMLParser

import pytest

from lsm_gnn.cli import main
from lsm_gnn.cli_report import RUN_FIGURES

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
    assert set(page.figures) >= {name for name, _ in RUN_FIGURES}
    for name, png in page.figures.items():
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 2000, f"{name} is no drawn PNG"
    epochs = epochs_of(log_dir)
    table = next(t for t in page.tables if t[0][0] == "epoch")
    header, rows = table[0], table[1:]
    assert len(rows) == len(epochs) == 2
    for row, epoch in zip(rows, epochs):
        assert row[header.index("loss")] == f"{epoch['loss']:.4f}"
        assert row[header.index("hit ratio")] == ("-" if epoch["hit_ratio"] is None else f"{epoch['hit_ratio']:.4f}")
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
    result = next(t for t in page.tables if t[0] == ["split", "metric", "value"])
    assert ["val", "accuracy"] == result[1][:2]


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
            assert row[header.index(f"hit {t}")] == f"{epoch['hit_ratio_by_type'][t]:.4f}"


def test_a_link_prediction_runs_page_and_its_plan(tmp_path):
    from lsm_gnn.data.bipartite import generate_bipartite

    ds = generate_bipartite(tmp_path / "g", num_users=300, num_items=200, avg_interactions=12, feature_dim=8, seed=0,
                            val_fraction=0.1, progress=False)
    log = tmp_path / "log"
    assert main(["train", f"dataset={ds.path}", *COMMON, "train.task=link", "sampler.batch_size=64",
                 "cache.capacity=90%", f"log.dir={log}"]) == 0
    plan = tmp_path / "plan.json"
    assert main(["plan", str(ds.path), "--sizes", "20%,50%", "--policies", "hybrid", "--iterations", "8",
                 "--calibration", str(tmp_path / "cal.json"), "--json", str(plan), "train.task=link",
                 "model.kind=sage", "model.hidden=16", "sampler.fanouts=[3,2]", "sampler.batch_size=64"]) == 0
    page = report(log, tmp_path, "--plan", str(plan))
    table = check_page(page, log)
    assert any(h.startswith("val recall@") for h in table[0])
    assert page.figures["plan.png"].startswith(b"\x89PNG")


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
