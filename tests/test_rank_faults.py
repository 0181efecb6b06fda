"""Two ranks: mismatched settings are named at start; a stopped rank makes the other fail within the timeout."""
import os
import signal
import subprocess
import sys
import time

import pytest

from lsm_gnn.testing import free_port

pytest.importorskip("torch_geometric")
pytestmark = pytest.mark.slow  # each test starts two training ranks and waits for one to fail

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The graph fixture (conftest.py) generates this once per module.
GRAPH = dict(num_nodes=2000, avg_degree=6, feature_dim=8, num_classes=3, seed=4)


def start_ranks(graph, tmp_path, per_rank=(), timeout_s="60", common=(), cwds=(None, None)):
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1", LSM_GNN_TIMEOUT_S=timeout_s,
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        args = [f"dataset={graph}", "model.kind=sage", "model.hidden=16", "sampler.fanouts=[4,3]",
                "sampler.batch_size=64", "cache.capacity=50%", "cache.window=4", "log.progress=false",
                f"log.dir={tmp_path / 'log'}", *common, *(per_rank[rank] if per_rank else ())]
        procs.append(subprocess.Popen([sys.executable, "-m", "lsm_gnn", "train", *args], env=env, cwd=cwds[rank],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def finish(proc, timeout=120):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


@pytest.mark.parametrize("key,values", [
    ("train.seed", ("0", "1")),
    ("sampler.batch_size", ("64", "32")),
    ("cache.policy", ("hybrid", "rr")),
    ("model.hidden", ("16", "32")),
])
def test_ranks_with_different_settings_fail_at_start_naming_the_rank_and_key(graph, tmp_path, key, values):
    procs = start_ranks(graph, tmp_path, per_rank=[[f"{key}={values[0]}"], [f"{key}={values[1]}"]])
    for proc in procs:
        code, _, err = finish(proc)
        assert code == 1, err[-2000:]
        assert "Traceback" not in err
        lines = [line for line in err.splitlines() if line.startswith("lsm-gnn")]
        assert len(lines) == 1 and "rank 1" in lines[0] and key in lines[0], err[-2000:]


def test_a_different_dataset_on_one_rank_is_named(graph, tmp_path):
    from lsm_gnn.data.synthetic import generate_synthetic

    other = tmp_path / "other"
    generate_synthetic(other, num_nodes=2000, avg_degree=6, feature_dim=8, num_classes=3, seed=5, progress=False)
    procs = start_ranks(graph, tmp_path, per_rank=[[], [f"dataset={other}"]])
    for proc in procs:
        code, _, err = finish(proc)
        assert code == 1 and "dataset.checksums" in err and "rank 1" in err, err[-2000:]


def stop_rank_1_mid_run(graph, tmp_path, timeout_s, *common):
    """Starts two ranks, SIGSTOPs rank 1 once rank 0 has trained a while; returns (rank 0's exit code, its
    stderr, seconds it ran on after the stop)."""
    procs = start_ranks(graph, tmp_path, timeout_s=str(timeout_s), common=["train.epochs=200", *common])
    metrics = tmp_path / "log" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.stat().st_size > 2000):
        assert procs[0].poll() is None, procs[0].communicate()[1][-2000:]
        time.sleep(0.05)
    procs[1].send_signal(signal.SIGSTOP)
    stopped = time.time()
    try:
        code, _, err = finish(procs[0], timeout=timeout_s * 6 + 30)
        return code, err, time.time() - stopped
    finally:
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()


def assert_names_rank_1(code, err):
    assert code == 1 and "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("lsm-gnn")]
    assert len(lines) == 1 and "rank 1" in lines[0] and "LSM_GNN_TIMEOUT_S" in lines[0], err[-3000:]


@pytest.mark.parametrize("mode,where", [("shared", "the exchange"), ("isolated", "DDP or the evaluation")])
def test_a_stopped_rank_makes_the_other_fail_within_the_timeout_naming_it(graph, tmp_path, mode, where):
    timeout_s = 4
    code, err, waited = stop_rank_1_mid_run(graph, tmp_path, timeout_s, f"cache.mode={mode}")
    assert_names_rank_1(code, err)
    assert waited < timeout_s * 4 + 10  # a few collectives may each wait out the timeout, never gloo's 30 min


def test_a_bad_timeout_setting_is_refused(graph, tmp_path):
    procs = start_ranks(graph, tmp_path, timeout_s="soon")
    for proc in procs:
        code, _, err = finish(proc)
        assert code == 1 and "LSM_GNN_TIMEOUT_S='soon'" in err, err[-2000:]


def test_a_rank_that_cannot_see_the_checkpoint_is_named(graph, tmp_path):
    """The same relative checkpoint.dir on two "hosts" (working directories): rank 0 finds a checkpoint
    there, rank 1 does not and would start over."""
    host0, host1 = tmp_path / "host0", tmp_path / "host1"
    host0.mkdir()
    host1.mkdir()
    first = start_ranks(graph, tmp_path, common=["train.max_iterations=4", "checkpoint.dir=ck"], cwds=(host0, host0))
    assert [finish(p)[0] for p in first] == [0, 0]
    procs = start_ranks(graph, tmp_path, common=["checkpoint.dir=ck"], cwds=(host0, host1))
    for proc in procs:
        code, _, err = finish(proc)
        assert code == 1 and "resumed at iteration is 0 on rank 1 but 4 on rank 0" in err, err[-2000:]
        assert "checkpoint.dir on a file system every rank sees" in err


class _Store:
    """A store stand-in: answers from ``steps``, or blocks in every call (a link that is down: recv waits for
    the kernel to give up on the connection, whatever the store's own timeout says)."""

    def __init__(self, steps: dict, blocked: bool = False):
        self.steps, self.blocked = steps, blocked

    def set_timeout(self, _):
        pass

    def check(self, keys):
        if self.blocked:
            time.sleep(30)
        return all(k in self.steps for k in keys)

    def get(self, key):
        return str(self.steps[key]).encode()


def test_the_progress_board_names_the_rank_behind_or_an_unreachable_store_without_hanging():
    from lsm_gnn.comm.group import ProgressBoard

    board = ProgressBoard(0, 3, store=_Store({"1": 7, "2": 9}))
    board.step = 9
    assert board.laggards() == "rank 1 (last at step 7) did not reach step 9: it stopped, crashed or is stuck"
    board = ProgressBoard(1, 2, store=_Store({}, blocked=True))
    start = time.monotonic()
    assert board._peer_steps([0], timeout_s=0.3) is None and time.monotonic() - start < 2
    assert board.store is None  # later messages do not wait on it again
    assert board.laggards() == "rank 0 did not answer: it stopped, crashed or is stuck"
