"""Two hosts on one machine (network namespaces joined by one link, lsm_gnn/testing/virtual_hosts.py): torchrun with
--nnodes 2 and the rendezvous on the first host's address, and mpirun with a host list naming both addresses, train
exactly as one host with the same world size, shared cache, DDP and checkpoints included; so does a link with
added latency and packet loss; a link that goes down mid-run fails both hosts within the collective timeout,
each naming the other."""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from lsm_gnn.testing import free_port
from lsm_gnn.testing.virtual_hosts import VirtualHosts, relay_unavailable, unavailable
from training_runs import GRAPH, ROOT, TRAIN, losses, rank_env  # noqa: F401 (GRAPH: the graph fixture's)

pytest.importorskip("torch_geometric")
WHY_NOT = unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY_NOT is not None, reason=f"no namespaced hosts: {WHY_NOT}")]


def launch_on(hosts, graph, log_dir, nproc: int, *overrides, timeout_s: int = 120, launcher: str = "torchrun"):
    """Training on both hosts, ``nproc`` ranks each, rendezvous on host 0's address; the launchers' processes.

    torchrun: one agent per host (NNODES=2). mpirun: one mpirun on host 0 whose host list names both addresses;
    it starts host 1's daemon through an rsh agent that enters host 1's namespace, as ssh would log in."""
    args = [f"dataset={graph}", *TRAIN, f"log.dir={log_dir}", *overrides]
    common = dict(NPROC=nproc, MASTER_ADDR=hosts[0].address, MASTER_PORT=free_port(), LSM_GNN_TIMEOUT_S=timeout_s)
    if launcher == "torchrun":
        starts = [(host, rank_env(NNODES=2, NODE_RANK=rank, **common), "torchrun.sh")
                  for rank, host in enumerate(hosts.hosts)]
    else:
        agent = hosts.write_rsh_agent(os.path.join(log_dir.parent, f"rsh-{log_dir.name}"))
        env = rank_env(**dict(common, NPROC=2 * nproc), HOSTS=",".join(f"{h.address}:{nproc}" for h in hosts.hosts),
                       OMPI_MCA_plm_rsh_agent=agent)
        starts = [(hosts[0], env, "mpirun.sh")]
    return [subprocess.Popen(host.command(["bash", os.path.join(ROOT, "launch", script), *args]), env=host.env(env),
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for host, env, script in starts]


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


@pytest.fixture(scope="module")
def one_host(graph, tmp_path_factory):
    """Losses of the same training on one host, by world size (run once each)."""
    runs = {}

    def losses_for(world: int) -> list[float]:
        if world not in runs:
            out = tmp_path_factory.mktemp(f"one-host-{world}")
            done = subprocess.run(["bash", os.path.join(ROOT, "launch", "torchrun.sh"), f"dataset={graph}", *TRAIN,
                                   f"log.dir={out / 'log'}", f"checkpoint.dir={out / 'ckpt'}", "checkpoint.every=5"],
                                  env=rank_env(NPROC=world, MASTER_PORT=free_port(), LSM_GNN_TIMEOUT_S=120),
                                  cwd=ROOT, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            runs[world] = losses(out / "log")
        return runs[world]
    return losses_for


def train_on_two_hosts_and_compare(hosts, graph, tmp_path, one_host, ranks_per_host: int, launcher: str):
    results = finish(launch_on(hosts, graph, tmp_path / "two", ranks_per_host,
                               f"checkpoint.dir={tmp_path / 'ckpt-two'}", "checkpoint.every=5", launcher=launcher))
    for code, out in results:
        assert code == 0, out[-3000:]
    two_hosts = losses(tmp_path / "two")
    # The same batches, cache and DDP steps, bit for bit.
    assert len(two_hosts) >= 5 and two_hosts == one_host(2 * ranks_per_host)
    assert (tmp_path / "ckpt-two" / "last.pt").exists()


@pytest.mark.parametrize("launcher,ranks_per_host", [("torchrun", 1), ("torchrun", 2), ("mpirun", 1)])
def test_two_namespaced_hosts_train_as_one_host(graph, tmp_path, one_host, launcher, ranks_per_host):
    if launcher == "mpirun" and shutil.which("mpirun") is None:
        pytest.skip("Open MPI is not installed (apt install openmpi-bin)")
    with VirtualHosts(2) as hosts:
        train_on_two_hosts_and_compare(hosts, graph, tmp_path, one_host, ranks_per_host, launcher)


@pytest.mark.skipif(relay_unavailable() is not None, reason=f"no delaying link: {relay_unavailable()}")
def test_a_slow_lossy_link_trains_the_same_losses(graph, tmp_path, one_host):
    # 2 ms each way and 2% of packets dropped each way: TCP retransmits, the run is slower, the numbers are not.
    link = VirtualHosts(2, delay_ms=2.0, loss=0.02)
    with link as hosts:
        train_on_two_hosts_and_compare(hosts, graph, tmp_path, one_host, 1, "torchrun")
    assert link.relay_counts["dropped"] > 0, link.relay_counts  # packets were lost, and nothing else was


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


@pytest.mark.skipif(relay_unavailable() is not None, reason=f"no delaying link: {relay_unavailable()}")
def test_the_latency_benchmark_runs_and_measures_its_links(tmp_path):
    out = tmp_path / "latency.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "multinode_latency.py"),
                           "--data", str(tmp_path / "g"), "--num-nodes", "3000", "--dim", "16", "--iterations", "8",
                           "--skip", "2", "--repeats", "1", "--batch-size", "64", "--capacity", "40%", "--delays", "1",
                           "--out", str(out)],
                          env=rank_env(), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = json.loads(out.read_text())["table"]
    assert set(table) == {"veth", "relay +1 ms"}
    assert table["relay +1 ms"]["rtt_ms"] >= 2.0 > table["veth"]["rtt_ms"]  # 1 ms each way, measured
    for row in table.values():  # the exchange overlaps training (the loader's thread): its share may pass 1
        assert row["iteration_ms"] > 0 and row["exchange_ms"] > 0
        assert row["exchange_share"] == pytest.approx(row["exchange_ms"] / row["iteration_ms"])
