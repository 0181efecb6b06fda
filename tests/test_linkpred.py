"""Link prediction: the user-item format and generator, LinkLoader, BPR and recall@k."""
import json
import re
import threading

import numpy as np
import pytest
import torch

from lsm_gnn import DatasetError, DatasetWriter, open_dataset, open_storage
from lsm_gnn.cache import SoftwareCache
from lsm_gnn.data.bipartite import generate_bipartite
from lsm_gnn.tasks.link_prediction import LinkLoader, bpr_loss, recall_at_k, user_ranking_metrics
from lsm_gnn.testing import write_tiny_dataset

U, I, DIM = 1000, 1000, 16


@pytest.fixture(autouse=True)
def _one_thread_for_every_test(one_torch_thread):
    """Every test here trains tiny models (conftest.one_torch_thread)."""


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return generate_bipartite(tmp_path_factory.mktemp("lp") / "g", num_users=U, num_items=I, avg_interactions=20,
                              feature_dim=DIM, seed=0, val_fraction=0.1, progress=False)


def train_pairs(ds):
    """The training (user, item) pairs: the user rows of the CSR."""
    indptr, indices = np.asarray(ds.indptr), np.asarray(ds.indices)
    return np.stack([np.repeat(np.arange(U), np.diff(indptr[:U + 1])), indices[:indptr[U]]], axis=1)


def keys(pairs):
    return np.asarray(pairs[:, 0], dtype=np.int64) * (U + I) + pairs[:, 1]


# -- the data ------------------------------------------------------------------------------------------------------

def test_the_generated_dataset_validates_and_reopens(ds, tmp_path):
    again = open_dataset(ds.path)  # full validation, edge splits included
    again.verify_checksums()
    assert (again.num_users, again.num_items, again.num_nodes) == (U, I, U + I)
    assert again.edge_split_names == ["test", "val"]
    assert {"test_edges.npy", "val_edges.npy"} <= set(again.meta["checksums"])
    for name in ("test", "val"):
        pairs = again.edge_split(name)
        assert pairs.dtype == np.int64 and pairs.ndim == 2 and pairs.shape[1] == 2 and len(pairs) > 100
        assert pairs[:, 0].max() < U <= pairs[:, 1].min()
    # Deterministic in its parameters.
    same = generate_bipartite(tmp_path / "same", num_users=U, num_items=I, avg_interactions=20, feature_dim=DIM,
                              seed=0, val_fraction=0.1, progress=False, scores=())
    for name in ("features.bin", "indices.npy", "test_edges.npy", "val_edges.npy"):
        with open(ds.file_path(name), "rb") as a, open(same.file_path(name), "rb") as b:
            assert a.read() == b.read(), name


def test_held_out_edges_are_absent_from_the_symmetric_csr(ds):
    train = train_pairs(ds)
    assert train[:, 1].min() >= U  # user rows list items only
    indptr, indices = np.asarray(ds.indptr), np.asarray(ds.indices)
    item_rows = np.stack([indices[indptr[U]:], np.repeat(np.arange(U, U + I), np.diff(indptr[U:]))], axis=1)
    assert np.array_equal(np.sort(keys(train)), np.sort(keys(item_rows)))  # both directions
    seen = set(keys(train).tolist())
    test, val = keys(ds.edge_split("test")), keys(ds.edge_split("val"))
    assert not seen & set(test.tolist()) and not seen & set(val.tolist()) and not set(test.tolist()) & set(val.tolist())
    assert np.unique(test).size == test.size
    degree = np.diff(indptr[U:])
    assert degree.max() > 3 * degree.mean()  # popular items


