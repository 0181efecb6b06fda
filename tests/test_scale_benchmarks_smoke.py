"""The scale benchmarks (generation phases, the capped sampler) run end to end at tiny size."""
import json
import os

import pytest

from lsm_gnn.testing import write_tiny_dataset
from lsm_gnn.testing.benchmarking import load_script
from lsm_gnn.utils.memcap import MemoryCap, MemoryCapError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def script(name):
    return load_script(os.path.join(ROOT, "benchmarks", f"{name}.py"))


def test_generation_is_measured_phase_by_phase(tmp_path):
    out = tmp_path / "result.json"
    result = script("generate_scale").main(["--num-nodes", "3000", "--out", str(tmp_path / "ds"), "--json", str(out),
                                            "--remove", "--", "--feature-dim", "8"])
    names = [p["name"] for p in result["phases"]]
    for phase in ("features", "edges: generate + bucket", "csr: sort + write", "score: reverse_pagerank", "commit"):
        assert phase in names
    assert result["max_rss_bytes"] > 0 and result["topology_bytes_per_edge"] > 4
    assert json.loads(out.read_text())["num_nodes"] == 3000 and not (tmp_path / "ds").exists()
    with pytest.raises(SystemExit, match="two result files of different"):
        script("generate_scale").main(["--predict", str(out), str(out), "--num-nodes", "1e4"])


def test_the_sampler_runs_with_its_topology_capped(tmp_path):
    try:
        MemoryCap(64 << 20).close()
    except MemoryCapError as exc:
        pytest.skip(str(exc))
    write_tiny_dataset(tmp_path / "ds", num_nodes=3000, dim=4, avg_degree=8)
    result = script("sampler_throughput").main(
        ["--data", str(tmp_path / "ds"), "--no-numpy", "--caps", "0.5", "--setups", "4,2@64", "--cap-runs", "1",
         "--repeats", "1", "--batches", "2", "--warm-batches", "1", "--json", str(tmp_path / "s.json")])
    (row,) = result["capped"]["rows"]
    (cap,) = row["caps"]
    assert row["uncapped_edges_per_s"] > 0 and cap["edges_per_s"] > 0 and not row["oom_killed"]
    assert cap["peak_bytes"] <= cap["limit_bytes"]
    assert len(cap["disk_read_mib_per_s"]) == 1 and len(row["uncapped_disk_read_mib_per_s"]) == 1


def test_the_prediction_is_the_line_through_two_runs(tmp_path):
    def run(n, seconds, anon):
        path = tmp_path / f"{n}.json"
        path.write_text(json.dumps({"num_nodes": n, "wall_seconds": seconds, "phases": [
            {"name": "features", "seconds": seconds, "peak_rss_anon": anon}]}))
        return str(path)

    result = script("generate_scale").main(["--predict", run(10, 2.0, 100), run(20, 3.0, 150), "--num-nodes", "40"])
    assert result["prediction"] and result["wall_seconds"] == 5.0 and result["phases"][0]["peak_rss_anon"] == 250


def test_the_loader_rate_is_reported_per_window(tmp_path):
    write_tiny_dataset(tmp_path / "ds", num_nodes=2000, dim=8)
    result = script("loader_scale").main(
        ["--data", str(tmp_path / "ds"), "--batches", "12", "--window", "4", "--json", str(tmp_path / "l.json"), "--",
         "cache.static_score=none", "cache.capacity=50%", "sampler.batch_size=32", "sampler.fanouts=[3,2]",
         "cache.window=4"])
    assert [w["first_batch"] for w in result["windows"]] == [0, 4, 8]
    assert all(w["batches_per_s"] > 0 and w["RssAnon"] > 0 for w in result["windows"])
    assert json.loads((tmp_path / "l.json").read_text())["last_over_second"] > 0
