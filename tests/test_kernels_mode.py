"""kernels=triton: the trainer, loader, cache and PVP run the Triton kernels on CPU tensors (interpreter)
and compute exactly what the C++ core computes."""
import json
import os

import pytest

pytest.importorskip("triton")
pytest.importorskip("torch_geometric")

from lsm_gnn.config import load_config  # noqa: E402
from lsm_gnn.kernels import KERNELS_ENV, kernel_mode, kernel_setting, set_kernel_mode, using  # noqa: E402
from lsm_gnn.training.trainer import train  # noqa: E402

GRAPH = dict(num_nodes=800, avg_degree=5, feature_dim=8, num_classes=3, seed=6)


@pytest.fixture(autouse=True)
def native_afterwards():
    yield
    set_kernel_mode(None)


@pytest.fixture
def no_setting(monkeypatch):
    """No mode chosen in code (what earlier tests left set aside), LSM_GNN_KERNELS unset: native."""
    from lsm_gnn import kernels

    monkeypatch.setattr(kernels, "_mode", None)
    monkeypatch.setattr(kernels, "_scopes", ())
    monkeypatch.delenv(KERNELS_ENV, raising=False)


def run(graph, out, kernels, *more):
    cfg = load_config(None, [f"dataset={graph}", f"kernels={kernels}", "model.kind=sage", "model.hidden=8",
                             "sampler.fanouts=[3,2]", "sampler.batch_size=100", "cache.capacity=50%",
                             "cache.window=4", "train.max_iterations=4", "train.eval_splits=[]",
                             # read-ahead off: its reads land in whichever iteration they finish in, and the
                             # bytes are compared iteration by iteration
                             "cache.read_ahead=0", "log.progress=false", f"log.dir={out}", *more])
    train(cfg)
    with open(os.path.join(out, "metrics.jsonl")) as fh:
        records = [json.loads(line) for line in fh if '"iteration"' in line]
    return [(r["loss"], r["hit_ratio"], r["bytes_read"], r.get("pvp_hits")) for r in records]


