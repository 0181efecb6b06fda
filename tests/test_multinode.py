"""Two hosts on one machine (network namespaces joined by a veth pair, tests/virtual_hosts.py): torchrun with
--nnodes 2 and the rendezvous on the first host's address trains exactly as one host with the same world size,
shared cache, DDP and checkpoints included; a link that goes down mid-run fails both hosts within the collective
timeout, each naming the other."""
import json
import os
import subprocess
import time

import pytest

from lsm_gnn.testing import free_port
from virtual_hosts import VirtualHosts, unavailable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytest.importorskip("torch_geometric")
WHY_NOT = unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY_NOT is not None, reason=f"no namespaced hosts: {WHY_NOT}")]

GRAPH = dict(num_nodes=2000, avg_degree=6, feature_dim=8, num_classes=4, seed=0)
TRAIN = ["model.kind=sage", "model.hidden=16", "sampler.fanouts=[5,5]", "sampler.batch_size=64",
         "cache.capacity=40%", "cache.window=4", "train.epochs=1", "log.progress=false"]


def rank_env(**extra) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def losses(log_dir) -> list[float]:
    with open(os.path.join(log_dir, "metrics.jsonl")) as fh:
        return [json.loads(line)["loss"] for line in fh if '"iteration"' in line]


def launch_on(hosts, graph, log_dir, nproc: int, *overrides, timeout_s: int = 120):
    """launch/torchrun.sh on both hosts (NNODES=2, rendezvous on host 0's address); the two agents' processes."""
    port = free_port()
    procs = []
    for rank, host in enumerate(hosts.hosts):
        env = host.env(rank_env(NNODES=2, NODE_RANK=rank, NPROC=nproc, MASTER_ADDR=hosts[0].address,
                                MASTER_PORT=port, LSM_GNN_TIMEOUT_S=timeout_s))
        argv = ["bash", os.path.join(ROOT, "launch", "torchrun.sh"), f"dataset={graph}", *TRAIN,
                f"log.dir={log_dir}", *overrides]
        procs.append(subprocess.Popen(host.command(argv), env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return procs


def finish(procs, timeout: int = 300) -> list[tuple[int, str]]:
    results = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            results.append((p.returncode, out))
    finally:
        for p in procs:
            p.kill()
    return results


@pytest.mark.parametrize("ranks_per_host", [1, 2])
def test_two_namespaced_hosts_train_as_one_host(graph, tmp_path, ranks_per_host):
    with VirtualHosts(2) as hosts:
        results = finish(launch_on(hosts, graph, tmp_path / "two", ranks_per_host,
                                   f"checkpoint.dir={tmp_path / 'ckpt-two'}", "checkpoint.every=5"))
    for code, out in results:
        assert code == 0, out[-3000:]
    one = subprocess.run(["bash", os.path.join(ROOT, "launch", "torchrun.sh"), f"dataset={graph}", *TRAIN,
                          f"log.dir={tmp_path / 'one'}", f"checkpoint.dir={tmp_path / 'ckpt-one'}",
                          "checkpoint.every=5"],
                         env=rank_env(NPROC=2 * ranks_per_host, MASTER_PORT=free_port(), LSM_GNN_TIMEOUT_S=120),
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    two_hosts, one_host = losses(tmp_path / "two"), losses(tmp_path / "one")
    assert len(two_hosts) >= 5 and two_hosts == one_host  # the same batches, cache and DDP steps, bit for bit
    assert (tmp_path / "ckpt-two" / "last.pt").exists()


def test_a_link_down_mid_run_fails_both_hosts_within_the_timeout_naming_the_other(graph, tmp_path):
    timeout_s = 15
    with VirtualHosts(2) as hosts:
        # Many small batches, so the link goes down while the ranks still exchange rows.
        procs = launch_on(hosts, graph, tmp_path / "down", 1, "sampler.batch_size=8", "train.epochs=50",
                          timeout_s=timeout_s)
        metrics = tmp_path / "down" / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while not (metrics.exists() and metrics.stat().st_size > 5000) and time.monotonic() < deadline:
            assert all(p.poll() is None for p in procs), "a host ended before the link went down"
            time.sleep(0.2)
        hosts.set_link(up=False)
        down_at = time.monotonic()
        results = finish(procs, timeout=timeout_s * 8)
        elapsed = time.monotonic() - down_at
    assert all(code != 0 for code, _ in results), [out[-2000:] for _, out in results]
    assert elapsed < timeout_s * 4, f"the hosts took {elapsed:.0f} s to fail after the link went down"
    for rank, (_, out) in enumerate(results):  # each names the other, and the setting that bounds the wait
        lines = [line for line in out.splitlines() if line.startswith("lsm-gnn")]
        assert any(f"rank {1 - rank}" in line and "LSM_GNN_TIMEOUT_S" in line for line in lines), out[-3000:]
