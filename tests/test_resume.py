"""A run stopped at any point and resumed gives the history, metrics and summaries of an uninterrupted one."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch_geometric")

from lsm_gnn.training import checkpoint_files as checkpoint_module  # noqa: E402
from lsm_gnn.config import load_config  # noqa: E402
from lsm_gnn.training.trainer import Trainer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Measured, not decided: what the cache read and how long it took depend on what was cached before a restart.
VOLATILE = {"wall_s", "stages_s", "hit_ratio", "bytes_read", "amplification", "time", "checkpoint",
            "embedding_bytes_read", "embedding_bytes_written", "embedding_hit_ratio", "read_s", "train_s", "bound_s",
            "pipeline_efficiency", "seconds", "eval_s"}


# The graph fixture (conftest.py) generates this once per module.
GRAPH = dict(num_nodes=1500, avg_degree=6, feature_dim=8, num_classes=3, seed=2)


def overrides(graph, out, *more):
    # 1200 train nodes in batches of 200: 6 iterations per epoch.
    return [f"dataset={graph}", "model.kind=sage", "model.hidden=16", "sampler.fanouts=[3,2]",
            "sampler.batch_size=200", "cache.capacity=60%", "cache.window=4", "train.lr=0.01", "train.epochs=2",
            "model.dropout=0.3", "checkpoint.every=2", "log.progress=false", f"log.dir={out / 'log'}",
            f"checkpoint.dir={out / 'ckpt'}", *more]


def config(graph, out, *more):
    return load_config(None, overrides(graph, out, *more))


def stable(value):
    """``value`` without the measured fields."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def log_records(out):
    with open(out / "log" / "metrics.jsonl") as fh:
        return [stable(json.loads(line)) for line in fh]


