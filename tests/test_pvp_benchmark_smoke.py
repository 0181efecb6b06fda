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
