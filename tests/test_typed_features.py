"""Every node type's features through one cache budget return exactly the files' rows."""
import numpy as np
import pytest
import torch

from lsm_gnn import open_storage
from lsm_gnn.build import (CacheSize, FeatureSpec, build_features, feature_groups, group_sizes, group_weights, resolve,
                           split_capacity)
from lsm_gnn.cache import PolicyConfig, WindowBuffer
from lsm_gnn.config import load_config
from lsm_gnn.data import HeteroDatasetWriter
from lsm_gnn.storage.concat import ConcatStorage

TYPES = {"paper": {"num_nodes": 300, "feature_dim": 8},
         "institute": {"num_nodes": 20},
         "author": {"num_nodes": 250, "feature_dim": 8},
         "fos": {"num_nodes": 40, "feature_dim": 3, "feature_dtype": "float16"}}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    rng = np.random.default_rng(1)
    with HeteroDatasetWriter(tmp_path_factory.mktemp("typed") / "ds", node_types=TYPES, target="paper") as w:
        for t, spec in TYPES.items():
            if "feature_dim" in spec:
                w.write_features(t, rng.standard_normal((spec["num_nodes"], spec["feature_dim"])))
                w.write_score(t, "degree", rng.random(spec["num_nodes"]))
        w.write_edges(("author", "writes", "paper"), [(rng.integers(0, 250, 900), rng.integers(0, 300, 900))])
        w.write_labels("paper", rng.integers(0, 3, 300), num_classes=3)
        w.write_split("paper", "train", np.arange(200))
        return w.commit()


def spec(dataset, source="cache", capacity=12_000, policy="hybrid", pvp=False, fanouts=None):
    """Each feature group's cache a share of ``capacity`` bytes of 4 ways: by the groups' bytes, or by the bytes
    batches sampled with ``fanouts`` (of 50 seeds) gather from them."""
    groups, budget = feature_groups(dataset), CacheSize(str(capacity), "cache.capacity", capacity, None)
    sizes = group_sizes(dataset, groups, budget, 4, group_weights(dataset, groups, fanouts, batch_size=50))
    return FeatureSpec(source=source, backend="pread", size=budget, feature_sizes=sizes,
                       ways=4, policy=PolicyConfig(policy, window=4),
                       static_score="degree" if source == "cache" else None, oversubscribe=False, pvp=pvp,
                       pvp_queue_capacity=16, pvp_reinstall=pvp, shared=False,
                       owner="modulo")


def batches(rng, count):
    """Per type, distinct ids skewed toward low ones (so lines are reused), and types missing from some."""
    out = []
    for k in range(count):
        nodes = {}
        for t, n in (("paper", 300), ("author", 250), ("fos", 40), ("institute", 20)):
            if t == "fos" and k % 3 == 0:
                continue
            draws = 15 if t == "fos" else 40  # fewer than the fos cache's 24 lines
            nodes[t] = torch.from_numpy(np.unique((rng.pareto(1.2, draws) * 10).astype(np.int64) % n))
        out.append(nodes)
    return out


def test_types_of_one_row_format_share_a_group(dataset):
    assert feature_groups(dataset) == [["paper", "author"], ["fos"]]


@pytest.mark.parametrize("source,policy,pvp", [("memory", "hybrid", False), ("storage", "hybrid", False),
                                               ("cache", "hybrid", False), ("cache", "lru", False),
                                               ("cache", "hybrid", True)])
def test_every_type_gathers_the_files_rows(dataset, source, policy, pvp):
    features = build_features(spec(dataset, source, policy=policy, pvp=pvp), dataset, torch.device("cpu"))
    rng = np.random.default_rng(2)
    trace = batches(rng, 24)
    windows = [WindowBuffer(5, group.features.num_rows) for group in features.groups]
    for k, nodes in enumerate(trace):
        for window in windows:  # the window holds the batches after this one
            while len(window):
                window.pop()
        for future in trace[k + 1:k + 5]:
            for window, ids in zip(windows, features.group_ids(future)):
                window.push(ids)
        rows, hits = features.gather(nodes, future=windows)
        assert set(rows) == set(nodes) - {"institute"}, "featureless types are left out"
        for t, x in rows.items():
            expected = dataset.node_type(t).read_features_direct(nodes[t].numpy())
            assert torch.equal(x, torch.from_numpy(expected)), f"batch {k}: {t} rows differ from its file"
            assert hits[t].shape == nodes[t].shape
        features.prefetch()
    features.settle()
    hit_total = sum(int(h.sum()) for h in hits.values())
    if source == "cache":
        assert hit_total > 0 and features.caches
        shares = [g.features.capacity_bytes for g in features.groups]
        assert sum(shares) <= 12_000 and all(shares)
        assert all(g.features.stats.evictions > 0 for g in features.groups), "every group's cache must evict"
    else:
        assert hit_total == 0 and not features.caches
    assert ("bytes_read" in features.counters()) and "+" in features.describe()


