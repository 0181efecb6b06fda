"""lsm-gnn evaluate and export: a trained model back from its checkpoint, measured on a split or written out."""
import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lsm_gnn.cli import main
from lsm_gnn.data.bipartite import generate_bipartite
from lsm_gnn.testing import write_tiny_dataset

pytest.importorskip("torch_geometric")


@pytest.fixture(scope="module")
def link_run(tmp_path_factory):
    """A short link-prediction run with checkpoints: (dataset, run folder, its result)."""
    tmp = tmp_path_factory.mktemp("eval")
    ds = generate_bipartite(tmp / "g", num_users=300, num_items=200, avg_interactions=12, feature_dim=8, seed=0,
                            val_fraction=0.1, progress=False)
    out = tmp / "run"
    assert main(["train", f"dataset={ds.path}", "train.task=link", "model.kind=sage", "model.hidden=16",
                 "sampler.fanouts=[4,3]", "sampler.batch_size=256", "cache.features=memory", "train.epochs=2",
                 f"checkpoint.dir={out / 'ck'}", f"log.dir={out / 'log'}", "log.progress=false",
                 "--json", str(out / "result.json")]) == 0
    return ds, out, json.loads((out / "result.json").read_text())


def test_evaluate_gives_the_runs_own_metrics_and_writes_nothing(link_run, tmp_path, capsys):
    ds, out, result = link_run
    log = (out / "log" / "metrics.jsonl").read_text()
    assert main(["evaluate", str(out / "ck" / "last.pt"), "--split", "test", "--json", str(tmp_path / "e.json")]) == 0
    measured = json.loads((tmp_path / "e.json").read_text())
    assert measured["test"] == pytest.approx(result["eval"]["test"])  # the run's last evaluation, again
    assert "test: recall@20" in capsys.readouterr().out
    assert (out / "log" / "metrics.jsonl").read_text() == log  # nothing logged, nothing truncated
    assert main(["evaluate", str(out / "ck" / "last.pt"), "--split", "train"]) == 1
    assert "no ['train'] split" in capsys.readouterr().err


def test_export_writes_embeddings_and_each_users_top_items_it_never_met(link_run, tmp_path):
    ds, out, _ = link_run
    assert main(["export", str(out / "ck" / "last.pt"), "--out", str(tmp_path / "x"), "--top-k", "5"]) == 0
    emb = np.load(tmp_path / "x" / "embeddings.npy")
    assert emb.shape == (ds.num_nodes, 16) and np.isfinite(emb).all()
    top = np.load(tmp_path / "x" / "top_k.npy")
    assert top.shape == (300, 5) and top.min() >= 0 and top.max() < 200
    # the best items by the exported embeddings, known ones (training and held out) left out
    indptr, indices = np.asarray(ds.indptr), np.asarray(ds.indices)
    u = 7
    known = {int(i) - 300 for i in indices[indptr[u]:indptr[u + 1]]}
    for name in ds.edge_split_names:
        pairs = np.asarray(ds.edge_split(name))
        known |= {int(i) - 300 for i in pairs[pairs[:, 0] == u, 1]}
    scores = torch.from_numpy(emb[300:] @ emb[u])
    scores[list(known)] = -float("inf")
    assert top[u].tolist() == scores.topk(5).indices.tolist() and not known & set(top[u].tolist())


def test_top_k_equals_a_brute_force_ranking_of_every_user_across_score_blocks(link_run, tmp_path, monkeypatch):
    import lsm_gnn.tasks.link_prediction

    ds, out, _ = link_run
    monkeypatch.setattr(lsm_gnn.tasks.link_prediction, "SCORE_CHUNK", 200 * 7)  # blocks of 7 users: 43 of them
    for k in (5, 195):  # 195: more than any user's candidates, the rest padded with -1
        assert main(["export", str(out / "ck" / "last.pt"), "--out", str(tmp_path / f"k{k}"), "--top-k", str(k)]) == 0
    emb = np.load(tmp_path / "k5" / "embeddings.npy")
    top5, top195 = np.load(tmp_path / "k5" / "top_k.npy"), np.load(tmp_path / "k195" / "top_k.npy")
    indptr, indices = np.asarray(ds.indptr), np.asarray(ds.indices)
    held = np.concatenate([np.asarray(ds.edge_split(name)) for name in ds.edge_split_names])
    for u in range(300):
        known = {int(i) - 300 for i in indices[indptr[u]:indptr[u + 1]] if i >= 300}
        known |= {int(i) - 300 for i in held[held[:, 0] == u, 1]}
        candidates = sorted(set(range(200)) - known)
        scores = torch.from_numpy(emb[300:] @ emb[u])
        scores[list(known)] = -float("inf")
        assert top5[u].tolist() == scores.topk(5).indices.tolist(), u
        ranked = top195[u][top195[u] >= 0]
        assert ranked.size == min(195, len(candidates)) and (top195[u][ranked.size:] == -1).all(), u
        assert set(ranked.tolist()) <= set(candidates) and len(set(ranked.tolist())) == ranked.size, u
        assert (np.diff(scores[ranked].numpy()) <= 1e-5).all(), u  # best first
        left = sorted(set(candidates) - set(ranked.tolist()))
        assert not left or scores[left].max() <= scores[ranked].min() + 1e-5, u  # none better left out
    assert (top195 == -1).any() and (top195 >= 0).all(axis=1).any()  # both cases met


