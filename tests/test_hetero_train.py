"""Training on a heterogeneous dataset: typed batches whose features equal the files, R-SAGE and R-GAT through
the trainer with the cache, per-type hit ratios, and an exact resume."""
import json

import numpy as np
import pytest
import torch

pytest.importorskip("torch_geometric")

from lsm_gnn.build import CacheSize, FeatureSpec, build_features, feature_groups, group_sizes, group_weights  # noqa: E402
from lsm_gnn.cache import PolicyConfig  # noqa: E402
from lsm_gnn.config import load_config  # noqa: E402
from lsm_gnn.loader import NodeLoader  # noqa: E402
from lsm_gnn.testing import write_tiny_hetero_dataset  # noqa: E402
from lsm_gnn.training.trainer import Trainer  # noqa: E402

@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_tiny_hetero_dataset(tmp_path_factory.mktemp("hetero") / "ds")


def cached_features(dataset):
    """The dataset's features through one hybrid cache with PVP, a small one (rows are evicted)."""
    groups, budget = feature_groups(dataset), CacheSize("44800", "cache.capacity", 700 * 64, None)
    spec = FeatureSpec(source="cache", backend="pread", size=budget,
                       feature_sizes=group_sizes(dataset, groups, budget, 4, group_weights(dataset, groups)), ways=4, policy=PolicyConfig("hybrid", window=3, period=1), static_score="degree",
                       oversubscribe=False, pvp=True, pvp_queue_capacity=8, pvp_reinstall=True, shared=False,
                       owner="modulo")
    return build_features(spec, dataset, torch.device("cpu"))


def test_typed_batches_carry_the_files_rows(dataset):
    features = cached_features(dataset)
    loader = NodeLoader(dataset, features, [3, 2], 50, window=3, seed=1)
    hits = 0
    for epoch in range(2):
        for batch in loader:
            assert batch.y.shape == batch.seeds.shape and set(batch.x) == {"paper", "author"}
            assert torch.equal(batch.hops[0].nodes["paper"][:batch.seeds.numel()], batch.seeds)
            for t, x in batch.x.items():
                expected = dataset.node_type(t).read_features_direct(batch.input_nodes[t].numpy())
                assert torch.equal(x, torch.from_numpy(expected)), f"epoch {epoch}: {t} rows differ from the file"
            hits += batch.hits
    assert hits > 0 and batch.hit_ratios().keys() == {"paper", "author"}


def overrides(path, out, kind, *more):
    return [f"dataset={path}", f"model.kind={kind}", "model.hidden=16", "model.heads=2", "sampler.fanouts=[3,2]",
            "sampler.batch_size=40", "cache.capacity=70%", "cache.window=4", "cache.static_score=degree",
            "train.lr=0.02", "train.epochs=3", "train.eval_splits=[val]", "log.progress=false",
            f"log.dir={out / 'log'}", f"checkpoint.dir={out / 'ckpt'}", "checkpoint.every=2", *more]


@pytest.mark.parametrize("kind", ["sage", "gat"])
def test_r_sage_and_r_gat_train_through_the_cache(dataset, tmp_path, kind):
    result = Trainer(load_config(None, overrides(dataset.path, tmp_path, kind))).fit()
    history = result["history"]
    assert len(history) == 3 and history[-1]["loss"] < history[0]["loss"]
    assert result["eval"]["val"]["accuracy"] > 0.6, "the authors' and topics' features give the class away"
    records = [json.loads(line) for line in open(tmp_path / "log" / "metrics.jsonl") if '"iteration"' in line]
    assert set(records[0]["hit_ratio_by_type"]) == {"paper", "author"} and records[-1]["hit_ratio"] > 0
    # per node type in the epochs' summaries and the run's, consistent with the one ratio over all rows
    for summary in history:
        by_type, rows = summary["hit_ratio_by_type"], summary["rows_by_type"]
        assert by_type.keys() == rows.keys() == {"paper", "author"}
        weighted = sum(by_type[t] * rows[t] for t in rows) / sum(rows.values())
        assert abs(weighted - summary["hit_ratio"]) < 1e-9
    assert result["hit_ratio_by_type"].keys() == {"paper", "author"}


def test_a_resumed_run_matches_an_uninterrupted_one(dataset, tmp_path):
    whole = Trainer(load_config(None, overrides(dataset.path, tmp_path / "whole", "sage"))).fit()
    parts = overrides(dataset.path, tmp_path / "parts", "sage")
    Trainer(load_config(None, parts + ["train.max_iterations=5"])).fit()
    resumed = Trainer(load_config(None, parts)).fit()
    assert [h["loss"] for h in resumed["history"]] == [h["loss"] for h in whole["history"]]
    assert resumed["eval"]["val"]["accuracy"] == whole["eval"]["val"]["accuracy"]


