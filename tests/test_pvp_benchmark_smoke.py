"""benchmarks/pvp.py runs end to end at tiny size, so it never rots."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pvp_benchmark_quick(tmp_path):
    spec = importlib.util.spec_from_file_location("pvp_bench", os.path.join(ROOT, "benchmarks", "pvp.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "pvp.json"
    results = module.main(["--quick", "--data-dir", str(tmp_path), "--json", str(out), "--policies", "rr,hybrid"])
    assert out.exists()
    for row in results["sizes"].values():
        for policy in ("rr", "hybrid"):
            off, bypass, reinstall = (row[policy][m] for m in ("off", "bypass", "reinstall"))
            assert off["pvp_hits"] == 0 and bypass["pvp_hits"] > 0
            # reinstall: the cache evolves as without PVP, so PVP only adds hits
            assert reinstall["cache_hit_ratio"] == off["cache_hit_ratio"]
            assert reinstall["combined_hit_ratio"] >= off["combined_hit_ratio"]
            assert bypass["rows_read"] + bypass["hits"] + bypass["pvp_hits"] == bypass["requests"]


def test_same_bytes_comparison_quick(tmp_path):
    """--same-bytes: PVP's queues and the bigger plain cache get the same bytes (as pvp_queue_bytes sizes them)."""
    spec = importlib.util.spec_from_file_location("pvp_bench", os.path.join(ROOT, "benchmarks", "pvp.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results = module.main(["--quick", "--data-dir", str(tmp_path), "--same-bytes", "0.5,1"])
    row = results["config"]["feature_row_bytes"]
    per_line_all_queues = (results["config"]["window"] + 1) * (row + 16)
    for size in results["sizes"].values():
        cache_bytes = size["cache_bytes"]
        for q, cell in size["shares"].items():
            budget = float(q) * cache_bytes
            assert budget - per_line_all_queues < cell["queue_bytes"] <= budget  # as many lines as fit
            total = cache_bytes + cell["queue_bytes"]
            assert cell["same_bytes_lines"] * row <= total < (cell["same_bytes_lines"] + 32) * row  # one set
            assert cell["pvp"]["pvp_hits"] > 0 and cell["same_bytes"]["pvp_hits"] == 0
        assert 0.0 < size["plain"]["combined_hit_ratio"] <= 1.0


def test_pvp_cost_benchmark_quick(tmp_path):
    """benchmarks/pvp_cost.py on a tiny graph: with reinstall and farthest, PVP adds hits and changes nothing else."""
    from lsm_gnn.data.synthetic import generate_synthetic

    spec = importlib.util.spec_from_file_location("pvp_cost", os.path.join(ROOT, "benchmarks", "pvp_cost.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ds = generate_synthetic(str(tmp_path / "g"), num_nodes=3000, avg_degree=8, feature_dim=8, num_classes=4, seed=0)
    out = tmp_path / "cost.json"
    results = module.main(["--data", ds.path, "--capacity", "0.2", "--lookups", "40", "--skip", "5", "--window", "8",
                           "--batch-size", "16", "--rounds", "1", "--json", str(out)])
    assert out.exists()
    off, pvp = results["summary"]["off:farthest"], results["summary"]["pvp:farthest"]
    assert off["ms_per_lookup"] > 0 and pvp["ms_per_lookup"] > 0
    assert pvp["hit_ratio"] == off["hit_ratio"] and pvp["pvp_hits"] > 0
    assert pvp["misses"] == off["misses"] - pvp["pvp_hits"]