def test_export_refuses_a_node_classification_checkpoint(tmp_path, capsys):
    ds, _ = write_tiny_dataset(tmp_path / "ds", num_nodes=300)
    assert main(["train", f"dataset={ds.path}", "model.kind=sage", "model.hidden=8", "sampler.fanouts=[3]",
                 "sampler.batch_size=64", "cache.features=memory", "train.epochs=1", f"checkpoint.dir={tmp_path / 'c'}",
                 "log.progress=false"]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "c" / "last.pt")]) == 0
    assert "val: accuracy" in capsys.readouterr().out
    assert main(["export", str(tmp_path / "c" / "last.pt"), "--out", str(tmp_path / "x")]) == 1
    assert "train.task=link" in capsys.readouterr().err


def test_a_model_with_node_embeddings_is_evaluated_on_the_table_its_checkpoint_left(link_run, tmp_path, capsys):
    ds = link_run[0]
    out = tmp_path / "emb"
    assert main(["train", f"dataset={ds.path}", "train.task=link", "model.kind=sage", "model.hidden=8",
                 "model.node_embedding.dim=8", "sampler.fanouts=[3]", "sampler.batch_size=256",
                 "cache.features=memory", "train.epochs=2", f"checkpoint.dir={out / 'ck'}", "log.progress=false",
                 "--json", str(out / "r.json")]) == 0
    ran = json.loads((out / "r.json").read_text())["eval"]["test"]
    assert main(["evaluate", str(out / "ck" / "last.pt"), "--split", "test", "--json", str(out / "e.json")]) == 0
    assert json.loads((out / "e.json").read_text())["test"] == pytest.approx(ran)
    with held_by_another_process(out / "ck" / "node_embedding"):  # the run's live table, as while it trains
        assert main(["evaluate", str(out / "ck" / "last.pt")]) == 1
    assert "live node embedding table, which a run is training (pid" in capsys.readouterr().err


def test_best_pt_with_node_embeddings_keeps_its_table_and_evaluates_as_selected(link_run, tmp_path):
    """The selected model of a run with node embeddings is recoverable: best.pt's own copy of the table."""
    ds = link_run[0]
    out = tmp_path / "best"
    assert main(["train", f"dataset={ds.path}", "train.task=link", "model.kind=sage", "model.hidden=8",
                 "model.node_embedding.dim=8", "sampler.fanouts=[3]", "sampler.batch_size=128", "train.lr=0.02",
                 "cache.features=memory", "train.epochs=4", "train.eval_splits=[val,test]",
                 f"checkpoint.dir={out / 'ck'}", "log.progress=false", "--json", str(out / "r.json")]) == 0
    best = json.loads((out / "r.json").read_text())["best"]
    copies = sorted(p.name for p in (out / "ck").iterdir() if p.name.startswith("best_node_embedding.g"))
    assert best["checkpoint"].endswith("best.pt") and len(copies) == 1  # earlier bests' copies are gone
    assert main(["evaluate", str(out / "ck" / "best.pt"), "--json", str(out / "e.json")]) == 0
    again = json.loads((out / "e.json").read_text())
    assert again["val"] == pytest.approx(best["eval"]["val"]) and again["test"] == pytest.approx(best["eval"]["test"])
    assert main(["evaluate", str(out / "ck" / "best.pt"), "checkpoint.best_table=false"]) == 0  # reads it all the same


def test_export_replaces_only_files_an_export_wrote(link_run, tmp_path, capsys):
    """A second export replaces the first's files; a user's file, or one edited since, is left as it is."""
    _, out, _ = link_run
    export = ["export", str(out / "ck" / "last.pt"), "--out", str(tmp_path / "x")]
    assert main(export) == 0
    assert main(export + ["--top-k", "3"]) == 0  # its own embeddings.npy replaced, top_k files added
    assert main(export) == 0  # the record still lists top_k.npy as written
    assert main(export + ["--top-k", "3"]) == 0
    capsys.readouterr()
    np.save(tmp_path / "x" / "top_k.npy", np.zeros(3))  # the user's own now
    assert main(export + ["--top-k", "3"]) == 1
    assert "top_k.npy exists and is not a file lsm-gnn wrote there" in capsys.readouterr().err
    assert np.load(tmp_path / "x" / "top_k.npy").shape == (3,)


