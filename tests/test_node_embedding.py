"""Trainable node embeddings on disk, through the write-back cache (``model.node_embedding``).

The claims: the table after training is the same, byte for byte, whatever the cache does (every policy, with
and without the victim buffer, a cache of every row, no cache at all), and equals a dense ``nn.Embedding``
trained by PyTorch's own sparse optimizer on the same gradients; every batch reads the rows as the dense
embedding held them; a run killed anywhere (in a write-back too) resumes to the same table and losses; two
ranks train one consistent table.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("torch_geometric")
# PyTorch's own sparse optimizers, the reference here, say on every step that they skip sparse checks.
pytestmark = pytest.mark.filterwarnings("ignore:Sparse invariant checks")

from lsm_gnn.config import ConfigError, load_config  # noqa: E402
from lsm_gnn.embedding import NodeEmbedding, RowLayout  # noqa: E402
from lsm_gnn.storage import EmbeddingTable  # noqa: E402
from lsm_gnn.testing import free_port  # noqa: E402
from lsm_gnn.training.trainer import Trainer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The graph fixture (conftest.py) generates this once per module: 9 batches an epoch.
GRAPH = dict(num_nodes=1500, avg_degree=6, feature_dim=8, num_classes=3, seed=2)
DIM = 8


def overrides(graph, out, *more):
    # Batches of 100 seeds reach up to ~360 distinct input nodes; the embedding cache of 60% (896 lines) evicts
    # rows, dirty ones among them.
    return [f"dataset={graph}", "model.kind=sage", "model.hidden=16", "sampler.fanouts=[2,2]",
            "sampler.batch_size=100", "cache.capacity=60%", "cache.window=4", "train.lr=0.01", "train.epochs=2",
            "train.eval_splits=[val]", "checkpoint.every=5", "log.progress=false", f"log.dir={out / 'log'}",
            f"checkpoint.dir={out / 'ckpt'}", f"model.node_embedding.dim={DIM}", "model.node_embedding.lr=0.05",
            *more]


def run(graph, out, *more) -> dict:
    return Trainer(load_config(None, overrides(graph, out, *more))).fit()


def table_bytes(out) -> np.ndarray:
    table = EmbeddingTable.open(str(out / "ckpt" / "node_embedding"))
    try:
        return table.read(torch.arange(table.num_rows)).numpy().copy()
    finally:
        table.close()


def table_layout(out) -> RowLayout:
    """The row layout of the table a run checkpointed (to decode :func:`table_bytes`' rows)."""
    table = EmbeddingTable.open(str(out / "ckpt" / "node_embedding"))
    try:
        return RowLayout.from_dict(table.layout)
    finally:
        table.close()


def losses(out) -> list[float]:
    with open(out / "log" / "metrics.jsonl") as fh:
        return [json.loads(line)["loss"] for line in fh if '"iteration"' in line]


@pytest.fixture(scope="module")
def every_row(graph, tmp_path_factory):
    """The reference run: the embedding cache holds every row, so nothing is ever written back before the end."""
    out = tmp_path_factory.mktemp("every_row")
    result = run(graph, out, "model.node_embedding.capacity=100%")
    return table_bytes(out), losses(out), result


@pytest.mark.parametrize("cache", [
    ["cache.policy=farthest"],
    ["cache.policy=hybrid"],
    ["cache.policy=rr"],
    ["cache.policy=static"],
    ["cache.pvp=true", "cache.pvp_queue_capacity=64"],
    ["cache.pvp=true", "cache.pvp_queue_capacity=64", "cache.policy=hybrid_pvp", "cache.pvp_reinstall=false"],
    ["cache.features=storage"],  # no cache: every row read from and written to the table
])
def test_the_table_is_the_same_whatever_the_cache_does(graph, tmp_path, every_row, cache):
    reference, reference_losses, _ = every_row
    result = run(graph, tmp_path, *cache)
    assert losses(tmp_path) == reference_losses
    assert np.array_equal(table_bytes(tmp_path), reference)
    if "cache.features=storage" not in cache:
        assert result["stages_s"]["write-back"] > 0  # dirty rows were evicted, not only flushed at the end


TORCH_OPTIMIZERS = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad, "adam": torch.optim.SparseAdam}