def test_capacity_in_percent_is_a_share_of_all_feature_bytes(dataset):
    total = 300 * 32 + 250 * 32 + 40 * 6
    cfg = load_config(None, [f"dataset={dataset.path}", "cache.capacity=10%", "cache.static_score=degree"])
    assert resolve(cfg, dataset).size.bytes == round(0.1 * total)
    cfg = load_config(None, [f"dataset={dataset.path}", "cache.static_score=reverse_pagerank"])
    with pytest.raises(Exception, match="cache.static_score='reverse_pagerank' is not in the dataset"):
        resolve(cfg, dataset)


def test_split_capacity():
    assert split_capacity(1000, [3, 1]) == [750, 250]
    # a share under its floor gets the floor out of the others' (split again by weight), never beyond the budget
    assert split_capacity(1000, [3, 1, 0], floors=[0, 0, 100]) == [675, 225, 100]
    assert split_capacity(1000, [3, 1], floors=[600, 600]) == [600, 600]  # the caller refuses that budget
    with pytest.raises(ValueError, match="positive sum"):
        split_capacity(1000, [0, 0])


def test_concat_storage(dataset):
    paper = open_storage(dataset.node_type("paper"), "memory")
    author = open_storage(dataset.node_type("author"), "pread")
    both = ConcatStorage([paper, author], ["paper", "author"])
    assert both.num_rows == 550 and both.offset("author") == 300
    ids = torch.tensor([549, 0, 300, 299, 0])
    expected = np.concatenate([dataset.node_type("author").read_features_direct([249]),
                               dataset.node_type("paper").read_features_direct([0]),
                               dataset.node_type("author").read_features_direct([0]),
                               dataset.node_type("paper").read_features_direct([299, 0])])
    assert torch.equal(both.read(ids), torch.from_numpy(expected))
    assert both.stats().rows == 5
    out = torch.zeros((8, both.dim), dtype=both.dtype)  # the direct miss path: each part into its slots
    slots = torch.tensor([7, 1, 4, 0, 2])
    both.read_into(ids[:4], out, slots[:4])
    assert torch.equal(out[slots[:4]], torch.from_numpy(expected[:4])) and not out[[2, 3, 5, 6]].any()
    with pytest.raises(IndexError, match="550 .* paper \\+ author"):
        both.read_into(torch.tensor([550]), out, torch.tensor([0]))
    with pytest.raises(IndexError, match="550 .* paper \\+ author"):
        both.read(torch.tensor([550]))
    fos = open_storage(dataset.node_type("fos"), "memory")
    with pytest.raises(ValueError, match="'fos' has rows of 3 x float16"):
        ConcatStorage([paper, fos], ["paper", "fos"])


def test_groups_share_the_budget_by_measured_accesses(dataset):
    from lsm_gnn.sampling.hotness import sampled_type_accesses

    rows = sampled_type_accesses(dataset, [3, 2], 50, num_batches=4)
    assert rows["paper"] > 0 and rows["author"] > 0 and rows["fos"] == 0  # no relation reaches fos
    sampled = spec(dataset, capacity=8_000, fanouts=[3, 2])
    assert [s.bytes for s in sampled.feature_sizes] == [8_000 - 4 * 6, 4 * 6]  # fos: one set, out of the budget
    features = build_features(sampled, dataset, torch.device("cpu"))
    big, small = (g.features for g in features.groups)
    assert big.capacity_bytes <= 8_000 - 24 and small.num_lines == small.ways  # fos: just one set
    by_bytes = build_features(spec(dataset, capacity=8_000), dataset, torch.device("cpu"))
    assert by_bytes.groups[1].features.num_lines > small.num_lines  # by file bytes fos would get more