def test_fanouts_per_relation_from_the_config(dataset, tmp_path):
    from lsm_gnn.config import ConfigError
    from lsm_gnn.tasks import NodeClassification

    cfg = load_config(None, overrides(dataset.path, tmp_path, "sage",
                                      "sampler.relation_fanouts.paper__cites__paper=[0,0]",
                                      "sampler.relation_fanouts.author__writes__paper=[-1, 1]"))
    task = NodeClassification(cfg, dataset)
    assert task.fanouts["paper__cites__paper"] == [0, 0] and task.fanouts["author__writes__paper"] == [-1, 1]
    assert task.fanouts["paper__has_topic__topic"] == [3, 2]
    features = build_features(FeatureSpec(
        source="memory", backend="memory", size=CacheSize("0", "cache.capacity", 0, None), ways=4,
        policy=PolicyConfig("hybrid"), static_score=None, oversubscribe=False, pvp=False, pvp_queue_capacity=1,
        pvp_reinstall=False, shared=False, owner="modulo"), dataset, torch.device("cpu"))
    batch = next(iter(task.train_loader(features, 0, 1)))
    assert all(hop.edge_index[("paper", "cites", "paper")].shape[1] == 0 for hop in batch.hops)
    with pytest.raises(ConfigError, match="paper__cites__venue"):
        NodeClassification(load_config(None, overrides(dataset.path, tmp_path, "sage",
                                                       "sampler.relation_fanouts.paper__cites__venue=[1,1]")), dataset)
    with pytest.raises(ConfigError, match="must be a list of 2 ints"):
        load_config(None, overrides(dataset.path, tmp_path, "sage",
                                    "sampler.relation_fanouts.paper__cites__paper=[1]"))


def test_r_sage_beats_a_features_only_mlp_on_the_igbh_shaped_graph(tmp_path):
    """The trainer's R-SAGE against the same model without neighbors (fanouts 0: only each paper's own
    features, through the per-type terms, i.e. an MLP) on the synthetic IGBH-shaped graph."""
    from lsm_gnn.data.synthetic_hetero import generate_hetero_synthetic

    ds = generate_hetero_synthetic(tmp_path / "igbh", num_papers=3000, feature_dim=32, num_classes=8,
                                   progress=False)

    def accuracy(fanouts, out):
        cfg = load_config(None, [f"dataset={ds.path}", "model.kind=sage", "model.hidden=32",
                                 f"sampler.fanouts={fanouts}", "sampler.batch_size=128", "cache.features=memory",
                                 "train.lr=0.01", "train.epochs=4", "train.eval_splits=[val]", "log.progress=false",
                                 f"log.dir={tmp_path / out}"])
        return Trainer(cfg).fit()["eval"]["val"]["accuracy"]

    gnn, mlp = accuracy("[5,5]", "gnn"), accuracy("[0,0]", "mlp")
    assert gnn > mlp + 0.2, f"R-SAGE {gnn:.3f} vs features only {mlp:.3f}"


@pytest.mark.parametrize("kind", ["sage", "gat"])
def test_each_relation_computes_only_its_destinations_as_the_whole_layer_would(dataset, kind):
    """The model hands each relation's conv (its sources, only its destinations); PyG's HeteroConv over every
    row of the layer, cut to the destinations after, gives the same outputs (at 4-6x the work on a real graph)."""
    from lsm_gnn.models import HeteroHopGNN, _destination_messages

    loader = NodeLoader(dataset, cached_features(dataset), [3, 2], 40, seed=2)
    batch = next(iter(loader))
    loader.close()
    in_dims = {t: (batch.x[t].shape[1] if t in batch.x else 0) for t in dataset.node_types}
    torch.manual_seed(0)
    model = HeteroHopGNN(kind, in_dims, dataset.relations, dataset.target, hidden=8, out_dim=3, num_layers=2,
                         heads=2).eval()
    nodes = batch.hops[-1].nodes
    x = {t: batch.x[t].float() if t in batch.x else model.embedding[t].expand(nodes[t].numel(), -1)
         for t in dataset.node_types}
    hop = batch.hops[-1]
    edges = {r: e for r, e in hop.edge_index.items() if e.shape[1] and r[2] in model.outputs[0]}
    with torch.no_grad():
        ours = _destination_messages(model.convs[0], x, edges, hop.num_dst)
        whole = model.convs[0](x, edges)
    assert ours.keys() == whole.keys() and ours
    for t in ours:
        assert ours[t].shape[0] == hop.num_dst[t] < whole[t].shape[0]
        torch.testing.assert_close(ours[t], whole[t][:hop.num_dst[t]], rtol=1e-5, atol=1e-6)
