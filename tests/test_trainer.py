"""The trainer: learns, logs, checkpoints atomically, resumes exactly, runs under 1-rank DDP."""
import json
import os
import threading

import pytest
import torch

pytest.importorskip("torch_geometric")

from lsm_gnn.cli import main as cli  # noqa: E402
from lsm_gnn.config import ConfigError, load_config  # noqa: E402
from lsm_gnn.training.trainer import Trainer, atomic_torch_save, load_checkpoint, train  # noqa: E402


# The graph fixture (conftest.py) generates this once per module.
GRAPH = dict(num_nodes=3000, avg_degree=8, feature_dim=16, num_classes=4, seed=1)


def config(graph, tmp_path, *overrides):
    return load_config(None, [f"dataset={graph}", "model.kind=sage", "model.hidden=32", "sampler.fanouts=[8, 4]",
                              "sampler.batch_size=128", "cache.capacity=40%", "cache.window=8", "train.lr=0.01",
                              f"log.dir={tmp_path / 'log'}", f"checkpoint.dir={tmp_path / 'ckpt'}",
                              "log.progress=false", *overrides])


def losses(tmp_path):
    with open(tmp_path / "log" / "metrics.jsonl") as fh:
        records = [json.loads(line) for line in fh]
    return {r["iteration"]: r["loss"] for r in records if "iteration" in r}


@pytest.mark.parametrize("kind", ["sage", "gat", "gcn"])
def test_every_model_learns_well_above_chance(graph, tmp_path, kind):
    result = train(config(graph, tmp_path, f"model.kind={kind}", "train.epochs=3"))
    assert result["eval"]["test"]["accuracy"] > 0.6  # 4 classes: chance is 0.25
    assert result["eval"]["test"]["count"] == 600


def test_metrics_log_every_stage_and_the_cache(graph, tmp_path):
    result = train(config(graph, tmp_path, "train.epochs=1"))
    with open(tmp_path / "log" / "metrics.jsonl") as fh:
        records = [json.loads(line) for line in fh]
    steps = [r for r in records if "iteration" in r]
    assert [r["iteration"] for r in steps] == list(range(result["iterations"]))
    assert all(set(r["time"]) == {"sample", "gather", "exchange", "wait", "train"} for r in steps)
    assert all(r["time"]["exchange"] == 0 for r in steps)  # one process: nothing to exchange
    assert all(r["time"]["gather"] > 0 and r["time"]["train"] > 0 for r in steps)
    assert steps[0]["hit_ratio"] == 0.0 and steps[0]["bytes_read"] > 0  # cold cache
    assert max(r["hit_ratio"] for r in steps) > 0.2
    epoch = [r["epoch_summary"] for r in records if "epoch_summary" in r]
    assert len(epoch) == 1 and epoch[0]["complete"] and "val" in epoch[0] and "test" in epoch[0]
    assert epoch[0]["bytes_read"] == sum(r["bytes_read"] for r in steps)
    # The pipeline's bound from the epoch's own counters: the storage's busy time and the training step's.
    e = epoch[0]
    assert e["read_s"] > 0 and e["train_s"] == pytest.approx(e["stages_s"]["train"] + e["stages_s"]["update"])
    assert e["bound_s"] == max(e["read_s"], e["train_s"])
    assert e["pipeline_efficiency"] == pytest.approx(e["bound_s"] / e["wall_s"]) and 0 < e["pipeline_efficiency"] <= 1


def test_resume_continues_with_the_same_losses(graph, tmp_path):
    # Dropout draws from torch's RNG and the loader shuffles per epoch: both must be restored.
    common = ("train.epochs=2", "model.dropout=0.5")
    whole = tmp_path / "whole"
    train(config(graph, whole, *common))
    expected = losses(whole)
    parts = tmp_path / "parts"
    first = train(config(graph, parts, *common, "train.max_iterations=7"))  # stops inside epoch 0
    assert first["iterations"] == 7
    state = load_checkpoint(str(parts / "ckpt" / "last.pt"))
    assert (state["loader"]["epoch"], state["loader"]["position"]) == (0, 7)
    trainer = Trainer(config(graph, parts, *common))
    assert trainer.resumed_from is not None
    trainer.fit()
    got = losses(parts)
    assert sorted(got) == sorted(expected)
    assert all(got[i] == expected[i] for i in expected), "a resumed run must compute the very same losses"