def test_the_format_rejects_bad_user_item_data(ds, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(ds.path, bad)
    meta = json.loads((bad / "meta.json").read_text())
    meta["num_items"] = I - 1
    (bad / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match="sum to num_nodes"):
        open_dataset(bad)
    meta["num_items"] = I
    (bad / "meta.json").write_text(json.dumps(meta))
    pairs = np.array(ds.edge_split("test"))
    pairs[3, 1] = 5  # a user where an item belongs
    np.save(bad / "test_edges.npy", pairs)
    with pytest.raises(DatasetError, match="test_edges.npy.*second node at position 3"):
        open_dataset(bad)
    np.save(bad / "test_edges.npy", pairs[:, 0])
    with pytest.raises(DatasetError, match=r"expected shape \(n, 2\)"):
        open_dataset(bad)

    with DatasetWriter(tmp_path / "w", num_nodes=10, feature_dim=2) as writer:
        with pytest.raises(ValueError, match="sum to num_nodes"):
            writer.set_bipartite(4, 5)
        writer.set_bipartite(4, 6)
        with pytest.raises(ValueError, match="unknown edge split"):
            writer.write_edge_split("train", np.zeros((1, 2), dtype=np.int64))
        with pytest.raises(ValueError, match=r"\[0, 4\) with one in \[4, 10\)"):
            writer.write_edge_split("test", np.array([[5, 6]]))
        with pytest.raises(ValueError, match="shape"):
            writer.write_edge_split("test", np.array([1, 2, 3]))


# -- the loader ----------------------------------------------------------------------------------------------------

def test_every_batch_reads_the_file_and_an_epoch_visits_every_training_edge_once(ds):
    with open_storage(ds, "io_uring") as storage:
        cache = SoftwareCache(storage, num_sets=16, ways=32, policy="hybrid", window=8, oversubscribe=True)
        loader = LinkLoader(ds, cache, [4, 2], batch_size=700, num_negatives=3, window=8)
        for epoch in range(2):
            edges = []
            for batch in loader:
                assert np.array_equal(batch.x.numpy(), ds.read_features_direct(batch.input_nodes.numpy()))
                assert torch.equal(batch.hops[0].nodes[:batch.seeds.numel()], batch.seeds)
                assert torch.equal(batch.seeds.unique(), batch.seeds)  # distinct, sorted
                user, pos, neg = batch.seeds[batch.user], batch.seeds[batch.pos], batch.seeds[batch.neg]
                assert neg.shape == (user.numel(), 3) and (user < U).all()
                assert ((neg >= U) & (neg < U + I)).all() and (pos >= U).all()
                assert set(batch.seeds.tolist()) == set(torch.cat([user, pos, neg.reshape(-1)]).tolist())
                edges.append(torch.stack([user, pos], 1).numpy())
            assert np.array_equal(np.sort(keys(np.concatenate(edges))), np.sort(keys(train_pairs(ds))))
        assert cache.stats.hits > 0
    assert not [t for t in threading.enumerate() if t.name == "lsm-gnn-loader"]


@pytest.mark.parametrize("fanouts", [[20, 5], [-1, -1]])  # -1 twice: hop 2 begins with hop 1's edges
def test_a_batch_never_sees_its_own_positive_edges(ds, fanouts):
    """Exactly the edges joining a batch's user to its positive item (either direction) leave its hops."""
    storage = open_storage(ds, "memory")
    kept = next(iter(LinkLoader(ds, storage, fanouts, 200, exclude_positives=False)))
    dropped = next(iter(LinkLoader(ds, storage, fanouts, 200)))
    n = kept.seeds.numel()
    pairs = torch.cat([kept.user * n + kept.pos, kept.pos * n + kept.user])
    positives = 0
    for before, after in zip(kept.hops, dropped.hops):
        src, dst = before.edge_index
        positive = (src < n) & (dst < n) & torch.isin(src * n + dst, pairs)
        assert torch.equal(after.edge_index, before.edge_index[:, ~positive])
        positives += int(positive.sum())
    assert positives > 200  # users have about 14 items, so most positives get sampled
    assert torch.equal(kept.seeds, dropped.seeds) and torch.equal(kept.neg, dropped.neg)
    negatives = dropped.seeds[dropped.neg]
    assert ((negatives >= U) & (negatives < U + I)).all()


def test_num_negatives_and_negatives_that_exclude_training_positives(ds):
    storage = open_storage(ds, "memory")
    train = set(keys(train_pairs(ds)).tolist())

    def known_hits(loader):
        hits = total = 0
        for batch in loader:
            user, neg = batch.seeds[batch.user], batch.seeds[batch.neg]
            assert neg.shape == (user.numel(), loader.num_negatives) and ((neg >= U) & (neg < U + I)).all()
            pairs = keys(np.stack([user.repeat_interleave(neg.shape[1]).numpy(), neg.reshape(-1).numpy()], 1))
            hits += sum(int(p) in train for p in pairs)
            total += pairs.size
        return hits, total

    hits, total = known_hits(LinkLoader(ds, storage, [0], 2000, num_negatives=4))
    assert total == 4 * len(train_pairs(ds)) and hits > 50  # uniform draws hit a training item now and then
    strict = LinkLoader(ds, storage, [0], 2000, num_negatives=4, negatives_exclude_positives=True)
    hits, total = known_hits(strict)
    assert hits == 0 and total == 4 * len(train_pairs(ds))
    # Still uniform over the rest: every item is drawn, about equally often.
    drawn = np.concatenate([b.seeds[b.neg].reshape(-1).numpy() for b in strict])
    counts = np.bincount(drawn - U, minlength=I)
    assert counts.min() > 0.5 * counts.mean() and counts.max() < 1.6 * counts.mean()
    first, again = ([b.seeds[b.neg] for b in LinkLoader(ds, storage, [0], 2000, num_negatives=4,
                                                        negatives_exclude_positives=True)] for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # the same draws again: exact resume holds


def test_negatives_that_exclude_positives_of_a_user_with_every_item_are_refused(tmp_path):
    with DatasetWriter(tmp_path / "full", num_nodes=5, feature_dim=2) as writer:
        writer.write_features(np.zeros((5, 2), dtype=np.float32))
        writer.set_bipartite(2, 3)
        writer.write_edges([(np.array([2, 3, 4, 2]), np.array([0, 0, 0, 1]))], undirected=True)
        writer.write_edge_split("test", np.array([[1, 3]]))
        full = writer.commit()
    loader = LinkLoader(full, open_storage(full, "memory"), [0], 4, negatives_exclude_positives=True, shuffle=False)
    with pytest.raises(DatasetError, match="user 0 has a training edge with every item"):
        next(iter(loader))


def _batches(loader):
    return [(b.iteration, b.seeds, b.user, b.pos, b.neg, b.input_nodes) for b in loader]


def test_same_seed_same_batches_and_exact_resume(ds):
    storage = open_storage(ds, "memory")
    first = _batches(LinkLoader(ds, storage, [3], 1000, seed=3))
    assert all(all(torch.equal(x, y) for x, y in zip(a[1:], b[1:]))
               for a, b in zip(first, _batches(LinkLoader(ds, storage, [3], 1000, seed=3))))
    other = _batches(LinkLoader(ds, storage, [3], 1000, seed=4))
    assert not torch.equal(first[0][1], other[0][1])

    loader = LinkLoader(ds, storage, [3], 1000, seed=3)
    _batches(loader)  # epoch 0
    it = iter(loader)
    taken = [next(it) for _ in range(2)]
    state = loader.state_dict()
    loader.close()
    rest = [(b.iteration, b.seeds, b.neg) for b in taken]
    resumed = LinkLoader(ds, storage, [3], 1000, seed=3)
    resumed.load_state_dict(state)
    rest += [(b.iteration, b.seeds, b.neg) for b in resumed]
    again = LinkLoader(ds, storage, [3], 1000, seed=3)
    _batches(again)
    full = [(b.iteration, b.seeds, b.neg) for b in again]  # epoch 1, uninterrupted
    assert [r[0] for r in rest] == [f[0] for f in full]
    assert all(torch.equal(r[1], f[1]) and torch.equal(r[2], f[2]) for r, f in zip(rest, full))
    with pytest.raises(ValueError, match="num_negatives"):
        LinkLoader(ds, storage, [3], 1000, seed=3, num_negatives=2).load_state_dict(state)


def test_ranks_share_the_edges(ds):
    storage = open_storage(ds, "memory")
    parts = [LinkLoader(ds, storage, [2], 500, rank=r, world_size=2) for r in range(2)]
    assert len(parts[0]) == len(parts[1])
    edges = [np.concatenate([torch.stack([b.seeds[b.user], b.seeds[b.pos]], 1).numpy() for b in p]) for p in parts]
    assert not set(keys(edges[0]).tolist()) & set(keys(edges[1]).tolist())
    assert len(edges[0]) + len(edges[1]) >= len(train_pairs(ds)) - 1


# -- loss and metric -----------------------------------------------------------------------------------------------

def test_bpr_loss():
    g = torch.Generator().manual_seed(0)
    u, p, n = (torch.randn(5, 4, generator=g) for _ in range(3))
    expected = -torch.nn.functional.logsigmoid((u * p).sum(1) - (u * n).sum(1)).mean()
    assert torch.allclose(bpr_loss(u, p, n), expected)
    assert torch.allclose(bpr_loss(u, p, n.unsqueeze(1)), expected)
    many = torch.randn(5, 3, 4, generator=g)
    assert torch.allclose(bpr_loss(u, p, many), torch.stack([bpr_loss(u, p, many[:, j]) for j in range(3)]).mean())
    with pytest.raises(ValueError, match="negative embeddings"):
        bpr_loss(u, p, torch.randn(4, 4))


class TableModel(torch.nn.Module):
    """Embeddings looked up by node id: an oracle or a random scorer."""

    def __init__(self, table):
        super().__init__()
        self.table = table

    def forward(self, batch):
        return self.table[batch.seeds]


def test_recall_is_one_for_an_oracle_and_matches_the_analytic_random_baseline(ds):
    features = open_storage(ds, "memory")
    test = np.asarray(ds.edge_split("test"))
    # <user u, item i> = 1 exactly when (u, i) is held out.
    oracle = torch.zeros(U + I, U, dtype=torch.float64)
    oracle[torch.arange(U), torch.arange(U)] = 1
    oracle[torch.from_numpy(test[:, 1]), torch.from_numpy(test[:, 0])] = 1
    result = recall_at_k(TableModel(oracle), ds, features, [2], k=20)
    assert result["recall_capped"] == pytest.approx(1.0) and result["ndcg"] == pytest.approx(1.0)
    held = np.unique(test[:, 0], return_counts=True)[1]  # no test pair is known (disjoint splits)
    assert result["recall"] == pytest.approx(np.mean(np.minimum(20, held) / held))
    assert (held > 20).any() and result["recall"] < 1  # users with more than k held-out items exist
    assert result["users"] == held.size
    # Random embeddings rank items in a uniformly random order.
    g = torch.Generator().manual_seed(0)
    scores = [recall_at_k(TableModel(torch.randn(U + I, 8, generator=g)), ds, features, [2], k=20)
              for _ in range(4)]
    measured = np.mean([s["recall"] for s in scores])
    assert measured == pytest.approx(result["random_recall"], rel=0.25)
    assert 0.015 < result["random_recall"] < 0.03  # about k / num_items


def test_validation_ranks_the_test_items_and_test_ranking_removes_the_validation_items(ds):
    """No leak into model selection: an oracle that scores each user's test items highest pushes the val items
    down in a val ranking (the test items stay candidates), while a test ranking removes the val items."""
    from lsm_gnn.tasks.link_prediction import known_splits

    assert known_splits("val", ["val", "test"]) == [] and known_splits("test", ["val", "test"]) == ["val"]
    features = open_storage(ds, "memory")
    val, test = np.asarray(ds.edge_split("val")), np.asarray(ds.edge_split("test"))
    table = torch.zeros(U + I, U, dtype=torch.float64)
    table[torch.arange(U), torch.arange(U)] = 1
    table[torch.from_numpy(test[:, 1]), torch.from_numpy(test[:, 0])] = 2  # test items: the top scores
    table[torch.from_numpy(val[:, 1]), torch.from_numpy(val[:, 0])] = 1
    k = 5
    on_val = recall_at_k(TableModel(table), ds, features, [2], k=k, split="val")
    # Each user's top k: its test items first, then val items: the val recall is what is left of k.
    users = np.intersect1d(np.unique(val[:, 0]), np.arange(U))
    expected = []
    for u in users:
        held = int((val[:, 0] == u).sum())
        room = max(0, k - int((test[:, 0] == u).sum()))
        expected.append(min(room, held) / held)
    assert on_val["users"] == users.size and on_val["recall"] == pytest.approx(np.mean(expected))
    assert on_val["recall"] < 0.9  # with test items removed it would be about 1
    table[torch.from_numpy(val[:, 1]), torch.from_numpy(val[:, 0])] = 3  # val items above test items
    on_test = recall_at_k(TableModel(table), ds, features, [2], k=20, split="test")
    held = np.unique(test[:, 0], return_counts=True)[1]
    assert on_test["recall"] == pytest.approx(np.mean(np.minimum(20, held) / held))  # val items removed


def test_ranking_metrics_match_hand_computed_values():
    """LightGCN's recall (hits / |H|) and NDCG (IDCG over min(k, |H|) ideal positions), and the capped recall."""
    top_hits = torch.tensor([[1, 0, 1], [0, 1, 0], [0, 0, 0], [1, 1, 0]], dtype=torch.bool)
    held = torch.tensor([4, 1, 2, 2])
    m = user_ranking_metrics(top_hits, held, k=3)
    log2 = np.log2
    assert m["recall"].tolist() == pytest.approx([2 / 4, 1.0, 0.0, 1.0])
    assert m["recall_capped"].tolist() == pytest.approx([2 / 3, 1.0, 0.0, 1.0])
    assert m["ndcg"].tolist() == pytest.approx([(1 + 1 / log2(4)) / (1 + 1 / log2(3) + 1 / log2(4)),
                                                (1 / log2(3)) / 1.0, 0.0, 1.0])


def test_a_gnn_beats_random_ranking(ds):
    pytest.importorskip("torch_geometric")
    from lsm_gnn.models import HopGNN

    torch.manual_seed(0)
    features = open_storage(ds, "memory")
    model = HopGNN("sage", DIM, 32, 32, num_layers=2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = LinkLoader(ds, features, [10, 5], batch_size=1024, window=4)
    for _ in range(3):
        for batch in loader:
            emb = model(batch)
            loss = bpr_loss(emb[batch.user], emb[batch.pos], emb[batch.neg])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    result = recall_at_k(model, ds, features, [10, 5], k=20)
    assert result["recall"] > 3 * result["random_recall"]  # measured: about 6x


def test_clear_errors(ds, tmp_path):
    plain, _ = write_tiny_dataset(tmp_path / "plain", num_nodes=50)
    with pytest.raises(DatasetError, match="not a user-item dataset.*generate_bipartite"):
        LinkLoader(plain, open_storage(plain, "memory"), [2], 10)
    with DatasetWriter(tmp_path / "no_splits", num_nodes=6, feature_dim=2) as writer:
        writer.write_features(np.zeros((6, 2), dtype=np.float32))
        writer.set_bipartite(3, 3)
        writer.write_edges([(np.array([3, 4, 5]), np.array([0, 1, 2]))], undirected=True)
        no_splits = writer.commit()
    with pytest.raises(KeyError, match="no 'test' edge split.*write_edge_split"):
        recall_at_k(TableModel(torch.zeros(6, 2)), no_splits, open_storage(no_splits, "memory"), [2])
    with pytest.raises(ValueError, match="num_negatives"):
        LinkLoader(ds, open_storage(ds, "memory"), [2], 10, num_negatives=0)
    with pytest.raises(ValueError, match="community"):
        generate_bipartite(tmp_path / "tiny", num_users=5, num_items=3, progress=False)


def test_the_trainer_runs_link_prediction_through_the_cache(ds, tmp_path):
    pytest.importorskip("torch_geometric")
    from lsm_gnn.config import ConfigError, load_config
    from lsm_gnn.training.trainer import Trainer

    overrides = [f"dataset={ds.path}", "train.task=link", "model.kind=sage", "model.hidden=32",
                 "sampler.fanouts=[10, 5]", "sampler.batch_size=256", "cache.capacity=100%", "cache.window=4",
                 "train.epochs=3", "train.lr=0.01", "log.progress=false"]
    result = Trainer(load_config(None, overrides)).fit()
    test = result["eval"]["test"]
    assert test["recall@20"] > 2 * test["random_recall@20"]
    assert result["history"][-1]["hit_ratio"] > 0
    plain, _ = write_tiny_dataset(tmp_path / "plain", num_nodes=50)
    with pytest.raises(ConfigError, match="train.task=link"):
        Trainer(load_config(None, [f"dataset={plain.path}", "train.task=link"]))


def _docs_block(doc: str, marker: str) -> str:
    """The fenced code block of ``docs/<doc>`` that contains ``marker``."""
    import os

    with open(os.path.join(os.path.dirname(__file__), "..", "docs", doc)) as f:
        text = f.read()
    return next(block.split("\n", 1)[1] for block in text.split("```")[1::2] if marker in block)


def test_the_documented_writer_recipe_trains_with_default_settings(tmp_path):
    pytest.importorskip("torch_geometric")
    from lsm_gnn.config import load_config
    from lsm_gnn.training.trainer import Trainer

    rng = np.random.default_rng(0)
    num_users, num_items, dim, n = 60, 40, 4, 600
    users, items, part = rng.integers(0, num_users, n), rng.integers(0, num_items, n), rng.integers(0, 10, n)
    train, val, test = part < 8, part == 8, part == 9
    names = {"U": num_users, "I": num_items, "dim": dim,
             "features": rng.standard_normal((num_users + num_items, dim)).astype(np.float32),
             "train_users": users[train], "train_items": items[train], "val_users": users[val],
             "val_items": items[val], "test_users": users[test], "test_items": items[test]}
    code = _docs_block("link_prediction.md", 'DatasetWriter("data/books"')
    exec(code.replace('"data/books"', repr(str(tmp_path / "books"))), names)
    ds = open_dataset(tmp_path / "books")
    assert ds.score_names() == ["degree", "reverse_pagerank"] and ds.edge_split_names == ["test", "val"]
    # The defaults (cache.static_score=reverse_pagerank, eval on val and test) but a cache for a toy graph.
    result = Trainer(load_config(None, [f"dataset={ds.path}", "train.task=link", "train.max_iterations=1",
                                        "cache.capacity=1M", "log.progress=false"])).fit()
    assert result["iterations"] == 1 and set(result["eval"]) == {"val", "test"}


def test_cli_prepares_a_user_item_dataset(tmp_path, capsys):
    from lsm_gnn.cli import main

    out = tmp_path / "recsys"
    assert main(["prepare", "bipartite", "--out", str(out), "--num-users", "300", "--num-items", "200",
                 "--feature-dim", "8", "--val-fraction", "0.1", "--no-progress"]) == 0
    ds = open_dataset(out)
    assert (ds.num_users, ds.num_items, ds.num_nodes) == (300, 200, 500)
    assert sorted(ds.edge_split_names) == ["test", "val"]
    train = int(ds.indptr[300])
    val, test = (len(ds.edge_split(s)) for s in ("val", "test"))
    counts = f"train/val/test {train:,}/{val:,}/{test:,}"
    assert f"300 users, 200 items, interactions {counts}" in capsys.readouterr().out
    assert main(["inspect", str(out)]) == 0
    assert f"users     300   items 200   interactions {counts}" in capsys.readouterr().out
    assert main(["inspect", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["num_users"], summary["num_items"]) == (300, 200)
    assert summary["interactions"] == {"train": train, "val": val, "test": test}
    assert main(["prepare", "scores", str(out)]) == 0
    assert f"300 users, 200 items, interactions {counts}" in capsys.readouterr().out
    assert main(["inspect", str(write_tiny_dataset(tmp_path / "plain", num_nodes=50)[0].path), "--json"]) == 0
    assert "num_users" not in json.loads(capsys.readouterr().out)  # only user-item datasets have them


def test_full_neighbourhood_evaluation_of_link_prediction(ds):
    """train.eval_mode=full ranks with every neighbour: as sampling all of them (fanouts -1) does, for SAGE."""
    pytest.importorskip("torch_geometric")
    from lsm_gnn.config import load_config
    from lsm_gnn.training.trainer import Trainer

    overrides = [f"dataset={ds.path}", "train.task=link", "model.kind=sage", "model.hidden=16",
                 "sampler.fanouts=[5, 3]", "sampler.batch_size=512", "cache.features=memory", "train.lr=0.01",
                 "train.max_iterations=10", "train.eval_every=10", "train.eval_splits=[test]", "train.eval_mode=full",
                 "log.progress=false"]
    trainer = Trainer(load_config(None, overrides))
    full = trainer.fit()["eval"]["test"]
    every = recall_at_k(trainer.module, ds, open_storage(ds, "memory"), [-1, -1], k=20, split="test")
    assert full["count"] == every["users"]
    for name in ("recall", "ndcg", "recall_capped"):  # near-tied scores may swap: float sums in another order
        assert full[f"{name}@20"] == pytest.approx(every[name], abs=2e-3)
    assert full["recall@20"] > 2 * full["random_recall@20"]


def test_ranking_evaluation_batches_the_cache_cannot_hold_are_refused_before_training(ds):
    pytest.importorskip("torch_geometric")
    from lsm_gnn.config import ConfigError, load_config
    from lsm_gnn.training.trainer import Trainer

    base = [f"dataset={ds.path}", "train.task=link", "model.kind=sage", "model.hidden=8", "sampler.fanouts=[5,5]",
            "sampler.batch_size=16", "cache.capacity=70%", "log.progress=false"]
    # Training batches of 16 edges fit a 70% cache; the ranking embeds users and items 1500 at a time.
    with pytest.raises(ConfigError, match=r"evaluating on val: cache.capacity=70% .* or set "
                                          r"train.eval_batch_size=(\d+) or less \(now 1500\)") as refused:
        Trainer(load_config(None, [*base, "train.eval_batch_size=1500"]))
    # the size it gives fits
    size = re.search(r"eval_batch_size=(\d+)", str(refused.value)).group(1)
    Trainer(load_config(None, [*base, f"train.eval_batch_size={size}"])).close()


def test_both_tasks_answer_the_trainers_questions(ds, tmp_path):
    """Node classification and link prediction are one interface to the trainer (lsm_gnn.tasks.Task)."""
    import typing

    from lsm_gnn.config import ConfigError, load_config
    from lsm_gnn.tasks import Task, make_task

    node_ds, _ = write_tiny_dataset(tmp_path / "node")
    members = [m for m in typing.get_type_hints(Task)] + [m for m in vars(Task) if not m.startswith("_")]
    for path, task in ((node_ds.path, "node"), (ds.path, "link")):
        cfg = load_config(None, [f"dataset={path}", f"train.task={task}"])
        made = make_task(cfg, open_dataset(path))
        assert made.name == task
        missing = [m for m in members if not hasattr(made, m)]
        assert not missing, f"{task} lacks {missing}"
        # per relation: the graph's one, which sampler.relation_fanouts may name as on a typed graph
        assert made.metrics and made.out_dim > 0 and made.fanouts == {"node__to__node": cfg.sampler.fanouts}
        twos = [2] * len(cfg.sampler.fanouts)
        given = load_config(None, [f"dataset={path}", f"train.task={task}",
                                   f"sampler.relation_fanouts.node__to__node={twos}"])
        assert make_task(given, open_dataset(path)).fanouts == {"node__to__node": twos}
        with pytest.raises(ConfigError, match=r"names \['paper__cites__paper'\].*its relations: node__to__node"):
            make_task(load_config(None, [f"dataset={path}", f"train.task={task}",
                                         f"sampler.relation_fanouts.paper__cites__paper={twos}"]), open_dataset(path))
