"""Both launchers start a 2-rank training run; shared and isolated caches, with or without PVP, train identically."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from lsm_gnn.testing import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytest.importorskip("torch_geometric")
pytestmark = pytest.mark.slow  # each test launches a 2-rank training run


# The graph fixture (conftest.py) generates this once per module.
GRAPH = dict(num_nodes=2000, avg_degree=6, feature_dim=8, num_classes=4, seed=0)


def launch(script, graph, tmp_path, *overrides):
    port = free_port()
    env = dict(os.environ, NPROC="2", MASTER_PORT=str(port), OMP_NUM_THREADS="1", LSM_GNN_TIMEOUT_S="120",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    args = [f"dataset={graph}", "model.kind=sage", "model.hidden=16", "sampler.fanouts=[5,5]",
            "sampler.batch_size=64", "cache.capacity=40%", "cache.window=4", "train.epochs=1",
            "log.progress=false", f"log.dir={tmp_path}", *overrides]
    result = subprocess.run(["bash", os.path.join(ROOT, "launch", script), *args], env=env, capture_output=True,
                            text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with open(os.path.join(tmp_path, "metrics.jsonl")) as fh:
        losses = [json.loads(line)["loss"] for line in fh if '"iteration"' in line]
    return result.stdout, losses


def test_torchrun_two_ranks_shared_and_isolated_train_identically(graph, tmp_path):
    out, shared = launch("torchrun.sh", graph, tmp_path / "shared", "train.eval_splits=[val]")
    assert "shared by 2 ranks" in out and "2 rank(s)" in out and "val: accuracy" in out
    out, isolated = launch("torchrun.sh", graph, tmp_path / "isolated", "cache.mode=isolated",
                           "train.eval_splits=[val]")
    assert "isolated" in out
    assert len(shared) == 10 and shared == isolated  # the cache changes where bytes come from, never the bytes
    _, with_pvp = launch("torchrun.sh", graph, tmp_path / "pvp", "cache.pvp=true", "cache.pvp_queue_capacity=64",
                         "train.eval_splits=[]")
    assert with_pvp == shared  # each owner's victim buffer serves the merged batch: still the file's bytes
    with open(tmp_path / "pvp" / "metrics.jsonl") as fh:
        steps = [json.loads(line) for line in fh if '"iteration"' in line]
    assert sum(r["pvp_hits"] for r in steps) > 0  # rank 0's slice served rows from its victim buffer


def test_ranks_leave_no_communication_thread_running_into_interpreter_exit(graph, tmp_path):
    """After `lsm-gnn train` returns, no gloo thread is left: one still running while the interpreter finalizes
    can take the GIL to release a finished collective's tensors, and that aborts the rank now and then
    (`terminate called without an active exception`, SIGABRT) after a successful run."""
    env = dict(os.environ, OMP_NUM_THREADS="1", LSM_GNN_TIMEOUT_S="120",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    args = [f"dataset={graph}", "model.kind=sage", "model.hidden=16", "sampler.fanouts=[5,5]",
            "sampler.batch_size=64", "cache.capacity=40%", "train.epochs=1", "log.progress=false",
            f"log.dir={tmp_path}", "train.eval_splits=[val]"]  # shared cache: the default group and the cache's
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                             f"--master_port={free_port()}", os.path.join(ROOT, "tests", "exit_worker.py"),
                             str(tmp_path), *args], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for rank in range(2):
        with open(tmp_path / f"threads-{rank}.json") as fh:
            report = json.load(fh)
        assert report["code"] == 0
        assert not [name for name in report["native"] if "gloo" in name], report
        assert not [name for name in report["python"] if name.startswith("lsm-gnn")], report


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI is not installed (apt install openmpi-bin)")
def test_mpirun_two_ranks(graph, tmp_path):
    out, losses = launch("mpirun.sh", graph, tmp_path, "train.eval_splits=[]")
    assert "shared by 2 ranks" in out and len(losses) == 10


def test_torchrun_two_ranks_share_one_cache_over_a_heterogeneous_graph(tmp_path):
    """Every node type through the shared cache: the same losses as isolated caches (the file's bytes)."""
    from lsm_gnn.testing import write_tiny_hetero_dataset

    hetero = write_tiny_hetero_dataset(tmp_path / "ds").path
    hetero_args = ("sampler.fanouts=[3,2]", "sampler.batch_size=40", "cache.capacity=70%",
                   "cache.static_score=degree", "train.eval_splits=[val]")
    out, shared = launch("torchrun.sh", hetero, tmp_path / "shared", *hetero_args)
    assert "shared by 2 ranks" in out and "target paper" in out and "val: accuracy" in out
    _, isolated = launch("torchrun.sh", hetero, tmp_path / "isolated", "cache.mode=isolated", *hetero_args)
    assert len(shared) == 5 and shared == isolated
    with open(tmp_path / "shared" / "metrics.jsonl") as fh:
        steps = [json.loads(line) for line in fh if '"iteration"' in line]
    assert set(steps[-1]["hit_ratio_by_type"]) == {"paper", "author"}


def test_torchrun_two_ranks_train_node_embeddings_per_node_type(tmp_path):
    """Topics' and authors' tables shared by 2 ranks (each row's owner applies both ranks' updates): the authors'
    cache writing dirty rows back gives the losses and tables of caches holding every row."""
    import numpy as np
    import torch

    from lsm_gnn.storage import EmbeddingTable
    from lsm_gnn.testing import write_tiny_hetero_dataset

    hetero = write_tiny_hetero_dataset(tmp_path / "ds").path
    args = ("sampler.fanouts=[3,2]", "sampler.batch_size=40", "cache.capacity=70%", "cache.ways=8",
            "cache.static_score=degree", "train.eval_splits=[val]", "model.node_embedding.dim=8",
            "model.node_embedding.author.dim=4", "model.node_embedding.topic.capacity=100%")
    out, small = launch("torchrun.sh", hetero, tmp_path / "small", *args, f"checkpoint.dir={tmp_path / 'ck-small'}",
                        "model.node_embedding.author.capacity=60%")
    assert "shared by 2 ranks" in out and "topic node embeddings" in out and "author node embeddings" in out
    _, every = launch("torchrun.sh", hetero, tmp_path / "every", *args, f"checkpoint.dir={tmp_path / 'ck-every'}",
                      "model.node_embedding.author.capacity=100%")
    assert len(small) == 5 and small == every
    for t in ("topic", "author"):
        tables = []
        for run in ("ck-small", "ck-every"):
            table = EmbeddingTable.open(str(tmp_path / run / "node_embedding" / t))
            tables.append(table.read(torch.arange(table.num_rows)).numpy().copy())
            table.close()
        assert np.array_equal(*tables), f"{t}'s table differs"
