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