@pytest.mark.parametrize("optimizer", sorted(TORCH_OPTIMIZERS))
def test_an_epoch_equals_a_dense_embedding_trained_by_pytorchs_sparse_optimizer(graph, tmp_path, monkeypatch,
                                                                                 optimizer):
    """Every batch's rows as a dense ``nn.Embedding(sparse=True)`` holds them at that step, and the final
    table as PyTorch's sparse optimizer leaves it, given the gradients the run computed."""
    steps = []
    original = NodeEmbedding.step

    def record(self, nodes, grad):
        steps.append((nodes.clone(), grad.clone()))
        return original(self, nodes, grad)

    monkeypatch.setattr(NodeEmbedding, "step", record)
    reads = []
    monkeypatch.setattr(Trainer, "_step", lambda self, batch: (reads.append(batch.emb.detach().clone()),
                                                               Trainer._train_step(self, batch))[1])
    result = run(graph, tmp_path, "train.epochs=1", "train.eval_splits=[]",
                 f"model.node_embedding.optimizer={optimizer}")
    layout = RowLayout(DIM, "float32", optimizer)
    start = EmbeddingTable.open(str(tmp_path / "ckpt" / "node_embedding"))
    from lsm_gnn.embedding import initial_rows

    initial = layout.embeddings(torch.from_numpy(initial_rows(layout, 0, start.num_rows, seed=0, std=0.1)))
    start.close()
    dense = torch.nn.Embedding.from_pretrained(initial.clone(), freeze=False, sparse=True)
    reference = TORCH_OPTIMIZERS[optimizer](dense.parameters(), lr=0.05)
    assert len(steps) == len(reads) == result["iterations"] > 5
    for (nodes, grad), read in zip(steps, reads):
        torch.testing.assert_close(read, dense.weight.detach()[nodes], rtol=1e-5, atol=1e-6)
        reference.zero_grad()
        dense(nodes).backward(grad)
        reference.step()
    final = layout.embeddings(torch.from_numpy(table_bytes(tmp_path)))
    torch.testing.assert_close(final, dense.weight.detach(), rtol=1e-5, atol=1e-6)
    assert not torch.equal(final, initial)


class Crash(Exception):
    """Stands in for a kill: nothing after it runs."""


