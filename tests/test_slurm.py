"""launch/slurm.sbatch under a real SLURM: a one-node cluster on this machine (scripts/slurm_one_node.sh: Debian's
slurm-wlm and munge, its own munged, slurmctld and slurmd) runs the script with `sbatch`. Two ranks train exactly as
launch/torchrun.sh with NPROC=2 does, whether the ranks come from the GPUs SLURM granted (--gpus-per-node or --gres)
or from NPROC on CPUs, and write their checkpoint; `scontrol` and `sacct -c` show the job COMPLETED. A job that
cannot train shows FAILED, with lsm-gnn's error in its output file."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from lsm_gnn.testing import free_port
from training_runs import GRAPH, ROOT, TRAIN, losses, rank_env  # noqa: F401 (GRAPH: the graph fixture's)

SCRIPT = os.path.join(ROOT, "scripts", "slurm_one_node.sh")
SBATCH = os.path.join(ROOT, "launch", "slurm.sbatch")
GPUS = 2  # the node advertises two GPUs (links to /dev/null) so that jobs can ask for --gpus-per-node=2
CHECKPOINTS = ["checkpoint.every=5"]
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
                "PREEMPTED")


def unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (slurmd starts jobs as their user; munged's key must be private)"
    missing = [c for c in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sacct") if shutil.which(c) is None]
    if missing:
        return f"{', '.join(missing)} not on PATH (Debian: apt-get install --no-install-recommends slurm-wlm munge)"
    return None


pytest.importorskip("torch_geometric")
WHY_NOT = unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY_NOT is not None, reason=f"no SLURM here: {WHY_NOT}")]


@pytest.fixture(scope="module")
def slurm_conf():
    """SLURM_CONF of a one-node cluster started for this module, stopped after it."""
    # Not under pytest's tmp dir: munged wants every directory above its socket open to all, and that one is 0700.
    directory = tempfile.mkdtemp(prefix="lsm-gnn-slurm-")
    started = subprocess.run(["bash", SCRIPT, "start", directory], env=dict(os.environ, GPUS=str(GPUS)),
                             capture_output=True, text=True, timeout=120)
    try:
        if started.returncode != 0:
            pytest.skip(f"the one-node SLURM cluster did not start: {started.stderr.strip()[-3000:]}")
        yield os.path.join(directory, "slurm.conf")
    finally:
        stopped = subprocess.run(["bash", SCRIPT, "stop", directory], capture_output=True, text=True, timeout=120)
        shutil.rmtree(directory, ignore_errors=True)
        assert stopped.returncode == 0, f"the SLURM daemons did not stop: {stopped.stderr}"


def slurm(conf: str, *argv: str) -> str:
    result = subprocess.run(argv, env=dict(os.environ, SLURM_CONF=conf), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"{' '.join(argv)}: {result.stderr}"
    return result.stdout


def sbatch(conf: str, out_dir, *options: str, args=(), cwd=ROOT, script=SBATCH,
           timeout_s: int = 300) -> tuple[str, str, str]:
    """Submits ``script`` (from the checkout unless ``cwd`` says otherwise) for one node with all its CPUs and waits
    for the job's end: (job id, its JobState and ExitCode in `scontrol show job`, the job's output)."""
    cpus = slurm(conf, "sinfo", "-h", "-o", "%c").split()[0]
    output = os.path.join(out_dir, "slurm-%j.out")
    env = rank_env(SLURM_CONF=conf, PYTHON=sys.executable, LSM_GNN_TIMEOUT_S=120)
    for inherited in ("NPROC", "MASTER_PORT"):  # what the script derives, unless a test sets it
        env.pop(inherited, None)
    submitted = subprocess.run(["sbatch", "--parsable", "--nodes=1", f"--cpus-per-task={cpus}", "--time=5",
                                f"--output={output}", *options, script, *args],
                               env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    # Polled rather than `sbatch --wait`, which checks back only every few seconds and has no time limit.
    deadline = time.monotonic() + timeout_s
    while True:
        record = slurm(conf, "scontrol", "show", "job", "-o", job)
        state, exit_code = re.search(r"JobState=(\S+).* ExitCode=(\S+)", record).groups()
        if state in FINAL_STATES:
            break
        if time.monotonic() > deadline:
            slurm(conf, "scancel", job)
            pytest.fail(f"job {job} still {state} after {timeout_s} s")
        time.sleep(0.2)
    with open(output.replace("%j", job)) as fh:
        return job, f"{state} {exit_code}", fh.read()


@pytest.fixture(scope="module")
def torchrun_losses(graph, tmp_path_factory):
    """The losses of launch/torchrun.sh with NPROC=2 on one machine, the run each SLURM job must repeat."""
    log_dir = tmp_path_factory.mktemp("torchrun")
    result = subprocess.run(["bash", os.path.join(ROOT, "launch", "torchrun.sh"), f"dataset={graph}", *TRAIN,
                             f"log.dir={log_dir}", f"checkpoint.dir={log_dir / 'ckpt'}", *CHECKPOINTS],
                            env=rank_env(NPROC=2, MASTER_PORT=free_port(), LSM_GNN_TIMEOUT_S=120), cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return losses(log_dir)


def gres_script(directory) -> str:
    """launch/slurm.sbatch adapted, as docs/distributed.md says, for a cluster that asks for GPUs with --gres."""
    with open(os.path.join(ROOT, "launch", "slurm.sbatch")) as fh:
        text = fh.read()
    assert "#SBATCH --gpus-per-node=4\n" in text
    path = os.path.join(directory, "slurm-gres.sbatch")
    with open(path, "w") as fh:
        fh.write(text.replace("#SBATCH --gpus-per-node=4\n", f"#SBATCH --gres=gpu:{GPUS}\n"))
    return path


@pytest.mark.parametrize("options, for_gres", [
    pytest.param((f"--gpus-per-node={GPUS}",), False, id="ranks-from-gpus-per-node"),
    pytest.param((), True, id="ranks-from-gres"),
    pytest.param(("--gpus-per-node=0", "--export=ALL,NPROC=2"), False, id="cpu-ranks-from-nproc"),
])
def test_a_job_trains_two_ranks_as_torchrun_does(slurm_conf, graph, torchrun_losses, tmp_path, options, for_gres):
    run_dir = tmp_path / "a run"  # a space: the arguments reach lsm-gnn whole
    job, state, output = sbatch(slurm_conf, tmp_path, *options, script=gres_script(tmp_path) if for_gres else SBATCH,
                                args=[f"dataset={graph}", *TRAIN, f"log.dir={run_dir}",
                                      f"checkpoint.dir={run_dir / 'ckpt'}", *CHECKPOINTS])
    assert state == "COMPLETED 0:0", output[-3000:]
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True, check=True).stdout.strip()
    port = 20000 + int(job) % 10000
    assert f"slurm.sbatch: job {job}: 1 node(s) x 2 rank(s), rendezvous {host}:{port}" in output
    assert "shared by 2 ranks" in output
    assert slurm(slurm_conf, "sacct", "-c", "-j", job, "-n", "-P", "-o", "state,exitcode").split() == ["COMPLETED|0:0"]
    assert (run_dir / "ckpt" / "last.pt").exists()
    trained = losses(run_dir)
    assert len(trained) == 10 and trained == torchrun_losses  # the same batches, cache and DDP steps, bit for bit


def test_a_job_that_cannot_train_fails_with_the_lsm_gnn_error(slurm_conf, tmp_path):
    missing = tmp_path / "no dataset"
    job, state, output = sbatch(slurm_conf, tmp_path, "--gpus-per-node=0", "--export=ALL,NPROC=2",
                                args=[f"dataset={missing}", "log.progress=false"])
    assert state == "FAILED 1:0", output[-3000:]
    assert f"lsm-gnn: error: {missing}: no such dataset directory" in output
    assert slurm(slurm_conf, "sacct", "-c", "-j", job, "-n", "-P", "-o", "state,exitcode").split() == ["FAILED|1:0"]


@pytest.mark.parametrize("options, where, error", [
    (("--export=ALL,NPROC=two",), ROOT, "slurm.sbatch: NPROC must be a positive number of ranks, not 'two'"),
    ((), "/", "slurm.sbatch: no launch/torchrun.sh in /: submit from the lsm-gnn checkout"),
], ids=["nproc-not-a-number", "submitted-outside-the-checkout"])
def test_a_job_the_script_cannot_launch_fails_saying_why(slurm_conf, tmp_path, options, where, error):
    _, state, output = sbatch(slurm_conf, tmp_path, "--gpus-per-node=0", *options, args=["log.progress=false"],
                              cwd=where)
    assert state == "FAILED 2:0" and error in output, output
