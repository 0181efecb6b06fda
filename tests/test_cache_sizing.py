"""Cache sizing: the largest batch estimated before training, a capacity with headroom in the user's unit,
the config keys named by the trainer, and cache.capacity=100% holding every node."""
import time

import numpy as np
import pytest
import torch

from lsm_gnn.build import build_features, resolve
from lsm_gnn.cache import CacheTooSmall, SoftwareCache
from lsm_gnn.cache.geometry import set_of
from lsm_gnn.comm import SharedCache
from lsm_gnn.comm.ownership import ModuloOwner
from lsm_gnn.config import ConfigError, capacity_spec, load_config
from lsm_gnn.loader import NodeLoader
from lsm_gnn.sizing import cache_fits, suggested_capacity
from lsm_gnn.utils.units import parse_bytes, round_up, suggest_bytes

pytest.importorskip("torch_geometric")

from lsm_gnn.training.trainer import Trainer  # noqa: E402

# The graph fixture (conftest.py) generates this once per module: 3000 nodes of 64 bytes.
GRAPH = dict(num_nodes=3000, avg_degree=8, feature_dim=16, num_classes=4, seed=1)


def config(graph, tmp_path, *overrides):
    return load_config(None, [f"dataset={graph}", "model.kind=sage", "model.hidden=16", "sampler.fanouts=[4, 2]",
                              "sampler.batch_size=64", "cache.window=4", "train.max_iterations=2",
                              "train.eval_splits=[]", "log.progress=false", *overrides])


def suggestion(message: str) -> str:
    return message.split("set cache.capacity=", 1)[1].split()[0]


class TestUnits:
    @pytest.mark.parametrize("value, expected", [(83.1, 84), (0.8306, 0.84), (12.34, 13), (1.5, 1.5), (100, 100)])
    def test_round_up_keeps_two_significant_digits(self, value, expected):
        assert round_up(value) == expected

    @pytest.mark.parametrize("value, expected", [(83_060_000, "80M"), (1.37 * 2**30, "1.4G"), (1280, "1.3K"),
                                                 (100, "100")])
    def test_a_suggested_byte_size_is_at_least_the_value_and_readable(self, value, expected):
        assert suggest_bytes(value) == expected
        assert parse_bytes(expected) >= value


class TestSuggestedCapacity:
    def test_the_issue_numbers_give_a_share_with_headroom(self):
        # 10% of 150,000 nodes is 14,976 lines in 32-way sets; the largest sampled batch had 52,919 ids.
        assert suggested_capacity("10%", 14_976, 52_919, 32) == "45%"

    @pytest.mark.parametrize("capacity", ["2M", "64K", "3000000"])
    def test_bytes_stay_bytes_and_give_the_lines_with_headroom(self, capacity):
        row_bytes, ways, distinct = 512, 32, 8_306
        lines = parse_bytes(capacity) // row_bytes // ways * ways
        suggested = suggested_capacity(capacity, lines, distinct, ways)
        assert suggested[-1] in "KMG"
        assert parse_bytes(suggested) // row_bytes // ways * ways >= 1.25 * distinct

    def test_a_share_never_goes_past_every_node(self):
        assert suggested_capacity("60%", 1_000, 5_000, 32) == "100%"


class TestTheCacheSaysWhatToDo:
    def test_the_python_message_suggests_headroom_and_the_keyword(self, tiny_cache):
        storage = tiny_cache[0]
        cache = SoftwareCache(storage, num_sets=1, ways=8)
        with pytest.raises(CacheTooSmall, match=r"9 distinct ids but the cache holds 8 lines") as info:
            cache.lookup(torch.arange(9))
        assert isinstance(info.value, ValueError)  # callers that catch ValueError still do
        message = str(info.value)
        assert "oversubscribe=True" in message and "cache.oversubscribe" not in message
        suggested = message.split("capacity='", 1)[1].split("'")[0]
        assert parse_bytes(suggested) >= 1.25 * 9 * storage.row_bytes

    def test_a_batch_overflowing_one_set_is_served_exactly_when_the_cache_has_lines(self, tiny_cache):
        storage, features, _ = tiny_cache
        cache = SoftwareCache(storage, num_sets=4, ways=4)  # 16 lines
        ids = np.flatnonzero(set_of(np.arange(600), 4) == 0)[:7]  # 7 ids for one 4-way set
        rows, hit = cache.lookup(torch.from_numpy(ids))
        assert torch.equal(rows, features[torch.from_numpy(ids)]) and not hit.any()