@pytest.mark.parametrize("setup,args,message", [
    (lambda d: (d.mkdir(), np.save(d / "embeddings.npy", np.ones(2))), [],
     "x/embeddings.npy exists and is not a file lsm-gnn wrote there.*delete that file first"),
    (lambda d: (d.mkdir(), (d / "top_k.csv").write_text("mine")), ["--top-k", "2"], "top_k.csv exists and is not"),
    (lambda d: (d.mkdir(), (d / "export.json").write_text("{}")), [], "export.json exists and was not written by"),
    (lambda d: d.write_text("a file"), [], "--out .*x is a file, not a directory"),
])
def test_export_refuses_a_foreign_output_before_loading_anything(tmp_path, capsys, setup, args, message):
    setup(tmp_path / "x")
    before = {p.name: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    # the checkpoint does not exist: the output is refused first
    assert main(["export", str(tmp_path / "none.pt"), "--out", str(tmp_path / "x"), *args]) == 1
    assert re.search(message, capsys.readouterr().err)
    assert {p.name: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_evaluate_takes_a_copy_of_the_dataset_and_refuses_another(link_run, tmp_path, capsys):
    """dataset=COPY (the help's own example): same files, same checksums, so the same metrics; a dataset of other
    contents is refused naming both."""
    import shutil

    ds, out, result = link_run
    shutil.copytree(ds.path, tmp_path / "copy")
    ckpt = str(out / "ck" / "last.pt")
    assert main(["evaluate", ckpt, f"dataset={tmp_path / 'copy'}", "--split", "test", "--json",
                 str(tmp_path / "e.json")]) == 0
    assert json.loads((tmp_path / "e.json").read_text())["test"] == pytest.approx(result["eval"]["test"])
    # checksums recorded anew over the same bytes (the block sums get a new file name): still the same dataset
    assert main(["prepare", "checksums", str(tmp_path / "copy")]) == 0
    assert main(["evaluate", ckpt, f"dataset={tmp_path / 'copy'}", "--split", "test"]) == 0
    # a checkpoint from before the dataset's checksums were recorded: compared with the dataset still at its path
    from lsm_gnn.training.checkpoint_files import atomic_torch_save, load_checkpoint

    state = load_checkpoint(ckpt)
    del state["dataset_checksums"]
    atomic_torch_save(state, str(tmp_path / "older.pt"))
    assert main(["evaluate", str(tmp_path / "older.pt"), f"dataset={tmp_path / 'copy'}", "--split", "test"]) == 0
    other = generate_bipartite(tmp_path / "other", num_users=300, num_items=200, avg_interactions=12, feature_dim=8,
                               seed=1, val_fraction=0.1, progress=False)
    capsys.readouterr()
    assert main(["evaluate", ckpt, f"dataset={other.path}"]) == 1
    err = capsys.readouterr().err
    assert f"was trained on dataset {ds.path}; dataset={other.path} is not the same dataset" in err
    assert "checkpoint.resume=false" not in err


@contextlib.contextmanager
def held_by_another_process(directory):
    """``directory``'s run lock held by a child process, as a run training there holds it."""
    root = str(Path(__file__).resolve().parents[1])
    holder = subprocess.Popen([sys.executable, "-c", "from lsm_gnn.utils.fileio import RunLock\nimport time\n"
                               f"lock = RunLock({str(directory)!r}, 'checkpoint.dir')\nprint('held', flush=True)\n"
                               "time.sleep(60)"], cwd=root, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": root})
    try:
        assert holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.kill()
        holder.wait()


def test_evaluate_reads_a_best_checkpoint_while_its_run_holds_the_directory(link_run, capsys):
    """A run still training holds checkpoint.dir's lock; evaluate writes nothing there, so it takes none."""
    _, out, _ = link_run
    with held_by_another_process(out / "ck"):
        assert main(["evaluate", str(out / "ck" / "best.pt"), "--split", "test"]) == 0, capsys.readouterr().err


def test_evaluate_takes_overrides_of_training_settings_and_refuses_other_weights(link_run, tmp_path, capsys):
    """Overrides that shape training or speed only are taken (as the help says); the model's own are refused with
    the override to drop, not the resume advice."""
    _, out, result = link_run
    ckpt = str(out / "ck" / "last.pt")
    assert main(["evaluate", ckpt, "train.lr=0.5", "train.weight_decay=0.1", "--split", "test", "--json",
                 str(tmp_path / "e.json")]) == 0
    assert json.loads((tmp_path / "e.json").read_text())["test"] == pytest.approx(result["eval"]["test"])
    # another seed and batch size draw other evaluation samples: taken, if not the same figures
    assert main(["evaluate", ckpt, "sampler.batch_size=64", "train.seed=3", "--split", "test"]) == 0
    capsys.readouterr()
    assert main(["evaluate", ckpt, "model.hidden=8"]) == 1
    err = capsys.readouterr().err
    assert "cannot evaluate" in err and "model.hidden: saved 16, now 8" in err and "drop those overrides" in err