def test_resolve_sizes_every_cache_once_with_its_key(tmp_path):
    from lsm_gnn.cache import every_row_sets
    from lsm_gnn.embedding import RowLayout
    from lsm_gnn.testing import write_tiny_dataset

    ds, _ = write_tiny_dataset(tmp_path / "one", num_nodes=200, dim=8)
    cfg = load_config(None, [f"dataset={ds.path}", "cache.capacity=25%", "cache.static_score=none"])
    spec = resolve(cfg, ds)
    assert spec.size == CacheSize("25%", "cache.capacity", 50 * 8 * 4, 1) and spec.embedding_sizes == {}
    assert spec.feature_sizes == (spec.size,)  # a one-type graph: the budget is its one cache's
    # Node embeddings: their own cache, sized in their own rows, named by their own key; the default is the
    # features' share where every batch fits it (8 seeds and 2 neighbours each: 24 rows at most, one set of 32),
    # else raised to the whole sets that hold the most rows a batch can read (training's or evaluation's), at most
    # every row (the default fanouts reach more than the table's 200).
    row_bytes = RowLayout(16, "float32", "adagrad").row_bytes
    embedding = [f"dataset={ds.path}", "cache.capacity=25%", "cache.static_score=none", "model.node_embedding.dim=16",
                 "model.node_embedding.optimizer=adagrad", f"checkpoint.dir={tmp_path}"]
    node = ds.node_types[0]
    small = ["sampler.fanouts=[2]", "sampler.batch_size=8"]
    for batches, (text, lines, sets) in [(small, ("25%", 50, 1)),
                                         ([*small, "train.eval_batch_size=24"], ("48%", 96, 3)),  # 72 rows
                                         ([], ("100%", 200, every_row_sets(200, 32)))]:
        size = CacheSize(text, "model.node_embedding.capacity", lines * row_bytes, sets)
        assert resolve(load_config(None, [*embedding, *batches]), ds).embedding_sizes == {node: size}
    cfg = load_config(None, [f"dataset={ds.path}", "cache.capacity=25%", "cache.static_score=none", "model.node_embedding.dim=16",
                             "model.node_embedding.optimizer=adagrad", "model.node_embedding.capacity=100%",
                             f"checkpoint.dir={tmp_path}"])
    assert resolve(cfg, ds).embedding_sizes == {node: CacheSize("100%", "model.node_embedding.capacity",
                                                                200 * row_bytes, every_row_sets(200, 32))}


def test_a_graph_of_one_type_is_keyed_by_its_one_type(tmp_path):
    """A one-type graph's features are one group of one type, gathered by {type: ids} like any: the same rows
    and hit mask as its cache alone."""
    from lsm_gnn.loader import keyed_features
    from lsm_gnn.testing import write_tiny_dataset

    ds, array = write_tiny_dataset(tmp_path / "one")
    cfg = load_config(None, [f"dataset={ds.path}", "cache.capacity=50%", "cache.backend=pread"])
    features = build_features(resolve(cfg, ds), ds, torch.device("cpu"))
    assert features.dims() == {"node": ds.feature_dim} and keyed_features(features, "node") is features
    ids = torch.tensor([5, 1, 7, 3])
    rows, hits = features.gather({"node": ids})
    assert torch.equal(rows["node"], torch.from_numpy(array[ids.numpy()]))
    assert hits["node"].shape == (4,) and not bool(hits["node"].any())  # a cold cache
    alone, alone_hits = features.only.gather(ids)
    assert torch.equal(alone, rows["node"]) and bool(alone_hits.all())  # now cached
    assert features.describe() == f"node: {features.only.describe()}"
    assert features.describe(lambda types: None) == features.only.describe()  # a one-type graph's words
    wrapped = keyed_features(features.only, "node")  # a bare source handed in: one group of its one type
    assert wrapped.only is features.only and wrapped.group_of == {"node": 0}
    with pytest.raises(TypeError, match="features must implement lsm_gnn.features.Features"):
        keyed_features(object(), "node")


class _Table:
    """What the windows read of a trainable source: its table's rows."""

    def __init__(self, num_rows):
        self.source = type("Rows", (), {"num_rows": num_rows})()


@pytest.mark.parametrize("trainable,windows", [
    ({"paper": 300}, 3),       # a type of a shared group: its own ids, its own window
    ({"fos": 40}, 2),          # a type alone in its group: the group's id space, the group's window
    ({"institute": 20, "fos": 40}, 3)])
def test_trainable_rows_plan_with_one_window_per_id_space(dataset, trainable, windows):
    features = build_features(spec(dataset, "memory"), dataset, torch.device("cpu"))
    for t, rows in trainable.items():
        features.add_trainable(t, _Table(rows))
    nodes = {"paper": torch.tensor([1, 2]), "author": torch.tensor([3]), "fos": torch.tensor([4]),
             "institute": torch.tensor([5])}
    ids = features.window_ids(nodes)
    assert len(ids) == len(features.window_rows()) == windows
    for t, w in features._trainable_windows().items():
        assert torch.equal(ids[w], nodes[t]) and features.window_rows()[w] == trainable[t]