@pytest.mark.natural_order_only  # a whole run: each kernel it launches is tested in both orders on its own
@pytest.mark.parametrize("pvp", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_triton_run_equals_a_native_run(graph, tmp_path, monkeypatch, pvp):
    from lsm_gnn import _C

    # With PVP: a cache small enough, and scans frequent enough, that the victim buffer serves rows.
    extra = ["cache.pvp=true", "cache.pvp_queue_capacity=16", "sampler.batch_size=50", "cache.capacity=30%",
             "cache.period=1"] if pvp else []
    native = run(graph, tmp_path / "native", "native", *extra)
    assert kernel_mode() == "native"

    def unused(*args, **kwargs):
        raise AssertionError("kernels=triton called the C++ core")

    for op in ("cache_assign", "cache_scan", "sample_hops", "victim_enqueue", "pvp_match", "pvp_scatter",
               "pvp_fill"):  # (pvp_install has no C++ twin: torch's CPU ops)
        monkeypatch.setattr(_C, op, unused)  # every op with a Triton twin
    triton = run(graph, tmp_path / "triton", "triton", *extra)
    assert kernel_mode() == "native"  # train() closes its trainer: the run's kernels= scope ended with it
    assert triton == native  # the same losses, hits, bytes read and victim-buffer hits, iteration by iteration
    assert len(native) == 4
    if pvp:
        assert sum(hits for *_, hits in native) > 0  # the victim buffer served rows: its fill took part


@pytest.mark.launches_no_kernel
def test_the_mode_is_checked(monkeypatch, no_setting):
    monkeypatch.setenv(KERNELS_ENV, "gpu")  # read where no mode is chosen in code
    with pytest.raises(ValueError, match="LSM_GNN_KERNELS='gpu'"):
        kernel_mode()
    with pytest.raises(ValueError, match="kernel mode"):
        set_kernel_mode("cuda")


@pytest.mark.launches_no_kernel
def test_nested_scopes_give_back_the_mode_before_them(no_setting):
    with using("triton"):
        assert kernel_mode() == "triton"
        with using("native"):
            assert kernel_mode() == "native"
            with using(None):  # chooses nothing
                assert kernel_mode() == "native"
        assert kernel_mode() == "triton"
    assert kernel_setting() is None and kernel_mode() == "native"
    with pytest.raises(RuntimeError), using("triton"):
        raise RuntimeError("a failure inside the scope")
    assert kernel_setting() is None


@pytest.mark.launches_no_kernel
def test_a_scope_closed_out_of_order_never_undoes_a_later_one(no_setting):
    first, second = using("triton").__enter__(), using("native").__enter__()
    first.close()
    assert kernel_mode() == "native"  # the later scope still decides
    first.close()  # closing again does nothing
    second.close()
    assert kernel_setting() is None
    with pytest.raises(RuntimeError, match="entered already"):
        first.__enter__()


@pytest.mark.launches_no_kernel
def test_a_scope_sits_over_the_process_default_and_reaches_other_threads(no_setting):
    import threading

    set_kernel_mode("triton")
    with using("native"):
        seen = []
        thread = threading.Thread(target=lambda: seen.append(kernel_mode()))  # as the loader's thread reads it
        thread.start()
        thread.join()
        assert seen == ["native"]
    assert kernel_mode() == "triton"
    with pytest.raises(ValueError, match="kernel mode"):
        using("cuda")


@pytest.mark.launches_no_kernel  # its kernels run in a subprocess, out of the program order's reach
def test_the_gpu_benchmark_script_runs_under_the_interpreter(tmp_path):
    """benchmarks/gpu_kernels.py is for GPU owners; here its code runs on CPU tensors at a tiny size."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "gpu.json"
    result = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "gpu_kernels.py"), "--device", "cpu",
                             "--quick", "--repeats", "1", "--json", str(out)], capture_output=True, text=True,
                            timeout=300, env=dict(os.environ, PYTHONPATH=root))
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["cache_all_hit"]["hit_ratio"] == 1.0  # the hot batch is served from the cache
    assert 0.4 < figures["lookup_with_misses"]["hit_ratio"] < 0.7, "about half the batch misses"
    assert figures["lookup_with_misses_pvp"]["hit_ratio"] > 0.9, "the victim buffer serves the cold half"
    assert figures["sampler"]["edges_per_batch"] > 0



@pytest.mark.slow
@pytest.mark.natural_order_only  # a whole run, as above
def test_node_embeddings_train_the_same_table_with_the_triton_kernels(graph, tmp_path, monkeypatch):
    """The write-back cache under kernels=triton (its assign reports the victims whose dirty rows go back):
    the same losses and the same table bytes as with the C++ core."""
    import numpy as np
    import torch

    from lsm_gnn import _C
    from lsm_gnn.storage import EmbeddingTable

    def table(out):
        opened = EmbeddingTable.open(os.path.join(out, "ckpt", "node_embedding"))
        try:
            return opened.read(torch.arange(opened.num_rows)).numpy().copy()
        finally:
            opened.close()

    extra = ["model.node_embedding.dim=4", "model.node_embedding.capacity=60%", "cache.period=1",
             "train.max_iterations=8"]
    native = run(graph, tmp_path / "native", "native", *extra, f"checkpoint.dir={tmp_path / 'native' / 'ckpt'}")

    def unused(*args, **kwargs):
        raise AssertionError("kernels=triton called the C++ core")

    for op in ("cache_assign", "cache_scan", "sample_hops"):
        monkeypatch.setattr(_C, op, unused)
    triton = run(graph, tmp_path / "triton", "triton", *extra, f"checkpoint.dir={tmp_path / 'triton' / 'ckpt'}")
    assert triton == native
    assert np.array_equal(table(tmp_path / "triton"), table(tmp_path / "native"))
