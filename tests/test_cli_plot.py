"""lsm-gnn plot: a run's curves, stage times and hit ratio drawn from its metrics log; a plan; a plan's validation."""
import json
import os
import sys

import pytest

from lsm_gnn.cli import main
from lsm_gnn.cli.plot import draw_plan, draw_validation, moving_average, read_input, read_log
from lsm_gnn.testing import write_tiny_dataset

pytest.importorskip("matplotlib")
pytest.importorskip("torch_geometric")


def test_a_runs_log_becomes_three_pictures(tmp_path, capsys):
    ds, _ = write_tiny_dataset(tmp_path / "ds", num_nodes=400)
    assert main(["train", f"dataset={ds.path}", "model.kind=sage", "model.hidden=8", "sampler.fanouts=[3,2]",
                 "sampler.batch_size=32", "cache.capacity=70%", "train.epochs=2", f"log.dir={tmp_path / 'log'}",
                 "log.progress=false"]) == 0
    log = read_log(str(tmp_path / "log"))
    assert len(log["iterations"]) > 10 and len(log["evaluations"]) == 2
    capsys.readouterr()
    assert main(["plot", str(tmp_path / "log"), "--out", str(tmp_path / "pics"), "--title", "tiny"]) == 0
    out = capsys.readouterr().out
    for name in ("curves.png", "stages.png", "cache.png"):
        data = (tmp_path / "pics" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
        assert f"wrote {tmp_path / 'pics' / name}" in out
    assert main(["plot", str(tmp_path / "nothing")]) == 1
    assert "no metrics log" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "log"), "--out", str(tmp_path / "one.png")]) == 1
    assert "give a folder" in capsys.readouterr().err and not (tmp_path / "one.png").exists()


def test_the_moving_average_skips_missing_values():
    assert moving_average([1.0, None, 3.0, 5.0], width=2) == [1.0, 1.0, 2.0, 4.0]
    assert moving_average([None, 2.0]) == [None, 2.0]


# -- a plan and the plan against measured runs -------------------------------------------------------------------

PNG = b"\x89PNG\r\n\x1a\n"
PLAN_RUN = ["sampler.fanouts=[4,3]", "sampler.batch_size=16", "model.kind=sage", "model.hidden=16", "cache.window=4",
            "cache.static_score=none", "train.eval_splits=[]", "cache.backend=pread", "--iterations", "8",
            "--train-steps", "2", "--storage-seconds", "0.05"]
# A real run of benchmarks/plan_validation.py (docs/benchmarks/planner.md, "Planner: predicted vs measured"),
# kept in the repo
VALIDATION = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "results",
                          "plan_validation_quiet.json")


@pytest.fixture(scope="module")
def plan_files(tmp_path_factory):
    """A real plan of a tiny dataset (2 policies x PVP off/on x 3 sizes, the smallest too small for a batch),
    its JSON and the PNG ``lsm-gnn plan --plot`` drew."""
    tmp = tmp_path_factory.mktemp("plan")
    ds, _ = write_tiny_dataset(tmp / "ds", num_nodes=600, dim=128, row_alignment=512)
    assert main(["plan", ds.path, *PLAN_RUN, "--sizes", "1%,40%,70%", "--policies", "hybrid,rr", "--pvp", "both",
                 "--calibration", str(tmp / "cal.json"), "--json", str(tmp / "plan.json"),
                 "--plot", str(tmp / "drawn" / "plan.png")]) == 0
    return tmp / "plan.json", tmp / "drawn" / "plan.png"


def test_plan_is_drawn_from_its_json_and_by_plan_plot(plan_files, tmp_path, capsys):
    plan_json, drawn = plan_files
    assert drawn.read_bytes()[:8] == PNG
    capsys.readouterr()
    assert main(["plot", str(plan_json), "--out", str(tmp_path / "pics")]) == 0
    assert capsys.readouterr().out == f"wrote {tmp_path / 'pics' / 'plan.png'}\n"
    data = (tmp_path / "pics" / "plan.png").read_bytes()
    assert data[:8] == PNG and len(data) > 20_000
    assert read_input(str(plan_json))[0] == "plan"
    assert main(["plot", str(plan_json), "--out", str(tmp_path / "named.png")]) == 0  # one figure: a file name
    assert (tmp_path / "named.png").read_bytes()[:8] == PNG


