"""The benchmarks run end to end at tiny size, so they never rot."""
import importlib.util
import json
import os
import shutil

import numpy as np
import pytest

BENCH_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


def load_benchmark(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH_DIR, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def storage_bench():
    return load_benchmark("storage_bench")


@pytest.fixture(scope="module")
def tiny_run(storage_bench, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("storage_bench")
    argv = ["--quick", "--file-gib", str(2 / 1024), "--row-sizes", "1024,4096", "--queue-depths", "1,8",
            "--seconds", "0.05", "--batch-rows", "256", "--fio-engines", "io_uring",
            "--data-dir", str(tmp / "data"), "--json", str(tmp / "out.json"), "--quiet"]
    return storage_bench.main(argv), tmp / "out.json", tmp / "data"


def test_storage_bench_writes_the_json_it_returns(tiny_run):
    results, json_path, _ = tiny_run
    with open(json_path) as f:
        written = json.load(f)
    assert written["summary"] == json.loads(json.dumps(results["summary"]))
    for key in ("command", "config", "machine", "datasets", "correctness", "measurements", "summary", "targets"):
        assert key in written


def test_storage_bench_measures_every_method_with_positive_throughput(tiny_run):
    results = tiny_run[0]
    config = results["config"]
    backends = config["backends"]  # io_uring is dropped where the kernel disables it
    assert {"pread", "mmap"} <= set(backends)
    fio = bool(config["fio_engines"])  # dropped where fio is missing or O_DIRECT is refused
    assert not fio or shutil.which("fio") is not None
    expected = set(backends) | {"np_memmap", "np_memmap_random"} | ({"fio_io_uring"} if fio else set())
    assert len(results["summary"]) == 4  # 2 row sizes x 2 queue depths
    for row in results["summary"]:
        assert set(row["methods"]) == expected
        for method, entry in row["methods"].items():
            assert entry["rows_per_s"] > 0 and entry["gb_per_s"] > 0, method
        for backend in backends:
            entry = row["methods"][backend]
            assert entry["amplification"] >= 1.0
            assert 0 < entry["requests_per_row"] <= 1.0
            assert entry["ratio_to"]["np_memmap"] > 0
            if fio:
                assert entry["ratio_to"]["fio_io_uring"] > 0


def test_storage_bench_reuses_datasets_of_the_right_size(storage_bench, tiny_run):
    data_dir = tiny_run[2]
    before = {p: os.stat(os.path.join(data_dir, p, "features.bin")).st_mtime_ns for p in os.listdir(data_dir)}
    ds = storage_bench.ensure_dataset(str(data_dir), 1024, 2 << 20, log=lambda *a: None)
    assert os.stat(ds.feature_path).st_mtime_ns == before[os.path.basename(ds.path)]


def test_pattern_rows_match_their_oracle(storage_bench):
    ids = np.array([0, 1, 5, 77, 1023])
    block = storage_bench.pattern_rows(0, 1024, 64)
    np.testing.assert_array_equal(block[ids], storage_bench.expected_rows(ids, 64))
    assert len({row.tobytes() for row in block}) == 1024  # every row is distinct


def test_correctness_check_catches_a_corrupt_row(storage_bench, tmp_path):
    ds = storage_bench.ensure_dataset(str(tmp_path), 1024, 256 << 10, log=lambda *a: None)
    storage_bench.check_correctness(ds, ["io_uring", "pread"], seed=0)
    with open(ds.feature_path, "r+b") as f:  # row 0 is always checked
        f.write(b"\xff" * 16)
    with pytest.raises(AssertionError, match="wrong data for row 0"):
        storage_bench.check_correctness(ds, ["pread"], seed=0)


def test_storage_bench_compares_packed_and_unpacked_rows(storage_bench, tmp_path):
    argv = ["--layouts", "packed,unpacked", "--row-sizes", "64,1024", "--num-rows", "3000", "--plan-row-sizes",
            "100,384", "--backends", "pread", "--queue-depths", "4", "--fio-engines", "", "--no-memmap",
            "--repeats", "1", "--seconds", "0.05", "--batch-rows", "256", "--data-dir", str(tmp_path / "data"),
            "--json", "", "--quiet"]
    results = storage_bench.main(argv)
    strides = {key: d["row_stride"] for key, d in results["datasets"].items()}
    assert strides == {"64/packed": 64, "64/unpacked": 512, "1024/packed": 1024}  # 1 KiB rows: one layout
    small, large = results["summary"]
    packed, unpacked = small["methods"]["pread"], small["methods"]["pread/unpacked"]
    assert unpacked["amplification"] == 8.0 and 1.0 <= packed["amplification"] <= 8.0
    assert packed["ratio_to"]["pread/unpacked"] > 0 and "pread/unpacked" not in large["methods"]
    plan = {r["row_bytes"]: r for r in results["plan_amplification"]}
    assert plan[384]["packed"]["amplification"] < plan[384]["back_to_back"]["amplification"]
    assert plan[100]["packed"]["stride"] == 128 and plan[100]["unpacked"]["stride"] == 512
    # A dataset written before packing (a 512 B stride) under the packed one's name is not reused as packed.
    from lsm_gnn.testing import write_tiny_dataset

    write_tiny_dataset(tmp_path / "old" / "rows-64B-500", num_nodes=500, dim=16, row_alignment=512)
    ds = storage_bench.ensure_dataset(str(tmp_path / "old"), 64, 0, log=lambda *a: None, num_rows=500)
    assert ds.features.row_stride == 64


def test_same_behaviour_names_what_differs():
    compare = load_benchmark("same_behaviour")
    record = {"per_iteration": {"loss": [0.5, 0.4, 0.3], "hit_ratio": [0.0, 0.5, 0.6], "bytes_read": [9, 4, 3]},
              "evaluations": [{"val": {"accuracy": 0.7}}], "eval": {"val": {"accuracy": 0.7}}, "iterations": 3}
    assert compare._differences(record, json.loads(json.dumps(record))) == []
    changed = json.loads(json.dumps(record))
    changed["per_iteration"]["loss"][1] = 0.4000001
    changed["eval"]["val"]["accuracy"] = 0.71
    assert compare._differences(record, changed) == [
        "loss differs (first at iteration 1)", "eval differs: {'val': {'accuracy': 0.7}} vs {'val': {'accuracy': 0.71}}"]
    shorter = json.loads(json.dumps(record))
    shorter["per_iteration"]["bytes_read"].pop()
    assert compare._differences(record, shorter) == ["bytes_read differs (3 vs 2 iterations logged)"]


def test_pipeline_benchmark_runs_its_variants_on_the_same_batches(tmp_path):
    """benchmarks/pipeline.py at tiny size: both default variants run, end with the same loss, and every
    figure it reports is there; a malformed variant is refused with the form it wants."""
    from lsm_gnn.testing import write_tiny_dataset

    pipeline = load_benchmark("pipeline")
    dataset, _ = write_tiny_dataset(tmp_path / "ds", num_nodes=400, dim=16)
    out = tmp_path / "pipeline.json"
    assert pipeline.main([os.path.join(os.path.dirname(BENCH_DIR), "configs", "demo.yaml"), f"dataset={dataset.path}",
                          "sampler.batch_size=16", "sampler.fanouts=[3,2]", "cache.capacity=60%", "--repeats", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["variants"]) == {"serial", "read-ahead"}
    runs = [v["runs"][0] for v in result["variants"].values()]
    assert runs[0]["loss"] == runs[1]["loss"] and runs[0]["hit_ratio"] == runs[1]["hit_ratio"]
    assert all(0 < r["pipeline_efficiency"] <= 1.0 + 1e-9 and r["ms_per_iteration"] > 0 for r in runs)
    with pytest.raises(SystemExit, match="NAME=KEY=VALUE"):
        pipeline.parse_variant("serial")
