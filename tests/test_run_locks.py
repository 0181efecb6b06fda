"""Two runs on one checkpoint directory, log directory or embedding table: the second is refused at once, naming
the first (its pid and host), and nothing of the first's is touched. The lock goes with its holder, however it ends."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from lsm_gnn.utils.fileio import LOCK_FILE, DirectoryLocked, RunLock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRAPH = dict(num_nodes=400, avg_degree=4, feature_dim=8, num_classes=3, seed=1)


def overrides(graph, checkpoint_dir, *more):
    return [f"dataset={graph}", "model.kind=sage", "model.hidden=8", "sampler.fanouts=[2,2]", "sampler.batch_size=64",
            "cache.capacity=60%", "log.progress=false", "train.epochs=1", f"checkpoint.dir={checkpoint_dir}", *more]


def hold(code: str, ready: str) -> subprocess.Popen:
    """A child process that runs ``code``, prints ``ready`` and then sleeps until killed."""
    child = subprocess.Popen([sys.executable, "-c", f"{code}\nprint({ready!r}, flush=True)\nimport time\n"
                              "time.sleep(600)"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=ROOT))
    line = child.stdout.readline()
    if line.strip() != ready:
        child.kill()
        raise AssertionError(f"the holder did not start: {line!r} {child.stderr.read()}")
    return child


def kill(child: subprocess.Popen) -> None:
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)


def test_a_second_process_is_refused_with_the_holders_pid_and_freed_when_the_holder_is_killed(tmp_path):
    child = hold(f"from lsm_gnn.utils.fileio import RunLock\nlock = RunLock({str(tmp_path)!r}, 'checkpoint.dir')", "held")
    try:
        with pytest.raises(DirectoryLocked) as info:
            RunLock(str(tmp_path), "checkpoint.dir")
        message = str(info.value)
        assert f"pid {child.pid}" in message and "checkpoint.dir" in message and str(tmp_path) in message
        assert "another checkpoint.dir" in message
    finally:
        kill(child)
    with RunLock(str(tmp_path), "checkpoint.dir"):  # SIGKILL dropped it; the file left behind locks nothing
        holder = json.loads((tmp_path / LOCK_FILE).read_text())
        assert holder["pid"] == os.getpid()


def test_one_process_may_take_its_own_lock_again(tmp_path):
    first = RunLock(str(tmp_path), "checkpoint.dir")
    second = RunLock(str(tmp_path), "checkpoint.dir")  # a trainer made again (a notebook after an error)
    first.release()
    child = subprocess.run([sys.executable, "-c", f"from lsm_gnn.utils.fileio import RunLock\nRunLock({str(tmp_path)!r}, "
                            "'x')"], cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert child.returncode != 0 and "in use by another run" in child.stderr  # still held by `second`
    second.release()
    second.release()  # once only
    with RunLock(str(tmp_path), "x"):
        pass


def test_a_lock_file_that_is_a_link_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("precious")
    os.symlink(target, tmp_path / LOCK_FILE)
    with pytest.raises(OSError, match="lock file"):
        RunLock(str(tmp_path), "checkpoint.dir")
    assert target.read_text() == "precious"


@pytest.mark.slow
def test_a_second_training_run_on_the_checkpoint_dir_is_refused_before_it_touches_it(graph, tmp_path):
    ckpt = tmp_path / "ckpt"
    args = overrides(graph, ckpt)
    child = hold(f"from lsm_gnn.config import load_config\nfrom lsm_gnn.training.trainer import Trainer\n"
                 f"t = Trainer(load_config(None, {args!r}))", "trainer ready")
    try:
        before = sorted(os.listdir(ckpt))
        run = subprocess.run([sys.executable, "-m", "lsm_gnn", "train", *args], cwd=ROOT, capture_output=True,
                             text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
        assert run.returncode == 1
        assert run.stderr.startswith("lsm-gnn: error:") and f"pid {child.pid}" in run.stderr, run.stderr
        assert "checkpoint.dir" in run.stderr and "Traceback" not in run.stderr
        assert sorted(os.listdir(ckpt)) == before  # no checkpoint, no log, no table of the second run
    finally:
        kill(child)
    run = subprocess.run([sys.executable, "-m", "lsm_gnn", "train", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert run.returncode == 0, run.stderr
    assert os.path.exists(ckpt / "last.pt")


@pytest.mark.slow
def test_a_second_run_on_an_embedding_table_is_refused(graph, tmp_path):
    table = tmp_path / "table"
    first = overrides(graph, tmp_path / "a", "model.node_embedding.dim=4", f"model.node_embedding.path={table}")
    second = overrides(graph, tmp_path / "b", "model.node_embedding.dim=4", f"model.node_embedding.path={table}")
    child = hold(f"from lsm_gnn.config import load_config\nfrom lsm_gnn.training.trainer import Trainer\n"
                 f"t = Trainer(load_config(None, {first!r}))", "trainer ready")
    try:
        journal = (table / "undo.0.log").read_bytes()
        start = time.monotonic()
        run = subprocess.run([sys.executable, "-m", "lsm_gnn", "train", *second], cwd=ROOT, capture_output=True,
                             text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
        assert run.returncode == 1 and f"pid {child.pid}" in run.stderr, run.stderr
        assert "embedding table" in run.stderr and str(table) in run.stderr
        assert (table / "undo.0.log").read_bytes() == journal  # the first run's journal is as it was
        assert time.monotonic() - start < 120  # refused at once, not after training
    finally:
        kill(child)


def test_a_trainer_that_fails_to_start_holds_nothing(graph, tmp_path, monkeypatch):
    """Its locks, its data check's thread and its kernels= setting are given back at once: before, a trainer
    that failed after taking them kept the check running and the locks held until the process ended."""
    import threading

    from lsm_gnn.config import ConfigError, load_config
    from lsm_gnn.kernels import kernel_setting
    from lsm_gnn.training.trainer import Trainer
    from lsm_gnn.utils.fileio import _held_locks

    def checks_running():
        return sum(t.name == "lsm-gnn-verify" for t in threading.enumerate())

    from lsm_gnn import kernels

    monkeypatch.setattr(kernels, "_scopes", ())  # earlier trainers not closed nor yet collected hold theirs
    before, checks_before = kernel_setting(), checks_running()
    args = [f"dataset={graph}", f"checkpoint.dir={tmp_path / 'ckpt'}", "log.progress=false", "kernels=triton",
            "train.eval_splits=[nope]"]  # refused after the locks are taken and the check has started
    with pytest.raises(ConfigError, match="nope"):
        Trainer(load_config(None, args))
    assert not [path for path in _held_locks if path.startswith(str(tmp_path))] and kernel_setting() == before
    assert checks_running() <= checks_before


def test_a_lock_file_that_is_a_fifo_is_refused_at_once_with_the_fix(tmp_path):
    import time

    os.mkfifo(tmp_path / LOCK_FILE)
    start = time.monotonic()
    with pytest.raises(OSError, match=f"lock file {tmp_path / LOCK_FILE} is not a regular file.*remove it"):
        RunLock(str(tmp_path), "checkpoint.dir")
    assert time.monotonic() - start < 1
