"""benchmarks/out_of_core.py and bounded_memory.py run end to end at tiny size (each method a child process
in a memory cgroup), so they never rot. Skipped, with the reason, where no memory cgroup can be created."""
import json
import os

import pytest

import lsm_gnn
from lsm_gnn.testing.benchmarking import load_script
from lsm_gnn.utils.memcap import MemoryCap, MemoryCapError

pytestmark = pytest.mark.slow  # every method starts a Python process that imports torch
BENCH_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


@pytest.fixture
def children_import_this_checkout(monkeypatch):
    """The children run the benchmark script by path: they must import this lsm_gnn, not an installed one."""
    try:
        MemoryCap(1 << 30).close()
    except MemoryCapError as exc:
        pytest.skip(f"no memory cgroup to cap the runs in: {exc}")
    root = os.path.dirname(os.path.dirname(os.path.abspath(lsm_gnn.__file__)))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))


def test_out_of_core_measures_every_method_on_the_same_batches(children_import_this_checkout, tmp_path):
    bench = load_script(os.path.join(BENCH_DIR, "out_of_core.py"))
    result = bench.main(["--quick", "--data", str(tmp_path / "graph"), "--json", str(tmp_path / "out.json")])
    assert json.loads((tmp_path / "out.json").read_text())["summary"] == json.loads(json.dumps(result["summary"]))
    summary = result["summary"]
    assert set(summary) == set(bench.METHODS)
    for method, row in summary.items():
        assert row["failed"] == 0 and row["oom_kills"] == 0, (method, result["runs"])
        assert row["ms_per_iter"] > 0 and row["capped"] == (method != bench.CEILING)
        assert 0 < row["peak_bytes"] <= result["settings"]["cap_bytes"] or not row["capped"]
    assert len({loss for row in summary.values() for loss in row["losses"]}) == 1, "same batches, same losses"
    assert 0 < summary["hybrid"]["hit_ratio"] < 1 and summary["storage"]["feature_bytes_read"] > 0
    assert result["ratios"]["hybrid_speedup_vs_memmap"]["median"] > 0
    # --quick measures two caps: one record each, the smallest's summary and ratios also at the top
    curve = result["curve"]
    assert [rec["cap_bytes"] for rec in curve] == result["settings"]["caps_bytes"] and len(curve) == 2
    assert curve[0]["summary"] == summary and curve[0]["cap_bytes"] == result["settings"]["cap_bytes"]
    for rec in curve:
        assert set(rec["summary"]) == set(bench.METHODS) and rec["ratios"]["hybrid_speedup_vs_memmap"]["median"] > 0
        runs = [r for r in result["runs"] if r["cap_bytes"] == rec["cap_bytes"]]
        assert runs and all(0 < r["peak_bytes"] <= rec["cap_bytes"] for r in runs)
    assert result["crossover"]["sentence"]


def test_bounded_memory_reports_bytes_per_node_and_each_epoch(children_import_this_checkout, tmp_path):
    bench = load_script(os.path.join(BENCH_DIR, "bounded_memory.py"))
    result = bench.main(["--quick", "--data-root", str(tmp_path), "--json", str(tmp_path / "out.json")])
    rows = result["sweep"]["rows"]
    assert [r["num_nodes"] for r in rows] == [20_000, 40_000]
    assert all(r["peak_rss_anon"] > 0 and r["cgroup_peak"] > 0 for r in rows)
    assert result["sweep"]["bytes_per_node"]["peak_rss_anon"] is not None
    assert len(result["epochs"]["anon_after_epoch"]) == 2


def test_embedding_out_of_core_trains_the_same_table_both_ways(children_import_this_checkout, tmp_path):
    """benchmarks/embedding_out_of_core.py --quick: the table on disk behind a small cache (capped) and held in
    memory (uncapped) end with the same losses, table bytes and recall@20."""
    bench = load_script(os.path.join(BENCH_DIR, "embedding_out_of_core.py"))
    out = tmp_path / "out.json"
    assert bench.main(["--quick", "--data", str(tmp_path / "ui"), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    summary = result["summary"]
    assert summary["same_training"] and summary["same_recall"], result["runs"]
    assert summary["disk"]["table_written_per_iter"] > 0 and summary["memory"]["table_written_per_iter"] == 0
    assert summary["disk"]["stages_ms"]["write-back"] > 0 and summary["disk_over_memory"] > 0
    assert 0 < summary["disk"]["peak_bytes"] <= bench.parse_bytes(result["args"]["cap"])
