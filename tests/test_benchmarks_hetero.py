"""benchmarks/hetero.py runs end to end at tiny size, so it never rots."""
import json
import os

import pytest

from lsm_gnn.testing.benchmarking import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def hetero_bench():
    return load_script(os.path.join(ROOT, "benchmarks", "hetero.py"))


@pytest.fixture(scope="module")
def quick_run(hetero_bench, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hetero_bench")
    try:
        import torch_geometric  # noqa: F401  (the trainer's models)
        repeats, step = "1", "3"
    except ImportError:
        repeats, step = "0", "0"
    out = tmp / "hetero.json"
    result = hetero_bench.main(["--quick", "--data", str(tmp / "data"), "--json", str(out), "--repeats", repeats,
                                "--step-batches", step])
    with open(out) as f:
        return result, json.load(f)


def test_the_json_has_every_part(quick_run):
    result, written = quick_run
    for key in ("command", "settings", "machine", "dataset", "trace", "sizes", "seconds"):
        assert key in written
    assert written["sizes"] == json.loads(json.dumps(result["sizes"]))
    assert set(written["trace"]["per_type"]) == {"paper", "author", "institute", "fos"}
    assert written["dataset"]["total_rows"] == sum(written["dataset"]["num_nodes"].values())


def test_hit_ratios_are_sane(quick_run):
    written, policies = quick_run[1], ("rr", "static", "dynamic", "hybrid", "hybrid+pvp")
    accesses = sum(t["accesses"] for t in written["trace"]["per_type"].values())
    for row in written["sizes"].values():
        belady = row["policies"]["belady"]["hit_ratio"]
        assert 0.0 < belady <= 1.0
        for policy in policies:
            entry = row["policies"][policy]
            assert 0.0 <= entry["cache_hit_ratio"] <= belady  # MIN bounds every cache's own hits
            assert 0.0 <= entry["hit_ratio"] <= 1.0 and entry["requests"] < accesses
            assert all(0.0 <= r <= 1.0 for r in entry["hit_ratio_by_type"].values())
            assert entry["of_belady"] == pytest.approx(entry["hit_ratio"] / belady)
        assert row["policies"]["hybrid+pvp"]["pvp_hit_ratio"] > 0


def test_layouts_compare_caches_of_equal_size(quick_run):
    for row in quick_run[1]["sizes"].values():
        layout = row["layout"]
        assert layout["shared"]["hit_ratio"] == row["policies"]["hybrid"]["hit_ratio"]
        for name in ("per_type_estimated", "per_type_measured", "per_type_by_rows"):
            entry = layout[name]
            assert row["lines"] - 32 < entry["lines"] <= row["lines"]
            assert entry["lines"] == sum(entry["lines_by_type"].values())
            assert 0.0 <= entry["hit_ratio"] <= 1.0
            assert sum(entry["weights"].values()) == pytest.approx(1.0)


def test_training_is_timed_against_memory(quick_run):
    training = quick_run[1].get("training")
    if training is None:
        pytest.skip("torch_geometric is not installed: no training runs")
    assert set(training["summary"]) == {"hybrid", "memory"}
    assert 0.0 < training["summary"]["hybrid"]["hit_ratio"] <= 1.0
    assert training["hybrid_slowdown_vs_memory"] > 0


def test_per_type_lines_hold_small_types_whole_and_add_up(hetero_bench):
    caps = {"big": hetero_bench.lines_for_rows(100_000), "small": hetero_bench.lines_for_rows(40)}
    assert caps["small"] == 64  # one line per row, in whole sets
    assert hetero_bench.lines_for_rows(40, "every-row") >= 64
    geometries = hetero_bench.type_geometries(3200, {"big": 1.0, "small": 1.0}, caps)
    assert geometries["small"] == (2, 32)  # capped: what it cannot use goes to the other type
    assert geometries["big"] == ((3200 - 64) // 32, 32)
    tiny = hetero_bench.type_geometries(64, {"big": 0.9, "small": 0.1}, caps)
    assert tiny["small"] == (1, 6) and tiny["big"] == (1, 32)


def test_the_training_step_comparison_times_three_variants(quick_run):
    pytest.importorskip("torch_geometric")
    step = quick_run[1]["training_step"]
    assert set(step["ms_per_step"]) == {"ours", "whole_layers", "reference"} and step["batches"] == 3
    assert all(ms > 0 for ms in step["ms_per_step"].values()) and step["ours_over_reference"] > 0