@pytest.mark.parametrize("where,after_calls", [
    ("train step", 7),   # after the checkpoint at iteration 5: the table has rows written back past it
    ("train step", 12),  # in the second epoch, after the end-of-epoch checkpoint
    ("write", 9),        # inside a write-back, after half of the rows reached the file (a torn write)
])
def test_a_killed_run_resumes_to_the_same_table(graph, tmp_path, every_row, monkeypatch, where, after_calls):
    reference, reference_losses, _ = every_row
    calls = {"n": 0}
    trainer = Trainer(load_config(None, overrides(graph, tmp_path)))
    if where == "train step":
        original = trainer._step

        def step(batch):
            calls["n"] += 1
            if calls["n"] > after_calls:
                raise Crash(where)
            return original(batch)

        monkeypatch.setattr(trainer, "_step", step)
    else:
        original = EmbeddingTable.write

        def write(self, ids, rows):
            calls["n"] += 1
            if calls["n"] > after_calls:  # half of the rows land, then the process "dies"
                half = max(1, len(ids) // 2)
                original(self, ids[:half], rows[:half])
                raise Crash(where)
            return original(self, ids, rows)

        monkeypatch.setattr(EmbeddingTable, "write", write)
    with pytest.raises(Crash):
        trainer.fit()
    monkeypatch.undo()
    resumed = Trainer(load_config(None, overrides(graph, tmp_path)))
    assert resumed.resumed_from is not None
    resumed.fit()
    assert losses(tmp_path) == reference_losses
    assert np.array_equal(table_bytes(tmp_path), reference)


def test_float16_tables_are_the_same_whatever_the_cache_does(graph, tmp_path):
    run(graph, tmp_path / "all", "model.node_embedding.dtype=float16", "model.node_embedding.capacity=100%",
        "train.epochs=1")
    run(graph, tmp_path / "some", "model.node_embedding.dtype=float16", "cache.pvp=true", "train.epochs=1")
    assert np.array_equal(table_bytes(tmp_path / "all"), table_bytes(tmp_path / "some"))
    assert losses(tmp_path / "all") == losses(tmp_path / "some")


def test_a_fresh_run_never_trains_a_trained_table_again(graph, tmp_path, every_row):
    run(graph, tmp_path, "train.epochs=1", "train.eval_splits=[]")
    with pytest.raises(ConfigError, match="was trained already"):
        run(graph, tmp_path, "train.epochs=1", "checkpoint.resume=false")
    with pytest.raises(ConfigError, match="this run asks for"):
        run(graph, tmp_path, "model.node_embedding.dim=4", "checkpoint.resume=false",
            f"model.node_embedding.path={tmp_path / 'ckpt' / 'node_embedding'}")


def test_embeddings_alone_and_in_link_prediction(tmp_path):
    """Without input features the model reads only the embeddings; a user-item graph trains with them too."""
    from lsm_gnn.data.bipartite import generate_bipartite

    ds = tmp_path / "ui"
    generate_bipartite(ds, num_users=300, num_items=200, avg_interactions=8, feature_dim=4, seed=0,
                       progress=False)
    link = [f"dataset={ds}", "train.task=link", "model.kind=sage", "model.hidden=16", "sampler.fanouts=[3,2]",
            "sampler.batch_size=256", "log.progress=false", f"model.node_embedding.dim={DIM}",
            "train.eval_splits=[test]", "model.node_embedding.features=false"]
    # the table's default cache holds what a batch can read (the features' 1.5% would be 7 lines)
    result = Trainer(load_config(None, [*link, "train.epochs=2", "model.node_embedding.lr=0.1",
                                        f"checkpoint.dir={tmp_path / 'ck'}"])).fit()
    assert result["eval"]["test"]["recall@20"] > 0
    assert result["stages_s"]["update"] > 0


@pytest.mark.slow
def test_two_ranks_train_one_table_whatever_the_cache_does(graph, tmp_path):
    """Over 2 gloo ranks the owner of each row applies both ranks' gradients: a shared cache too small for the
    table, with the victim buffer, ends with the table and losses of one that holds every row."""
    def launch(name, *more):
        out = tmp_path / name
        env = dict(os.environ, NPROC="2", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1",
                   LSM_GNN_TIMEOUT_S="120", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        done = subprocess.run(["bash", os.path.join(ROOT, "launch", "torchrun.sh"), *overrides(graph, out, *more)],
                              env=env, capture_output=True, text=True, timeout=400, cwd=ROOT)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return table_bytes(out), losses(out)

    full_table, full_losses = launch("full", "model.node_embedding.capacity=100%", "cache.capacity=100%")
    small_table, small_losses = launch("small", "model.node_embedding.capacity=35%", "cache.pvp=true",
                                       "cache.pvp_queue_capacity=64")
    assert small_losses == full_losses
    assert np.array_equal(small_table, full_table)


@pytest.mark.slow
def test_two_ranks_equal_a_dense_embedding_given_both_ranks_gradients(graph, tmp_path):
    """The table two ranks trained equals a dense ``nn.Embedding`` stepped by ``torch.optim.Adagrad`` with the
    average of the two ranks' gradients each iteration (what DDP does to a dense parameter)."""
    out = tmp_path / "run"
    out.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1", LSM_GNN_TIMEOUT_S="120",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_port", str(free_port()), os.path.join(ROOT, "tests", "embedding_worker.py"),
                           str(out), *overrides(graph, out, "model.node_embedding.capacity=35%", "train.epochs=1")],
                          env=env, capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [np.load(out / f"steps{r}.npz") for r in range(2)]
    count = int(ranks[0]["count"])
    assert count == int(ranks[1]["count"]) > 3
    layout = RowLayout(DIM, "float32", "adagrad")
    num_nodes = GRAPH["num_nodes"]
    from lsm_gnn.embedding import initial_rows

    initial = layout.embeddings(torch.from_numpy(initial_rows(layout, 0, num_nodes, seed=0, std=0.1)))
    dense = torch.nn.Embedding.from_pretrained(initial.clone(), freeze=False, sparse=True)
    optimizer = torch.optim.Adagrad(dense.parameters(), lr=0.05)
    for t in range(count):
        optimizer.zero_grad()
        loss = sum((dense(torch.from_numpy(r[f"nodes{t}"])) * torch.from_numpy(r[f"grad{t}"])).sum() for r in ranks)
        (loss / 2).backward()
        optimizer.step()
    final = layout.embeddings(torch.from_numpy(table_bytes(out)))
    torch.testing.assert_close(final, dense.weight.detach(), rtol=1e-5, atol=1e-6)


def test_prepare_embedding_makes_a_table_a_run_trains(graph, tmp_path, capsys):
    from lsm_gnn.cli import main

    table = tmp_path / "emb"
    assert main(["prepare", "embedding", graph, "--out", str(table), "--dim", "4", "--optimizer", "adam",
                 "--no-progress"]) == 0
    assert "model.node_embedding.path=" in capsys.readouterr().out
    opened = EmbeddingTable.open(str(table))
    assert RowLayout.from_dict(opened.layout) == RowLayout(4, "float32", "adam") and opened.generation == 0
    opened.close()
    assert main(["prepare", "embedding", graph, "--out", str(table), "--dim", "4", "--no-progress"]) == 1
    assert "exists" in capsys.readouterr().err
    run(graph, tmp_path, "model.node_embedding.dim=4", "model.node_embedding.optimizer=adam",
        f"model.node_embedding.path={table}", "train.epochs=1", "train.eval_splits=[]")
    assert EmbeddingTable.open(str(table)).generation > 0


@pytest.mark.parametrize("more,message", [
    (["model.node_embedding.dim=0", "model.node_embedding.features=false"], "leaves the model no input"),
    (["checkpoint.dir="], "needs a directory for its table"),
    (["train.eval_mode=full"], "does not read node embeddings"),
    (["model.node_embedding.capacity=lots"], "model.node_embedding.capacity"),
])
def test_settings_that_cannot_work_are_refused_before_any_work(graph, tmp_path, more, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides(graph, tmp_path, *more))


def test_several_ranks_need_one_writer_per_row(graph, tmp_path):
    from lsm_gnn.build import build_node_embedding, resolve
    from lsm_gnn.data import open_dataset

    cfg = load_config(None, overrides(graph, tmp_path, "cache.mode=isolated"))
    dataset = open_dataset(graph)
    with pytest.raises(ConfigError, match="cache.mode=shared"):
        build_node_embedding(resolve(cfg, dataset, 2), cfg, dataset, dataset.node_types[0], torch.device("cpu"),
                             world_size=2)


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_from_the_cli(graph, tmp_path, every_row):
    """A real kill (SIGKILL, while rows are being written back between checkpoints); the CLI run started again
    rolls the table back to the checkpoint and ends with the uninterrupted run's table and losses."""
    import signal
    import time

    reference, reference_losses, _ = every_row
    args = [sys.executable, "-m", "lsm_gnn", "train", *overrides(graph, tmp_path)]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "log" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and sum(1 for line in open(metrics) if '"iteration"' in line) >= 7:
            break
        time.sleep(0.01)
    if proc.poll() is not None:
        pytest.skip("the run finished before it could be killed")  # the in-process crashes above cover it
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resumed from" in done.stdout
    assert losses(tmp_path) == reference_losses
    assert np.array_equal(table_bytes(tmp_path), reference)


@pytest.mark.slow
def test_two_ranks_killed_anywhere_resume_to_the_uninterrupted_losses_and_table(graph, tmp_path):
    """SIGKILL to both ranks at two points, then the same command again: the losses of every iteration and the
    table's bytes equal a 2-rank run never stopped. (Every rank's generators are checkpointed: each draws its
    own dropout masks; restoring rank 0's on both ranks changed the losses from the step after the resume.)"""
    import signal
    import time

    env = dict(os.environ, OMP_NUM_THREADS="1", LSM_GNN_TIMEOUT_S="120",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    more = ("model.dropout=0.3", "model.node_embedding.capacity=35%", "checkpoint.every=3")

    def start(out):
        return subprocess.Popen(["bash", os.path.join(ROOT, "launch", "torchrun.sh"), *overrides(graph, out, *more)],
                                env=dict(env, MASTER_PORT=str(free_port())), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd=ROOT)

    def finish(proc):
        out, _ = proc.communicate(timeout=400)
        assert proc.returncode == 0, out[-3000:]
        return out

    finish(start(tmp_path / "whole"))
    for kill_after in (4, 8):
        out = tmp_path / f"killed{kill_after}"
        proc = start(out)
        metrics, deadline = out / "log" / "metrics.jsonl", time.time() + 300
        while proc.poll() is None and time.time() < deadline:
            if metrics.exists() and sum('"iteration"' in line for line in open(metrics)) >= kill_after:
                break
            time.sleep(0.005)
        # Every process of the run (torchrun's workers are not in its process group): as a node failure would.
        subprocess.run(["pkill", "-KILL", "-f", f"checkpoint.dir={out / 'ckpt'}"])
        proc.communicate(timeout=60)
        assert "resumed from" in finish(start(out))
        assert losses(out) == losses(tmp_path / "whole"), kill_after
        assert np.array_equal(table_bytes(out), table_bytes(tmp_path / "whole")), kill_after


def test_a_training_read_waits_for_the_step_of_the_batch_before(tmp_path):
    """The embedding keeps its own order: a second training read waits until the first read's batch was
    stepped, sees the stepped rows, and is given up when the loader stops; an evaluation's read never waits."""
    import threading

    from lsm_gnn.embedding import RowOptimizer, open_table

    layout = RowLayout(4, "float32", "sgd")
    table = open_table(str(tmp_path / "t"), layout, 10, seed=0, init_std=0.1)
    emb = NodeEmbedding(table, layout, RowOptimizer(layout, 0.5), table=table)
    nodes = torch.tensor([1, 3])
    first, _, _ = emb.read(nodes, training=True)
    done = []
    waiting = threading.Thread(target=lambda: done.append(emb.read(nodes, training=True)))
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive() and not done, "a training read must wait for the step of the batch before"
    assert torch.equal(emb.read(nodes)[0], first)  # an evaluation's read goes at once
    emb.step(nodes, torch.ones(2, 4))
    waiting.join(5)
    assert not waiting.is_alive() and torch.allclose(done[0][0], first - 0.5)  # read after the step
    stop = threading.Event()
    stop.set()
    assert emb.read(nodes, training=True, stop=stop) is None  # its batch was never stepped: this one waits
    emb.settle()  # the loader stopped: the batch read ahead will not be stepped
    assert emb.read(nodes, training=True, stop=stop) is not None
    emb.close()