def test_resume_refuses_changed_settings(graph, tmp_path):
    train(config(graph, tmp_path, "train.max_iterations=2"))
    with pytest.raises(ConfigError, match="model.*saved"):
        Trainer(config(graph, tmp_path, "model.hidden=16"))
    Trainer(config(graph, tmp_path, "model.hidden=16", "checkpoint.resume=false")).loader.close()


def test_one_rank_ddp_matches_a_plain_process(graph, tmp_path):
    import torch.distributed as dist

    plain = tmp_path / "plain"
    train(config(graph, plain, "train.max_iterations=6", "train.eval_splits=[]"))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        trainer = Trainer(config(graph, tmp_path / "ddp", "train.max_iterations=6", "train.eval_splits=[]"))
        assert isinstance(trainer.model, torch.nn.parallel.DistributedDataParallel)
        trainer.fit()
    finally:
        dist.destroy_process_group()
    assert losses(tmp_path / "ddp") == losses(plain)


def test_an_exception_in_training_leaves_no_thread(graph, tmp_path):
    trainer = Trainer(config(graph, tmp_path))

    def broken(model, batch):
        raise RuntimeError("boom")

    trainer.task.loss = broken
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit()
    assert [t for t in threading.enumerate() if t.name == "lsm-gnn-loader"] == []