def test_one_source_is_only_for_one_group(dataset):
    with pytest.raises(ValueError, match="pick one of .groups"):
        build_features(spec(dataset), dataset, torch.device("cpu")).only


def test_a_typed_graph_takes_a_bare_features_as_its_target_types(dataset):
    from lsm_gnn.loader import NodeLoader

    loader = NodeLoader(dataset, open_storage(dataset.node_type("paper"), "pread"), [2], 10, window=0)
    batch = next(iter(loader))
    loader.close()
    assert list(batch.x) == ["paper"] and torch.equal(
        batch.x["paper"], torch.from_numpy(dataset.node_type("paper").read_features_direct(
            batch.input_nodes["paper"].numpy())))
    with pytest.raises(ValueError, match="no node type 'venue'"):
        NodeLoader(dataset, build_features(spec(dataset), dataset, torch.device("cpu")), [2], 10, target="venue")


@pytest.fixture(scope="module")
def one_type(tmp_path_factory):
    from lsm_gnn.testing import write_tiny_dataset

    return write_tiny_dataset(tmp_path_factory.mktemp("one") / "ds", num_nodes=200, dim=8)[0]  # rows of 32 bytes


@pytest.mark.parametrize("graph,overrides,refusal", [
    ("one_type", ["cache.capacity=0.5%"],
     r"cache\.capacity=0\.5% is 1 lines of 32 bytes, fewer than one set of cache\.ways=32; set cache\.capacity=17%"),
    ("one_type", ["cache.capacity=25%", "model.node_embedding.dim=16", "model.node_embedding.capacity=1K"],
     r"model\.node_embedding\.capacity=1K is \d+ lines of \d+ bytes, fewer than one set of cache\.ways=32"),
    # the budget its two row formats' caches share cannot give both one set (4 lines of 32 bytes, 4 of 6): refused,
    # not raised (each group's floor comes out of the others' shares)
    ("dataset", ["cache.capacity=100", "cache.ways=4"],
     r"cache\.capacity=100 is 100 bytes, less than one set of cache\.ways=4 lines in each of its 2 feature caches"),
    ("dataset", ["cache.capacity=50%", "cache.ways=4", "model.node_embedding.dim=8",
                 "model.node_embedding.institute.capacity=10%"],
     r"model\.node_embedding\.institute\.capacity=10% is 2 lines of \d+ bytes, fewer than one set of cache\.ways=4"),
])
def test_a_cache_under_one_set_is_refused_naming_its_key_on_every_graph(request, tmp_path, graph, overrides, refusal):
    """One floor rule for every cache of every graph: a size the user gave is never raised to one set; resolve()
    refuses it naming the cache's key and a value that makes one, and that value resolves."""
    import re

    from lsm_gnn.config import ConfigError

    ds = request.getfixturevalue(graph)
    base = [f"dataset={ds.path}", "cache.static_score=none", f"checkpoint.dir={tmp_path}", *overrides]
    with pytest.raises(ConfigError, match=refusal) as info:
        resolve(load_config(None, base), ds)
    key, value = re.search(r"set (\S+)=(\S+) or more", str(info.value)).groups()
    spec = resolve(load_config(None, [*base, f"{key}={value}"]), ds)
    sizes = [s for s in (*spec.feature_sizes, *spec.embedding_sizes.values()) if s.key == key]
    assert sizes and all(s.sets >= 1 and s.text == value for s in sizes)


@pytest.mark.parametrize("key,text", [("cache.capacity", "25%"), ("model.node_embedding.capacity", "40%")])
def test_a_batch_refused_mid_run_names_the_key_of_the_cache_that_overflowed(one_type, tmp_path, key, text):
    from lsm_gnn.cache import CacheTooSmall
    from lsm_gnn.config import ConfigError
    from lsm_gnn.training.startup import sized

    cfg = load_config(None, [f"dataset={one_type.path}", "cache.capacity=25%", "cache.static_score=none",
                             "model.node_embedding.dim=16", "model.node_embedding.capacity=40%",
                             f"checkpoint.dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"^at iteration 3, a batch has 70 distinct nodes") as info:
        with sized(cfg, resolve(cfg, one_type), "at iteration 3", checked=True):
            raise CacheTooSmall(70, 64, 32, key)
    assert f"the cache holds 64 lines ({key}={text}); set {key}=" in str(info.value)
