"""A run that joined a process group leaves no communication thread running into interpreter exit.

gloo's worker threads take the GIL to release a finished collective's tensors; one still running while the
interpreter finalizes is ended inside C++ destructors and aborts the process now and then (`terminate called
without an active exception`, SIGABRT) after a successful run. tests/test_launchers.py checks two ranks."""
import json
import os
import subprocess
import sys

import pytest

from lsm_gnn.testing import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytest.importorskip("torch_geometric")
pytestmark = [pytest.mark.slow,  # a CLI subprocess
              pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="lists threads through /proc")]

GRAPH = dict(num_nodes=600, avg_degree=4, feature_dim=8, num_classes=4, seed=0)


def test_one_rank_group_and_its_threads_are_gone_when_train_returns(graph, tmp_path):
    # One rank in a process group of one: the same group, DDP model and exit path as under torchrun.
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1", LSM_GNN_TIMEOUT_S="60",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    args = [f"dataset={graph}", "model.kind=sage", "model.hidden=8", "sampler.fanouts=[3,3]", "sampler.batch_size=32",
            "cache.capacity=60%", "train.epochs=1", "log.progress=false", f"log.dir={tmp_path}",
            "train.eval_splits=[val]"]
    result = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "exit_worker.py"), str(tmp_path), *args],
                            env=env, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with open(tmp_path / "threads-0.json") as fh:
        report = json.load(fh)
    assert report["code"] == 0
    assert not [name for name in report["native"] if "gloo" in name], report
    assert not [name for name in report["python"] if name.startswith("lsm-gnn")], report