def test_checkpoint_writes_are_atomic(tmp_path):
    path = str(tmp_path / "last.pt")
    atomic_torch_save({"format": "x", "n": 1}, path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("cannot pickle")

    with pytest.raises(RuntimeError, match="cannot pickle"):
        atomic_torch_save({"n": 2, "bad": Unpicklable()}, path)
    assert load_checkpoint(path)["n"] == 1  # the old checkpoint survives a failed write
    assert os.listdir(tmp_path) == ["last.pt"]  # and no temporary file is left behind
    torch.save({"n": 1}, path)
    with pytest.raises(ValueError, match="not an lsm-gnn checkpoint"):
        load_checkpoint(path)
    (tmp_path / "junk.pt").write_bytes(b"junk")
    with pytest.raises(ValueError, match="not a readable"):
        load_checkpoint(str(tmp_path / "junk.pt"))


def test_clear_errors_for_bad_runs(graph, tmp_path):
    with pytest.raises(ConfigError, match="no dataset"):
        Trainer(load_config())
    with pytest.raises(ConfigError, match="static_score"):
        Trainer(config(graph, tmp_path, "cache.static_score=betweenness"))


def test_cli_train_and_inspect(graph, tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  kind: gcn\n  hidden: 32\nsampler:\n  fanouts: [8, 4]\n  batch_size: 128\n"
                    "cache:\n  capacity: 40%\n  window: 8\ntrain:\n  max_iterations: 5\nlog:\n  progress: false\n")
    ckpt = tmp_path / "ck"
    assert cli(["train", str(path), f"dataset={graph}", f"checkpoint.dir={ckpt}", "cache.policy=rr"]) == 0
    out = capsys.readouterr().out
    assert "rr cache" in out and "per-stage time" in out and "gather" in out
    assert cli(["inspect", str(ckpt / "last.pt")]) == 0
    out = capsys.readouterr().out
    assert "gcn hidden 32" in out and "5 iterations" in out
    assert cli(["train", str(path), f"dataset={graph}", "cache.policy=nope"]) == 1
    assert "choose one of" in capsys.readouterr().err


def test_feature_paths_agree(graph, tmp_path):
    """The same run through the cache, plain storage and RAM computes the same losses."""
    runs = {}
    for features in ("cache", "storage", "memory"):
        out = tmp_path / features
        train(config(graph, out, f"cache.features={features}", "train.max_iterations=4", "train.eval_splits=[]"))
        runs[features] = losses(out)
    assert runs["cache"] == runs["storage"] == runs["memory"]


def test_read_ahead_changes_no_loss_and_no_hit(graph, tmp_path):
    """Reading the next batches' misses ahead changes where their bytes come from, not the run: the same losses
    and hits, iteration by iteration, with read-ahead off and on (the default over io_uring)."""
    common = ("cache.backend=io_uring", "train.max_iterations=12", "train.eval_splits=[]")
    train(config(graph, tmp_path / "off", *common, "cache.read_ahead=0"))
    trainer = Trainer(config(graph, tmp_path / "on", *common))
    assert trainer.features.only.read_ahead is not None  # on by default from a disk
    trainer.fit()
    assert losses(tmp_path / "on") == losses(tmp_path / "off")
    hits = [[r["hit_ratio"] for r in records(tmp_path / run) if "iteration" in r] for run in ("on", "off")]
    assert hits[0] == hits[1]
    assert trainer.features.only.read_ahead.stats.used > 0


def test_train_threads_hold_for_the_run_and_are_set_back(graph, tmp_path):
    before = torch.get_num_threads()
    seen = []
    with Trainer(config(graph, tmp_path, "train.threads=1", "train.max_iterations=2", "train.eval_splits=[]")) as t:
        seen.append(torch.get_num_threads())
        t.fit()
        seen.append(torch.get_num_threads())
    assert seen == [1, 1] and torch.get_num_threads() == before
    with Trainer(config(graph, tmp_path / "auto", "train.max_iterations=1", "train.eval_splits=[]")):
        assert torch.get_num_threads() == max(1, before - 1)  # auto: a core left to the loader's thread
    assert torch.get_num_threads() == before
    with pytest.raises(ConfigError, match="train.threads"):
        config(graph, tmp_path, "train.threads=-1")


def records(tmp_path):
    with open(tmp_path / "log" / "metrics.jsonl") as fh:
        return [json.loads(line) for line in fh]


def test_victim_buffer_adds_hits_and_changes_no_loss(graph, tmp_path):
    # Read-ahead off: over a run cut at 12 iterations, what it had read for the batches after depends on timing.
    common = ("cache.policy=hybrid", "train.max_iterations=12", "train.eval_splits=[]", "cache.read_ahead=0")
    train(config(graph, tmp_path / "plain", *common))
    trainer = Trainer(config(graph, tmp_path / "pvp", *common, "cache.pvp=true", "cache.pvp_queue_capacity=64"))
    assert trainer.features.only.pvp is not None and trainer.features.only.pvp_reinstall  # reinstall: the config default
    trainer.fit()
    assert losses(tmp_path / "pvp") == losses(tmp_path / "plain")  # PVP rows are the file's bytes
    plain, pvp = records(tmp_path / "plain"), records(tmp_path / "pvp")
    steps = [r for r in pvp if "iteration" in r]
    summary = [r["epoch_summary"] for r in pvp if "epoch_summary" in r][0]
    assert summary["pvp_hits"] == sum(r["pvp_hits"] for r in steps) > 0
    assert summary["bytes_saved"] == summary["pvp_hits"] * trainer.features.only.storage.row_bytes
    # Reinstalling under plain hybrid, the cache decides as without PVP: PVP can only add hits.
    plain_summary = [r["epoch_summary"] for r in plain if "epoch_summary" in r][0]
    assert summary["hit_ratio"] > plain_summary["hit_ratio"]
    assert summary["bytes_read"] < plain_summary["bytes_read"]


def test_the_default_policy_is_farthest_with_and_without_pvp(graph, tmp_path):
    assert Trainer(config(graph, tmp_path / "a", "cache.pvp=true")).features.only.policy.name == "farthest"
    assert Trainer(config(graph, tmp_path / "b")).features.only.policy.name == "farthest"


def test_tensorboard_is_optional(graph, tmp_path):
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="pip install tensorboard"):
            Trainer(config(graph, tmp_path, "log.tensorboard=true"))
        return
    train(config(graph, tmp_path, "log.tensorboard=true", "train.max_iterations=3", "train.eval_splits=[]"))
    assert os.listdir(tmp_path / "log" / "tensorboard")
