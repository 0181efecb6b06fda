"""Model selection: evaluation every N iterations or epochs, best.pt, early stopping, the summary at the best."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch_geometric")

from lsm_gnn.config import ConfigError, load_config  # noqa: E402
from lsm_gnn.testing import free_port  # noqa: E402
from lsm_gnn.training.checkpoint_files import load_checkpoint  # noqa: E402
from lsm_gnn.training.trainer import Trainer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The graph fixture (conftest.py) generates this once per module: about 1000 labeled train nodes, so 5
# iterations an epoch in batches of 200.
GRAPH = dict(num_nodes=1500, avg_degree=6, feature_dim=8, num_classes=3, seed=2)


def common(graph, out):
    return [f"dataset={graph}", "model.kind=sage", "model.hidden=16", "sampler.fanouts=[3,2]",
            "sampler.batch_size=200", "cache.capacity=60%", "cache.window=4", "train.lr=0.01", "log.progress=false",
            f"log.dir={out / 'log'}", f"checkpoint.dir={out / 'ckpt'}"]


def config(graph, out, *more):
    return load_config(None, [*common(graph, out), *more])


def log_records(out, key):
    with open(out / "log" / "metrics.jsonl") as fh:
        return [r[key] for r in map(json.loads, fh) if key in r]


@pytest.fixture(autouse=True)
def _one_thread_for_every_test(one_torch_thread):
    """Tiny models (conftest.one_torch_thread)."""


def test_best_pt_holds_the_best_validation_weights_and_the_summary_reports_test_there(graph, tmp_path, capsys):
    trainer = Trainer(config(graph, tmp_path, "train.epochs=3", "train.eval_every=2"))
    result = trainer.fit()
    evaluations = result["evaluations"]
    # Every 2 iterations, and at each epoch's end (iterations 5, 10, 15).
    assert [e["iterations"] for e in evaluations] == [2, 4, 5, 6, 8, 10, 12, 14, 15]
    assert [e["epoch"] for e in evaluations] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    values = [e["val"]["accuracy"] for e in evaluations]
    first_best = values.index(max(values))
    best = result["best"]
    assert best["metric"] == "val.accuracy" and best["mode"] == "max" and not best["stopped_early"]
    assert best["value"] == max(values) and best["iterations"] == evaluations[first_best]["iterations"]
    assert best["eval"]["test"] == evaluations[first_best]["test"]
    assert result["eval"]["test"] == evaluations[-1]["test"]  # "eval" stays the last evaluation
    # best.pt is the trainer state at that evaluation: its weights score the reported accuracy again.
    state = load_checkpoint(str(tmp_path / "ckpt" / "best.pt"))
    assert state["iterations_done"] == best["iterations"]
    trainer.module.load_state_dict(state["model"])
    assert trainer.evaluate("val")["accuracy"] == best["value"]
    trainer.loader.close()
    out = capsys.readouterr().out
    assert (f"best val.accuracy {best['value']:.4f} at epoch {best['epoch']}, after {best['iterations']} "
            "iterations") in out
    assert f"test there: accuracy {best['eval']['test']['accuracy']:.4f}" in out
    assert log_records(tmp_path, "evaluation") == evaluations
    [summary] = log_records(tmp_path, "run_summary")
    assert summary["best"] == best and summary["iterations"] == 15


def test_early_stopping_after_patience_evaluations_without_improvement(graph, tmp_path, capsys):
    result = Trainer(config(graph, tmp_path, "train.epochs=5", "train.eval_every=1",
                            "train.early_stopping.patience=2", "train.early_stopping.min_delta=0.01")).fit()
    best, evaluations = result["best"], result["evaluations"]
    assert best["stopped_early"] and result["iterations"] < 25
    assert evaluations[-1]["iterations"] == result["iterations"]  # it stopped right at the evaluation
    at = [e["iterations"] for e in evaluations].index(best["iterations"])
    assert len(evaluations) - 1 - at == 2  # patience: two evaluations without improvement, then stop
    assert all(e["val"]["accuracy"] <= best["value"] + 0.01 for e in evaluations[at + 1:])
    assert "stopped early: val.accuracy did not improve on the best in 2 evaluation(s)" in capsys.readouterr().out
    assert not result["history"][-1]["complete"] or result["iterations"] % 5 == 0
    # A stopped run asked to go on stays stopped: resuming trains nothing more.
    again = Trainer(config(graph, tmp_path, "train.epochs=5", "train.eval_every=1",
                           "train.early_stopping.patience=2", "train.early_stopping.min_delta=0.01")).fit()
    assert again["iterations"] == result["iterations"] and again["best"] == best


def test_min_mode_and_a_chosen_split(graph, tmp_path):
    result = Trainer(config(graph, tmp_path, "train.epochs=2", "train.eval_every=2",
                            "train.early_stopping.metric=test.accuracy", "train.early_stopping.mode=min")).fit()
    values = [e["test"]["accuracy"] for e in result["evaluations"]]
    assert result["best"]["metric"] == "test.accuracy" and result["best"]["value"] == min(values)


def test_evaluation_every_n_epochs_and_always_after_the_last(graph, tmp_path):
    result = Trainer(config(graph, tmp_path, "train.epochs=3", "train.eval_every_epochs=2")).fit()
    assert [(e["epoch"], e["iterations"]) for e in result["evaluations"]] == [(1, 10), (2, 15)]
    assert ["val" in s for s in result["history"]] == [False, True, True]


def test_no_validation_split_no_selection(graph, tmp_path):
    result = Trainer(config(graph, tmp_path, "train.epochs=1", "train.eval_splits=[test]")).fit()
    assert result["best"] is None and not (tmp_path / "ckpt" / "best.pt").exists()
    assert [set(e) for e in result["evaluations"]] == [{"epoch", "iterations", "test", "seconds"}]
    # the time evaluating, beside training's, in the epoch's summary and the run's
    assert result["eval_s"] == result["evaluations"][0]["seconds"] == result["history"][0]["eval_s"] > 0
    nothing = Trainer(config(graph, tmp_path / "none", "train.epochs=1", "train.eval_splits=[]")).fit()
    assert nothing["evaluations"] == [] and nothing["eval"] == {} and nothing["best"] is None


def test_a_checkpoint_from_before_model_selection_resumes(graph, tmp_path):
    """A last.pt without evaluations or selection state (lsm-gnn before them) resumes with none so far."""
    from lsm_gnn.training.checkpoint_files import atomic_torch_save

    Trainer(config(graph, tmp_path, "train.epochs=2", "train.max_iterations=7")).fit()
    path = str(tmp_path / "ckpt" / "last.pt")
    state = load_checkpoint(path)
    assert state["evaluations"] and state["selection"]["best"] is not None  # epoch 0 was evaluated
    del state["evaluations"], state["selection"]
    atomic_torch_save(state, path)
    result = Trainer(config(graph, tmp_path, "train.epochs=2")).fit()
    assert [e["iterations"] for e in result["evaluations"]] == [10]
    assert result["best"]["iterations"] == 10 and result["eval"]["test"] == result["best"]["eval"]["test"]


def test_bad_selection_settings_are_named(graph, tmp_path):
    with pytest.raises(ConfigError, match=r"reports accuracy; watch one of those"):
        Trainer(config(graph, tmp_path, "train.early_stopping.metric=val.recall@20"))
    with pytest.raises(ConfigError, match=r"watches split test, which train.eval_splits=\['val'\]"):
        config(graph, tmp_path, "train.early_stopping.metric=test.accuracy", "train.eval_splits=[val]")
    with pytest.raises(ConfigError, match="needs a validation split"):
        config(graph, tmp_path, "train.early_stopping.patience=3", "train.eval_splits=[test]")
    with pytest.raises(ConfigError, match="is not <split>.<metric>"):
        config(graph, tmp_path, "train.early_stopping.metric=accuracy")
    with pytest.raises(ConfigError, match="train.eval_every must be >= 0"):
        config(graph, tmp_path, "train.eval_every=-1")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sampled", "full"])
def test_two_ranks_evaluate_mid_epoch_and_stop_together(graph, tmp_path, mode):
    """Both ranks stop at the same evaluation (rank 0 decides; a rank that went on would hang the other).
    Full-neighbourhood evaluation shares its chunks between the ranks, through the shared cache."""
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1", LSM_GNN_TIMEOUT_S="60",
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        args = [*common(graph, tmp_path), "sampler.batch_size=100", "train.epochs=5", "train.eval_every=1",
                "train.early_stopping.patience=2", "train.early_stopping.min_delta=0.01", f"train.eval_mode={mode}",
                "train.eval_batch_size=64"]
        procs.append(subprocess.Popen([sys.executable, "-m", "lsm_gnn", "train", *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outputs]
    assert "stopped early" in outputs[0][0]
    [summary] = log_records(tmp_path, "run_summary")
    assert summary["best"]["stopped_early"] and summary["iterations"] < 25
    assert sorted(os.listdir(tmp_path / "ckpt")) == [".lsm-gnn.lock", "best.pt", "last.pt"]
    # One process with best.pt's weights scores the same (sampled: each rank sampled its share of the nodes).
    if mode == "full":
        trainer = Trainer(config(graph, tmp_path / "one", "train.eval_mode=full", "train.eval_batch_size=64"))
        trainer.module.load_state_dict(load_checkpoint(str(tmp_path / "ckpt" / "best.pt"))["model"])
        assert trainer.evaluate("val")["accuracy"] == summary["best"]["value"]
        trainer.loader.close()


def test_evaluations_reach_tensorboard_at_their_iteration(tmp_path):
    """Without the tensorboard package here, a stand-in writer records what MetricsLog sends it."""
    from lsm_gnn.training.trainer import MetricsLog

    scalars = []
    log = MetricsLog(load_config(None, []), rank=1)  # no file
    log.board = type("Board", (), {"add_scalar": lambda self, *a: scalars.append(a)})()
    log.write({"evaluation": {"epoch": 0, "iterations": 4, "val": {"accuracy": 0.5, "count": 10}}})
    log.write({"epoch_summary": {"epoch": 0, "loss": 1.0}})  # no step: not a scalar
    assert scalars == [("evaluation/val/accuracy", 0.5, 4), ("evaluation/val/count", 10, 4)]