def test_the_plan_figure_draws_every_row_of_the_plan(plan_files, tmp_path):
    plan = json.loads(plan_files[0].read_text())
    series = draw_plan(plan, str(tmp_path / "p.png"))
    assert [s["label"] for s in series] == ["hybrid", "hybrid+pvp", "rr", "rr+pvp"]
    rows = iter(plan["rows"])  # the grid's order: policy, then PVP, then size
    for s in series:
        for capacity, size, error in s["cannot_run"]:
            row = next(rows)
            assert (row["capacity"], row["capacity_bytes"], row["error"]) == (capacity, size, error)
            assert capacity == "1%"
        for k, capacity in enumerate(s["capacity"]):
            row = next(rows)
            assert (row["policy"], row["pvp"], row["capacity"]) == (s["policy"], s["pvp"], capacity)
            assert s["capacity_bytes"][k] == row["capacity_bytes"] and s["hit_ratio"][k] == row["hit_ratio"]
            assert s["ms_per_iteration"][k] == row["ms_per_iteration"] and s["steady_ms"][k] == row["steady_ms"]
            assert {stage: s["stages"][stage][k] for stage in s["stages"]} == {
                **{stage: row["stages_ms"][stage] for stage in ("sample", "cache", "read", "train")},
                "embedding": 0.0, "update": 0.0}  # a run without node embeddings
    assert next(rows, None) is None
    marked = [(s["label"], s["capacity"][s["recommended"]]) for s in series if s["recommended"] is not None]
    best = plan["recommendation"]
    assert marked == [(best["policy"] + ("+pvp" if best["pvp"] else ""), best["capacity"])]


