"""The trainer fails before work starts on what can be checked, and never trains on to a wrong answer."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch_geometric")

from lsm_gnn.cli import main as cli  # noqa: E402
from lsm_gnn.config import ConfigError, load_config  # noqa: E402
from lsm_gnn.testing import rewrite_checksums  # noqa: E402
from lsm_gnn.training.trainer import Trainer, TrainingDiverged, all_finite  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The graph fixture (conftest.py) generates this once per module.
GRAPH = dict(num_nodes=1200, avg_degree=6, feature_dim=8, num_classes=3, seed=3)


def overrides(graph, *more):
    return [f"dataset={graph}", "model.kind=sage", "model.hidden=16", "sampler.fanouts=[3,2]",
            "sampler.batch_size=200", "cache.capacity=60%", "cache.window=4", "log.progress=false", *more]


def config(graph, *more):
    return load_config(None, overrides(graph, *more))


@pytest.fixture
def partly_unlabeled(graph, tmp_path):
    """The graph with a third of its nodes (in every split) unlabeled."""
    path = tmp_path / "unlabeled"
    shutil.copytree(graph, path)
    labels = np.load(path / "labels.npy")
    labels[::3] = -1
    np.save(path / "labels.npy", labels)
    rewrite_checksums(path, "labels.npy")
    return str(path), labels


def test_unlabeled_nodes_are_left_out_of_the_loss_and_the_metrics(partly_unlabeled):
    path, labels = partly_unlabeled
    trainer = Trainer(config(path, "train.epochs=1"))
    seeds = trainer.loader.seeds
    assert seeds.size and (labels[seeds] >= 0).all()
    result = trainer.fit()
    from lsm_gnn.data import open_dataset

    ds = open_dataset(path)
    for split in ("val", "test"):
        assert result["eval"][split]["count"] == int((labels[ds.split(split)] >= 0).sum())
    assert np.isfinite(result["history"][0]["loss"])


def test_a_train_split_without_labels_is_refused(partly_unlabeled, tmp_path):
    path, labels = partly_unlabeled
    labels[:] = -1
    np.save(os.path.join(path, "labels.npy"), labels)
    with pytest.raises(ConfigError, match="every node of the train split.*unlabeled"):
        Trainer(config(path))


@pytest.mark.parametrize("key", ["checkpoint.dir", "log.dir"])
@pytest.mark.parametrize("problem", ["a file", "read-only", "under a file"])
def test_unwritable_output_directories_fail_before_training(graph, tmp_path, key, problem):
    target = tmp_path / "out"
    if problem == "a file":
        target.write_text("occupied")
    elif problem == "read-only":
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only directories; the other cases cover the check")
        target.mkdir()
        target.chmod(0o500)
    else:
        (tmp_path / "file").write_text("x")
        target = tmp_path / "file" / "sub"
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        Trainer(config(graph, f"{key}={target}"))


def test_a_read_only_mount_fails_before_training(graph, tmpfs):
    target = tmpfs("ro", "ro,size=1M")
    with pytest.raises(ConfigError, match=r"checkpoint\.dir=.*not writable"):
        Trainer(config(graph, f"checkpoint.dir={target}"))


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("key", ["train.lr", "train.weight_decay", "model.dropout"])
def test_non_finite_numbers_are_refused(graph, key, value):
    with pytest.raises(ConfigError, match="finite"):
        config(graph, f"{key}={value}")


def test_a_diverging_run_stops_with_an_error_and_keeps_the_last_good_weights(graph, tmp_path):
    trainer = Trainer(config(graph, "train.lr=1e30", f"checkpoint.dir={tmp_path}"))
    with pytest.raises(TrainingDiverged, match="Lower train.lr"):
        trainer.fit()
    import torch

    assert all(torch.isfinite(p).all() for p in trainer.module.parameters())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), None])
def test_an_embedding_gradient_is_finite_only_when_every_value_is(bad):
    import torch

    grad = torch.full((1000, 64), 3e38)  # finite, though a float32 sum of them overflows
    grad[::2] *= -1
    if bad is not None:
        grad[999, 63] = bad
    assert all_finite(grad) is (bad is None)


def test_a_json_output_that_cannot_be_written_fails_before_training(graph, tmp_path, capsys):
    (tmp_path / "a-file").write_text("")  # a folder that cannot be made (a missing one is made)
    assert cli(["train", *overrides(graph), "--json", str(tmp_path / "a-file" / "r.json")]) == 1
    assert "--json" in capsys.readouterr().err
    assert cli(["train", *overrides(graph), "--json", str(tmp_path)]) == 1
    assert "is a directory" in capsys.readouterr().err
    foreign = tmp_path / "notes.json"
    foreign.write_text('{"mine": true}')
    link = tmp_path / "link.json"
    link.symlink_to(foreign)
    for path in (foreign, link):  # refused before training, and left as it was
        assert cli(["train", *overrides(graph), "--json", str(path)]) == 1
        err = capsys.readouterr().err
        assert f"--json {path}" in err and "left as it is" in err or "symbolic link" in err
        assert foreign.read_text() == '{"mine": true}'


@pytest.mark.slow
def test_ctrl_c_prints_one_line(graph):
    """SIGINT while training: one line and exit 130, no traceback."""
    import signal
    import time

    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # SIGINT handled as in a terminal even where the suite itself was started in the background (a shell without
    # job control starts those with SIGINT ignored, the child inherits it, and Python then keeps it ignored).
    proc = subprocess.Popen([sys.executable, "-m", "lsm_gnn", "train", *overrides(graph, "train.epochs=1000")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    line = ""
    while time.time() < deadline and "training" not in line:
        line = proc.stdout.readline()
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and err.strip().startswith("lsm-gnn: interrupted")
    assert len(err.strip().splitlines()) == 1


def test_an_internal_error_is_one_line_with_a_way_to_the_traceback(graph, monkeypatch, capsys):
    import lsm_gnn.training.trainer as trainer

    def broken(cfg, out=None):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(trainer, "train", broken)
    assert cli(["train", *overrides(graph)]) == 1
    err = capsys.readouterr().err
    assert "internal error: ZeroDivisionError" in err and "LSM_GNN_TRACEBACK=1" in err and err.count("\n") == 1


@pytest.mark.parametrize("name", ["last.pt", "best.pt"])
def test_a_checkpoint_file_lsm_gnn_did_not_write_is_never_written_over(graph, tmp_path, capsys, name):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    theirs = ckpt / name
    theirs.write_bytes(b"someone's own weights")
    assert cli(["train", *overrides(graph, f"checkpoint.dir={ckpt}", "checkpoint.resume=false")]) == 1
    err = capsys.readouterr().err
    assert f"{theirs} is not an lsm-gnn checkpoint, and this run would write over it" in err
    assert theirs.read_bytes() == b"someone's own weights"


def test_the_kernel_setting_is_given_back_when_the_trainer_closes_or_fails_to_start(graph, tmp_path, monkeypatch):
    """kernels= used to stay set for the whole process after a trainer chose it."""
    from lsm_gnn.kernels import kernel_mode, kernel_setting

    no_kernel_setting(monkeypatch)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="checkpoint.dir"):
        Trainer(config(graph, "kernels=triton", f"checkpoint.dir={blocker}"))
    assert kernel_setting() is None and kernel_mode() == "native"
    with Trainer(config(graph, "kernels=triton")) as trainer:
        assert kernel_mode() == "triton" and trainer.cfg.kernels == "triton"
        with pytest.raises(ConfigError, match="checkpoint.dir"):  # a failed start inside a run leaves it be
            Trainer(config(graph, "kernels=native", f"checkpoint.dir={blocker}"))
        assert kernel_mode() == "triton"
    assert kernel_setting() is None and kernel_mode() == "native"


def no_kernel_setting(monkeypatch):
    """No kernels= chosen in code: what earlier tests left (a trainer not closed nor yet collected holds its
    scope) set aside, and no LSM_GNN_KERNELS."""
    from lsm_gnn import kernels

    monkeypatch.setattr(kernels, "_mode", None)
    monkeypatch.setattr(kernels, "_scopes", ())
    monkeypatch.delenv(kernels.KERNELS_ENV, raising=False)


def test_trainers_one_after_another_or_overlapping_each_run_their_own_kernels(graph, tmp_path, monkeypatch):
    from lsm_gnn.kernels import kernel_mode, kernel_setting

    no_kernel_setting(monkeypatch)
    for mode in ("triton", "native", "triton"):
        with Trainer(config(graph, f"kernels={mode}")):
            assert kernel_mode() == mode
        assert kernel_setting() is None
    first = Trainer(config(graph, "kernels=triton"))
    second = Trainer(config(graph, "kernels=native"))
    first.close()  # the first closed first: the second's mode stays, not the one before the first
    assert kernel_mode() == "native"
    second.close()
    assert kernel_setting() is None
    dropped = Trainer(config(graph, "kernels=triton"))
    assert kernel_mode() == "triton"
    del dropped  # never closed: its scope ends when it is collected
    import gc

    gc.collect()
    assert kernel_setting() is None
