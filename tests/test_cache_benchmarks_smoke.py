"""The cache benchmarks run end to end at tiny size, so they never rot."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cache_policies_quick(tmp_path):
    out = tmp_path / "policies.json"
    results = load("cache_policies").main(["--quick", "--data-dir", str(tmp_path), "--json", str(out),
                                           "--policies", "rr,hybrid"])
    assert out.exists()
    for row in results["sizes"].values():
        assert 0.0 <= row["rr"]["hit_ratio"] <= row["belady"]["hit_ratio"] <= 1.0
        assert row["hybrid"]["hit_ratio"] <= row["belady"]["hit_ratio"]


def test_cache_throughput_quick(tmp_path):
    results = load("cache_throughput").main(["--quick", "--data-dir", str(tmp_path)])
    for key in ("memcpy_gbps", "hit_gbps", "miss_memory_gbps", "miss_io_uring_gbps"):
        assert results[key] > 0