@pytest.fixture(scope="module")
def uninterrupted(graph, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    result = Trainer(config(graph, out)).fit()
    assert [s["complete"] for s in result["history"]] == [True, True] and "test" in result["eval"]
    return stable(result["history"]), log_records(out), stable(result["eval"])


class Crash(Exception):
    """Stands in for a kill: nothing after it runs."""


def run_until_crash(trainer, where, monkeypatch, after_calls):
    calls = {"n": 0}

    def crash_after(original):
        def wrapped(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] > after_calls:
                raise Crash(where)
            return original(*args, **kwargs)
        return wrapped

    if where == "train step":
        monkeypatch.setattr(trainer, "_step", crash_after(trainer._step))
    elif where == "evaluation":
        monkeypatch.setattr(trainer, "evaluate", crash_after(trainer.evaluate))
    elif where == "checkpoint write":  # the rename never happens: the previous checkpoint stays
        monkeypatch.setattr(checkpoint_module, "atomic_write_bytes", crash_after(checkpoint_module.atomic_write_bytes))
    with pytest.raises(Crash):
        trainer.fit()
    monkeypatch.undo()


@pytest.mark.parametrize("where,after_calls", [
    ("train step", 3),        # mid-epoch, one iteration past the last checkpoint: it is trained again
    ("train step", 6),        # at the start of epoch 1, after epoch 0's summary
    ("evaluation", 0),        # after the epoch's last batch was checkpointed, before its evaluation
    ("evaluation", 3),        # in the last epoch's evaluation: the run looked finished
    ("checkpoint write", 2),  # inside a checkpoint write
    ("checkpoint write", 3),  # the write of the end-of-epoch checkpoint
])
def test_a_resumed_run_matches_an_uninterrupted_one(graph, tmp_path, monkeypatch, uninterrupted, where, after_calls):
    history, records, final_eval = uninterrupted
    run_until_crash(Trainer(config(graph, tmp_path)), where, monkeypatch, after_calls)
    resumed = Trainer(config(graph, tmp_path))
    result = resumed.fit()
    assert stable(result["history"]) == history
    assert stable(result["eval"]) == final_eval
    assert log_records(tmp_path) == records  # nothing logged twice, nothing missing
    assert sorted(os.listdir(tmp_path / "ckpt")) == [".lsm-gnn.lock", "best.pt", "last.pt"]  # no temporary left


def test_a_finished_run_resumes_to_nothing_and_says_so(graph, tmp_path, uninterrupted):
    Trainer(config(graph, tmp_path)).fit()
    again = Trainer(config(graph, tmp_path)).fit()
    assert stable(again["history"]) == uninterrupted[0] and again["eval"]


def test_a_stopped_epoch_resumed_has_one_summary_over_all_its_iterations(graph, tmp_path, uninterrupted):
    first = Trainer(config(graph, tmp_path, "train.max_iterations=4")).fit()
    assert [(s["epoch"], s["complete"], s["iterations"]) for s in first["history"]] == [(0, False, 4)]
    result = Trainer(config(graph, tmp_path)).fit()
    assert stable(result["history"]) == uninterrupted[0]


def test_the_loader_gathers_no_batch_past_the_iteration_limit(graph, tmp_path):
    """Its thread stops after the last batch trained: with several ranks, a thread that ran ahead would wait in a
    collective gather that the other rank's, already stopped, never joins."""
    trainer = Trainer(config(graph, tmp_path, "train.max_iterations=3", "checkpoint.every=0"))
    trainer.fit()
    assert trainer.features.only.stats.iterations == 3  # one cache lookup per gathered batch


def test_stale_temporary_checkpoints_of_dead_writers_are_removed(graph, tmp_path):
    from lsm_gnn.utils.fileio import temp_prefix

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    mine = temp_prefix(str(ckpt / "last.pt"))  # .last.pt.tmp-<host>-<this pid>-
    host_part = mine[:mine.rindex("-", 0, -1) + 1]
    stale = ckpt / f"{host_part}{dead.stdout.strip()}-abc123"
    live = ckpt / f"{mine}def456"
    other_host = ckpt / f".last.pt.tmp-elsewhere-{dead.stdout.strip()}-ghi789"
    legacy_old, legacy_new = ckpt / ".tmp-oldone.pt", ckpt / ".tmp-newone.pt"  # lsm-gnn 0.1 names no writer
    unrelated = ckpt / "notes.pt"
    for path in (stale, live, other_host, legacy_old, legacy_new, unrelated):
        path.write_bytes(b"x")
    os.utime(legacy_old, (time.time() - 7200, time.time() - 7200))
    Trainer(config(graph, tmp_path, "train.max_iterations=1")).loader.close()
    assert sorted(os.listdir(ckpt)) == sorted([".lsm-gnn.lock", *(p.name for p in (live, other_host, legacy_new,
                                                                                  unrelated))])


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_from_the_cli(graph, tmp_path, uninterrupted):
    """A real kill: the process gets SIGKILL while training; the CLI run started again completes the run."""
    args = [sys.executable, "-m", "lsm_gnn", "train", *overrides(graph, tmp_path)]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "log" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and sum(1 for line in open(metrics) if '"iteration"' in line) >= 3:
            break
        time.sleep(0.02)
    if proc.poll() is not None:
        pytest.skip("the run finished before it could be killed")  # a very fast machine; the in-process cases cover it
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resumed from" in done.stdout
    assert log_records(tmp_path) == uninterrupted[1]


def test_a_checkpoint_from_before_a_new_config_key_resumes(graph, tmp_path, uninterrupted):
    """A key added to the config since the checkpoint was written counts with its default, not as a change."""
    from lsm_gnn.training.checkpoint_files import atomic_torch_save, load_checkpoint

    Trainer(config(graph, tmp_path, "train.max_iterations=4")).fit()
    path = str(tmp_path / "ckpt" / "last.pt")
    state = load_checkpoint(path)
    del state["config"]["sampler"]["relation_fanouts"]  # as lsm-gnn wrote it before that key existed
    atomic_torch_save(state, path)
    result = Trainer(config(graph, tmp_path)).fit()
    assert stable(result["history"]) == uninterrupted[0]
    atomic_torch_save(state, path)  # the old checkpoint again: a real change is still one
    with pytest.raises(Exception, match=r"settings changed \(sampler"):
        Trainer(config(graph, tmp_path, "sampler.fanouts=[2,2]"))


# Evaluations mid-epoch and early stopping: what a resumed run must also restore (the best so far, the count of
# evaluations since it, the evaluations themselves).
SELECTING = ("train.epochs=3", "train.eval_every=2", "train.early_stopping.patience=2",
             "train.early_stopping.min_delta=0.02")


@pytest.fixture(scope="module")
def uninterrupted_selecting(graph, tmp_path_factory):
    out = tmp_path_factory.mktemp("selecting")
    result = Trainer(config(graph, out, *SELECTING)).fit()
    assert result["best"]["stopped_early"] and result["iterations"] < 15  # 3 epochs of 5 iterations
    return out, stable(result)


@pytest.mark.parametrize("where,after_calls", [
    ("train step", 3),        # between two evaluations, one iteration past the last checkpoint
    ("train step", 8),        # after the first best.pt, before the evaluation that follows
    ("evaluation", 3),        # inside a mid-epoch evaluation (val done, test not)
    ("evaluation", 7),        # inside a later one, the patience count already running
    ("checkpoint write", 2),  # inside a best.pt write (best.pt, last.pt, then best.pt again at iteration 4)
    ("checkpoint write", 5),  # later, past several writes of both
])
def test_a_resumed_run_selects_and_stops_as_an_uninterrupted_one(graph, tmp_path, monkeypatch, uninterrupted_selecting,
                                                                  where, after_calls):
    import torch

    whole, expected = uninterrupted_selecting
    run_until_crash(Trainer(config(graph, tmp_path, *SELECTING)), where, monkeypatch, after_calls)
    result = stable(Trainer(config(graph, tmp_path, *SELECTING)).fit())
    for key in ("history", "evaluations", "eval", "best", "iterations"):
        assert result[key] == expected[key], key
    assert log_records(tmp_path) == log_records(whole)
    best, best_whole = (checkpoint_module.load_checkpoint(str(d / "ckpt" / "best.pt")) for d in (tmp_path, whole))
    assert best["iterations_done"] == expected["best"]["iterations"] == best_whole["iterations_done"]
    assert all(torch.equal(best["model"][k], best_whole["model"][k]) for k in best_whole["model"])
    assert sorted(os.listdir(tmp_path / "ckpt")) == [".lsm-gnn.lock", "best.pt", "last.pt"]


# With node embeddings a better evaluation writes best.pt and a copy of the table, and leaves the run's table at
# last.pt's generation (a kill before the next last.pt rolls it back). It used to write last.pt before the epoch
# summary, so a kill there resumed into a second evaluation that counted as no improvement and stopped early.
EMBEDDING_SELECTING = ("train.epochs=3", "train.early_stopping.patience=1", "train.early_stopping.min_delta=0",
                       "model.node_embedding.dim=4", "checkpoint.every=0")


@pytest.fixture(scope="module")
def uninterrupted_embedding(graph, tmp_path_factory):
    out = tmp_path_factory.mktemp("embedding")
    result = Trainer(config(graph, out, *EMBEDDING_SELECTING)).fit()
    return out, stable(result)


@pytest.mark.slow
@pytest.mark.parametrize("where,after_calls", [
    ("checkpoint write", 1),    # the end of epoch 1's training, before its evaluation
    ("checkpoint written", 0),  # epoch 0's training checkpointed; its evaluation never ran
    ("checkpoint written", 1),  # epoch 0 selected and summarized, in place; nothing after
    ("evaluation", 1),          # epoch 1's evaluation begins
    ("evaluated", 0),           # epoch 0 evaluated, not yet selected or logged
    ("evaluated", 1),           # a better epoch 1 evaluated: the case that used to stop early
])
def test_a_sigkill_anywhere_around_an_evaluation_with_node_embeddings_selects_alike(
        graph, tmp_path, uninterrupted_embedding, where, after_calls):
    """A process killed with SIGKILL at the point, then the CLI run started again: the same history, evaluations,
    best and log lines as the uninterrupted run."""
    whole, expected = uninterrupted_embedding
    train = overrides(graph, tmp_path, *EMBEDDING_SELECTING)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    killed = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "kill_worker.py"), where, str(after_calls),
                             *train], env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = subprocess.run([sys.executable, "-m", "lsm_gnn", "train", *train, "--json", str(tmp_path / "r.json")],
                             env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    with open(tmp_path / "r.json") as fh:
        result = stable(json.load(fh))
    for key in ("history", "evaluations", "eval", "best", "iterations"):
        assert result[key] == json.loads(json.dumps(expected[key])), key
    records, whole_records = log_records(tmp_path), log_records(whole)
    if (tmp_path / "ckpt" / "last.pt").exists() and "resumed from" in resumed.stdout:
        assert records == whole_records
    else:
        assert records[-len(whole_records):] == whole_records


def test_an_epochs_training_is_checkpointed_before_its_evaluation(graph, tmp_path, monkeypatch):
    """An evaluation that fails (here a stand-in; a batch the cache refuses, a timeout) loses no training."""
    trainer = Trainer(config(graph, tmp_path, "checkpoint.every=0", "train.epochs=1"))
    run_until_crash(trainer, "evaluation", monkeypatch, 0)
    saved = checkpoint_module.load_checkpoint(str(tmp_path / "ckpt" / "last.pt"))
    assert saved["iterations_done"] == len(trainer.loader) == 5  # the whole epoch; before, no checkpoint at all
    resumed = Trainer(config(graph, tmp_path, "checkpoint.every=0", "train.epochs=1"))
    assert resumed.iterations_done == 5
    assert resumed.fit()["history"][0]["val"]["accuracy"] >= 0


def test_evaluation_batches_the_cache_cannot_hold_are_refused_before_training(graph, tmp_path):
    from lsm_gnn.config import ConfigError

    # Training batches of 40 seeds fit a 40% cache; evaluation batches of 600 seeds do not.
    args = ("sampler.batch_size=40", "train.eval_batch_size=600", "cache.capacity=40%")
    with pytest.raises(ConfigError, match=r"evaluating on val: cache.capacity=40% .* or set "
                                          r"train.eval_batch_size=(\d+) or less \(now 600\)") as refused:
        Trainer(config(graph, tmp_path, *args))
    size = refused.value.args[0].split("train.eval_batch_size=")[1].split()[0]  # the size it gives fits
    Trainer(config(graph, tmp_path, *args[:1], f"train.eval_batch_size={size}", args[2])).close()