class TestEstimateBeforeTraining:
    def test_a_share_too_small_fails_fast_naming_a_share_that_works(self, graph, tmp_path):
        start = time.perf_counter()
        with pytest.raises(ConfigError) as info:
            Trainer(config(graph, tmp_path, "cache.capacity=5%"))
        assert time.perf_counter() - start < 30  # before any training: the constructor raised
        message = str(info.value)
        assert "cache.capacity=5% gives the cache 128 lines" in message
        assert "the largest of 16 batches sampled before training has" in message
        assert "cache.oversubscribe=true" in message and "oversubscribe=True" not in message
        share = suggestion(message)
        assert capacity_spec(share)[0] == "share"
        trainer = Trainer(config(graph, tmp_path, f"cache.capacity={share}"))
        [fit] = trainer.cache_fits
        assert fit.lines >= 1.25 * fit.largest
        assert f"{fit.largest:,} distinct nodes" in message  # the estimate is the one the run makes
        assert trainer.fit()["iterations"] == 2

    def test_bytes_too_small_suggest_bytes(self, graph, tmp_path):
        with pytest.raises(ConfigError, match=r"cache.capacity=16K gives the cache 256 lines") as info:
            Trainer(config(graph, tmp_path, "cache.capacity=16K"))
        assert suggestion(str(info.value))[-1] in "KM"

    def test_oversubscribe_skips_the_estimate(self, graph, tmp_path):
        trainer = Trainer(config(graph, tmp_path, "cache.capacity=5%", "cache.oversubscribe=true"))
        assert trainer.cache_fits == [] and trainer.fit()["iterations"] == 2

    def test_a_batch_refused_mid_run_names_the_config_keys(self, graph, tmp_path, monkeypatch):
        # Sampling that saw only small batches: the real first batch is the first to be refused.
        monkeypatch.setattr(NodeLoader, "sample_input_nodes",
                            lambda self, count, epoch=0, rank=None: [{"node": torch.arange(10)}] * count)
        trainer = Trainer(config(graph, tmp_path, "cache.capacity=5%"))
        with pytest.raises(ConfigError) as info:
            trainer.fit()
        message = str(info.value)
        assert message.startswith("at iteration 0, a batch has ")
        assert "but the cache holds 128 lines (cache.capacity=5%)" in message
        assert isinstance(info.value.__cause__, CacheTooSmall)
        distinct = info.value.__cause__.distinct
        share = capacity_spec(suggestion(message))[1]
        assert share * 3000 >= 1.25 * distinct  # headroom over that batch, not its exact size
        assert "cache.oversubscribe=true" in message


def test_a_shared_slice_must_hold_what_every_rank_asks_of_its_owner(tiny_cache):
    shared = SharedCache.__new__(SharedCache)  # the parts cache_fits reads; no process group needed
    shared.cache, shared.owner = SoftwareCache(tiny_cache[0], num_sets=1, ways=8), ModuloOwner(2)
    rank0, rank1 = [torch.arange(0, 10)], [torch.arange(5, 15)]  # one iteration, overlapping in 5..9
    [fit] = cache_fits(shared, [rank0, rank1])
    assert (fit.largest, fit.lines, fit.fits) == (8, 8, True)  # owner 0: the 8 even ids of 0..14
    assert fit.what == "each rank's cache slice"


def test_capacity_100_percent_holds_every_node(graph, tmp_path):
    from lsm_gnn.data import open_dataset

    cfg = config(graph, tmp_path, "cache.capacity=100%", "cache.policy=lru")
    dataset = open_dataset(graph)
    cache = build_features(resolve(cfg, dataset), dataset, torch.device("cpu")).only
    assert cache.num_lines >= dataset.num_nodes
    assert np.bincount(set_of(np.arange(dataset.num_nodes), cache.num_sets)).max() <= cache.ways
    ids = torch.randperm(dataset.num_nodes)
    for batch in ids.split(500):  # every node once, then again: nothing was evicted
        cache.lookup(batch)
    for batch in ids.split(500):
        assert cache.lookup(batch)[1].all()
    assert cache.stats.evictions == 0


def test_the_default_victim_queue_budget_never_refuses_a_small_cache(graph, tmp_path):
    """cache.pvp_queue_bytes left at its default behaves as the cache's own default: one line a queue at
    least. A small cache with PVP used to stop on a budget its user never set (here 257 queues of 80 B
    rows against 25% of 96 lines); sizing then names the capacity the batches need."""
    with pytest.raises(ConfigError, match="before training"):
        Trainer(config(graph, tmp_path, "cache.capacity=4%", "cache.pvp=true", "cache.window=256"))
    # A figure the user gave is still checked, and the message names the config keys.
    with pytest.raises(ConfigError, match=r"cache.pvp_queue_bytes=1K: .* or set cache.pvp_queue_capacity"):
        Trainer(config(graph, tmp_path, "cache.capacity=4%", "cache.pvp=true", "cache.window=256",
                       "cache.pvp_queue_bytes=1K"))