def test_measured_runs_of_the_plans_settings_are_drawn_beside_it(plan_files, tmp_path, capsys):
    plan = json.loads(plan_files[0].read_text())
    run, row = plan["run"], next(r for r in plan["rows"] if r["policy"] == "rr" and r["pvp"] and "error" not in r)
    # plan_validation.py's layout, its figures made up: one result of the plan's settings, one of another batch
    settings = {"row_bytes": plan["dataset"]["row_bytes"], "fanouts": "[4,3]", "batch_size": run["batch_size"],
                "capacity": row["capacity"], "policy": "rr", "pvp": True}
    validation = {"settings": {"num_nodes": 600, "model": "sage", "hidden": 16}, "results": [
        {"name": "same", "settings": settings, "predicted": {},
         "measured": {"hit_ratio": 0.25, "ms_per_iteration": 9.0}},
        {"name": "other", "settings": {**settings, "batch_size": 32}, "predicted": {},
         "measured": {"hit_ratio": 0.5, "ms_per_iteration": 1.0}}]}
    series = draw_plan(plan, str(tmp_path / "m.png"), measured=validation)
    drawn = {s["label"]: s["measured"] for s in series if s["measured"]["capacity_bytes"]}
    assert drawn == {"rr+pvp": {"capacity_bytes": [row["capacity_bytes"]], "hit_ratio": [0.25],
                                "ms_per_iteration": [9.0]}}
    (tmp_path / "v.json").write_text(json.dumps(validation))
    assert main(["plot", str(plan_files[0]), "--measured", str(tmp_path / "v.json"), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "plan.png").read_bytes()[:8] == PNG
    validation["settings"]["num_nodes"] = 601  # another graph: nothing to draw, and said so
    (tmp_path / "v.json").write_text(json.dumps(validation))
    assert main(["plot", str(plan_files[0]), "--measured", str(tmp_path / "v.json"), "--out", str(tmp_path)]) == 1
    assert "no measured run of the plan's settings" in capsys.readouterr().err
    assert main(["plot", str(plan_files[0]), "--measured", str(plan_files[0]), "--out", str(tmp_path)]) == 1
    assert "is no plan validation" in capsys.readouterr().err
    assert main(["plot", VALIDATION, "--measured", VALIDATION, "--out", str(tmp_path)]) == 1
    assert "--measured goes with a plan's JSON" in capsys.readouterr().err


def test_plan_validation_is_drawn_predicted_beside_measured(tmp_path, capsys):
    result = json.loads(open(VALIDATION).read())
    data = draw_validation(result, str(tmp_path / "v.png"))
    assert (tmp_path / "v.png").read_bytes()[:8] == PNG
    assert data["names"] == [r["name"] for r in result["results"]]
    for side in ("predicted", "measured"):
        for figure in ("ms_per_iteration", "hit_ratio"):
            assert data[side][figure] == [r[side][figure] for r in result["results"]]
    assert data["error"] == pytest.approx([r["error"]["ms_per_iteration"] for r in result["results"]])
    for side, repeats in (("predicted", "plans"), ("measured", "runs")):  # 5 repeats of each
        assert data["range"][side] == [(min(x["ms_per_iteration"] for x in r[repeats]),
                                        max(x["ms_per_iteration"] for x in r[repeats])) for r in result["results"]]
    assert main(["plot", VALIDATION, "--out", str(tmp_path / "pics"), "--title", "quiet"]) == 0
    assert (tmp_path / "pics" / "plan_validation.png").read_bytes()[:8] == PNG


@pytest.mark.parametrize("content", [b'{"results": [{"name": "x"}]}', b'{"settings": {}}', b"[1, 2]",
                                     b"no json at all", PNG + b"\x00\xff"])
def test_a_file_that_is_neither_a_log_nor_a_plan_is_refused(tmp_path, capsys, content):
    path = tmp_path / "thing.json"
    path.write_bytes(content)
    assert main(["plot", str(path), "--out", str(tmp_path / "pics")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("lsm-gnn: error:") and "is neither a metrics log, a plan nor a plan validation" in err
    assert "Traceback" not in err and not (tmp_path / "pics").exists()


def test_without_matplotlib_the_message_says_how_to_install_it(plan_files, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert main(["plot", str(plan_files[0]), "--out", str(tmp_path)]) == 1
    assert "pip install matplotlib" in capsys.readouterr().err
    # lsm-gnn plan --plot says so before planning (the dataset is not even opened)
    assert main(["plan", str(tmp_path / "missing"), "--plot", str(tmp_path / "p.png")]) == 1
    err = capsys.readouterr().err
    assert "pip install matplotlib" in err and "no such dataset" not in err
    assert not (tmp_path / "p.png").exists()


def test_a_png_plot_did_not_write_is_never_replaced(plan_files, tmp_path, capsys):
    """A figure's file that holds someone else's PNG (or anything else) is refused before drawing and left as it
    was; a PNG lsm-gnn drew carries its mark and is replaced."""
    from lsm_gnn.cli.plot import is_our_png

    plan_json, drawn = plan_files
    assert is_our_png(str(drawn))  # lsm-gnn plan --plot's figure carries the mark too
    theirs = drawn.read_bytes().replace(b"lsm-gnn", b"someone")  # the same PNG, another writer
    pics = tmp_path / "pics"
    pics.mkdir()
    for name, content in (("plan.png", theirs), ("curves.png", b"my notes")):
        (pics / name).write_bytes(content)
        assert not is_our_png(str(pics / name))
    assert main(["plot", str(plan_json), "--out", str(pics)]) == 1
    assert f"--out {pics / 'plan.png'} exists and was not written by lsm-gnn" in capsys.readouterr().err
    log = pics / "log"
    log.mkdir()
    (log / "metrics.jsonl").write_text('{"iteration": 0, "loss": 1.0, "time": {"train": 0.01}, "bytes_read": 0}\n')
    assert main(["plot", str(log), "--out", str(pics)]) == 1
    assert f"--out {pics / 'curves.png'} exists and was not written by lsm-gnn" in capsys.readouterr().err
    assert main(["plan", str(tmp_path / "no-dataset"), "--plot", str(pics / "plan.png")]) == 1  # before planning
    assert f"--plot {pics / 'plan.png'} exists and was not written by lsm-gnn" in capsys.readouterr().err
    assert (pics / "plan.png").read_bytes() == theirs and (pics / "curves.png").read_bytes() == b"my notes"
    assert not (pics / "stages.png").exists()  # nothing drawn
    (pics / "plan.png").write_bytes(drawn.read_bytes())
    assert main(["plot", str(plan_json), "--out", str(pics), "--title", "again"]) == 0
    assert is_our_png(str(pics / "plan.png")) and (pics / "plan.png").read_bytes() != drawn.read_bytes()


def test_a_heterogeneous_plan_is_drawn_and_a_broken_plan_or_validation_refused_by_field(plan_files, tmp_path,
                                                                                        capsys):
    plan = json.loads(plan_files[0].read_text())
    # a heterogeneous graph's plan names its node types, each with its own row size (lsm_gnn.planner.plan)
    plan["dataset"] = {"path": "g", "num_nodes": 600, "target": "paper", "relations": 2, "groups": [["paper"]],
                       "node_types": {"paper": {"num_nodes": 500, "row_bytes": 512, "row_stride": 512},
                                      "topic": {"num_nodes": 100}}}
    (tmp_path / "hetero.json").write_text(json.dumps(plan))
    assert main(["plot", str(tmp_path / "hetero.json"), "--out", str(tmp_path / "h.png")]) == 0
    assert (tmp_path / "h.png").read_bytes()[:8] == PNG
    row = next(i for i, r in enumerate(plan["rows"]) if "error" not in r)
    validation = json.loads(open(VALIDATION).read())
    for document, where, value, field in (
            (plan, ("rows", row, "hit_ratio"), "abc", f"rows[{row}].hit_ratio"),
            (plan, ("rows", row, "stages_ms", "read"), None, f"rows[{row}].stages_ms.read"),
            (plan, ("dataset", "num_nodes"), 1.5, "dataset.num_nodes"), (plan, ("rows",), [1], "rows[0]"),
            (validation, ("results", 1, "measured", "ms_per_iteration"), "9", "results[1].measured.ms_per_iteration"),
            (validation, ("results", 0, "runs", 2), [], "results[0].runs[2]"),
            (validation, ("summary", "max_abs_error_ms"), {}, "summary.max_abs_error_ms")):
        broken = json.loads(json.dumps(document))
        holder = broken
        for key in where[:-1]:
            holder = holder[key]
        holder[where[-1]] = value
        (tmp_path / "broken.json").write_text(json.dumps(broken))
        capsys.readouterr()
        assert main(["plot", str(tmp_path / "broken.json"), "--out", str(tmp_path / "b.png")]) == 1
        err = capsys.readouterr().err
        assert f"{tmp_path / 'broken.json'}: {field}" in err and "internal error" not in err, err