def test_less_than_one_set_names_the_smallest_share_that_makes_one(graph, tmp_path):
    with pytest.raises(ConfigError, match=r"cache.capacity=0.5% is 15 lines of 64 bytes, fewer than one set of "
                                          r"cache.ways=32; set cache.capacity=1.1% or more"):
        Trainer(config(graph, tmp_path, "cache.capacity=0.5%"))
    with pytest.raises(ConfigError, match=r"cache.capacity=1.1% gives the cache 32 lines, but the largest"):
        Trainer(config(graph, tmp_path, "cache.capacity=1.1%"))  # one set: now the batches are what is short


def test_a_capacity_of_zero_bytes_names_one_sets_bytes(graph, tmp_path):
    """0 cannot be scaled up to a set (it used to advise 'cache.capacity=0 or more')."""
    with pytest.raises(ConfigError, match=r"cache.capacity=0 is 0 lines of 64 bytes, fewer than one set of "
                                          r"cache.ways=32; set cache.capacity=2K or more"):
        Trainer(config(graph, tmp_path, "cache.capacity=0"))
    with pytest.raises(ConfigError, match=r"cache.capacity=2K gives the cache 32 lines"):
        Trainer(config(graph, tmp_path, "cache.capacity=2K"))  # the advice makes one set


def _documented(doc: str, section: str) -> list[str]:
    """The arguments of the first command in ``doc``'s code blocks under the heading ``section``."""
    import os
    import shlex

    with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "docs", doc)) as f:
        text = f.read()
    block = text.split(f"\n## {section}\n", 1)[1].split("```", 2)[1]
    return shlex.split(block.replace("\\\n", " "))[2:]  # less "lsm-gnn train"


@pytest.mark.slow
def test_the_documented_lightgcn_command_runs_on_100k_interactions_as_written(tmp_path):
    """The command as docs/link_prediction.md shows it, on a MovieLens-100K-sized graph (943 users, 1,682 items,
    about 100,000 interactions) where every batch reaches most of the graph: the node embeddings' cache sizes
    itself (the features' default 1.5% would hold 32 lines). Only the dataset, the directory and the run's
    length change."""
    from lsm_gnn.cli import main
    from lsm_gnn.data.bipartite import generate_bipartite

    ds = generate_bipartite(tmp_path / "recsys", num_users=943, num_items=1682, avg_interactions=165, feature_dim=4,
                            val_fraction=0.1, progress=False)
    assert 95_000 < ds.num_edges // 2 + len(ds.edge_split("test")) + len(ds.edge_split("val")) < 110_000
    args = _documented("link_prediction.md", "LightGCN")
    assert "model.kind=lightgcn" in args and not any("capacity" in a for a in args)
    args = [a.replace("data/recsys", str(ds.path)).replace("runs/lightgcn", str(tmp_path / "run")) for a in args]
    assert main(["train", *args, "train.max_iterations=2", "log.progress=false", "--json",
                 str(tmp_path / "r.json")]) == 0


def test_a_one_type_graphs_fanouts_are_its_one_relations(graph, tmp_path):
    """The config's fanouts take their keyed form once, a one-type graph's under its one relation (which
    sampler.relation_fanouts may name); evaluation's and the working set's bound read that form."""
    from lsm_gnn.data import open_dataset
    from lsm_gnn.sizing import batch_rows_bound, working_set_bound
    from lsm_gnn.tasks.options import eval_fanouts, relation_fanouts

    dataset = open_dataset(graph)
    cfg = config(graph, tmp_path, "train.eval_fanouts=[5, 5]", "train.eval_splits=[val]")
    fanouts = relation_fanouts(cfg, dataset)
    assert fanouts == {"node__to__node": [4, 2]} and eval_fanouts(cfg, fanouts) == {"node__to__node": [5, 5]}
    assert working_set_bound(cfg, dataset) == max(64 * 5 * 3, 64 * 6 * 6)  # training's batch, evaluation's
    assert batch_rows_bound(10, {"a": [2, 1], "b": [3, 0]}) == 10 * 6 * 2
    assert batch_rows_bound(10, {"a": [2, -1]}) is None
    named = config(graph, tmp_path, "sampler.relation_fanouts.node__to__node=[3, 3]")
    assert relation_fanouts(named, dataset) == {"node__to__node": [3, 3]}
    with pytest.raises(ConfigError, match=r"names \['node__cites__node'\], which .* its relations: node__to__node"):
        relation_fanouts(config(graph, tmp_path, "sampler.relation_fanouts.node__cites__node=[3, 3]"), dataset)
