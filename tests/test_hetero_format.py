"""Schema-2 (heterogeneous) datasets: the writer's round trip, storage per node type, and a clear error
naming the node type or relation for every malformed case."""
import json
import os
import shutil

import numpy as np
import pytest
import torch

from lsm_gnn import open_storage
from lsm_gnn.data import Dataset, DatasetError, HeteroDatasetWriter, open_dataset

TYPES = {"paper": 60, "author": 45, "institute": 7}


def edges(rng, num_src, num_dst, count):
    return rng.integers(0, num_src, count), rng.integers(0, num_dst, count)


def dense_rows(src, dst, num_dst):
    """Each dst node's sorted, distinct sources: what the CSR must hold."""
    rows = [set() for _ in range(num_dst)]
    for s, d in zip(src.tolist(), dst.tolist()):
        rows[d].add(s)
    return [sorted(r) for r in rows]


def csr_rows(indptr, indices):
    return [sorted(indices[indptr[v]:indptr[v + 1]].tolist()) for v in range(len(indptr) - 1)]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A small IGBH-shaped dataset and everything that went into it."""
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("hetero") / "ds"
    data = {
        "paper": rng.standard_normal((TYPES["paper"], 20)).astype(np.float32),
        "author": rng.standard_normal((TYPES["author"], 7)).astype(np.float16),
        "cites": edges(rng, TYPES["paper"], TYPES["paper"], 200),
        "writes": edges(rng, TYPES["author"], TYPES["paper"], 150),
        "affiliated": edges(rng, TYPES["author"], TYPES["institute"], 40),
        "labels": rng.integers(-1, 4, TYPES["paper"]),
        "train": np.arange(0, 30), "val": np.arange(30, 45),
        "rank": rng.random(TYPES["author"]).astype(np.float32),
    }
    node_types = {"paper": {"num_nodes": 60, "feature_dim": 20},
                  "author": {"num_nodes": 45, "feature_dim": 7, "feature_dtype": "float16"},
                  "institute": {"num_nodes": 7}}
    with HeteroDatasetWriter(path, node_types=node_types, target="paper") as w:
        for start in range(0, 60, 25):  # in chunks, interleaved with the other type
            w.write_features("paper", data["paper"][start:start + 25])
            w.write_features("author", data["author"][start:start + 25])
        w.write_edges(("paper", "cites", "paper"), [data["cites"]])
        w.write_edges("author__writes__paper", [data["writes"]])
        src, dst = data["writes"]
        w.write_edges(("paper", "written_by", "author"), [(dst, src)])
        indptr = np.zeros(8, dtype=np.int64)
        rows = dense_rows(*data["affiliated"], 7)
        indptr[1:] = np.cumsum([len(r) for r in rows])
        w.write_csr(("author", "affiliated_with", "institute"), indptr, np.array(sum(rows, []), dtype=np.int64))
        w.write_labels("paper", data["labels"], num_classes=4)
        w.write_split("paper", "train", data["train"])
        w.write_split("paper", "val", data["val"])
        w.write_score("author", "degree", data["rank"])
        dataset = w.commit()
    return dataset, data


def test_round_trip(written):
    ds, data = written
    assert isinstance(ds, Dataset) and isinstance(open_dataset(ds.path), Dataset) and not ds.is_homogeneous
    assert ds.node_types == ["paper", "author", "institute"] and {t: ds.num_nodes_of(t) for t in ds.node_types} == TYPES
    assert ds.relations == [("paper", "cites", "paper"), ("author", "writes", "paper"),
                            ("paper", "written_by", "author"), ("author", "affiliated_with", "institute")]
    assert ds.offsets == {"paper": 0, "author": 60, "institute": 105} and ds.num_nodes == 112
    with pytest.raises(ValueError, match="has 4 relations; name one of: paper__cites__paper"):
        ds.indptr  # the one-relation shorthand asks which
    assert ds.target == "paper" and ds.feature_types == ["paper", "author"]
    for name, rel, num_dst in (("cites", ("paper", "cites", "paper"), 60),
                               ("writes", ("author", "writes", "paper"), 60),
                               ("affiliated", ("author", "affiliated_with", "institute"), 7)):
        assert csr_rows(*ds.csr(rel)) == dense_rows(*data[name], num_dst), name
    src, dst = data["writes"]
    assert csr_rows(*ds.csr("paper__written_by__author")) == dense_rows(dst, src, 45)
    assert ds.csr(("paper", "cites", "paper"))[1].dtype == np.int32  # small types: half the bytes
    np.testing.assert_array_equal(ds.labels(), data["labels"])
    assert ds.num_classes("paper") == 4 and ds.labels("author") is None
    np.testing.assert_array_equal(ds.split("train"), data["train"])
    np.testing.assert_array_equal(ds.score("degree", "author"), data["rank"])
    ds.verify_checksums()


def test_every_featured_type_reads_its_own_rows(written):
    ds, data = written
    for name in ("paper", "author"):
        node_type = ds.node_type(name)
        ids = np.array([0, 3, 3, node_type.num_nodes - 1])
        np.testing.assert_array_equal(node_type.read_features_direct(ids), data[name][ids])
        for backend in ("pread", "memory"):
            with open_storage(node_type, backend) as storage:
                assert torch.equal(storage.read(torch.from_numpy(ids)), torch.from_numpy(data[name][ids]))
    with pytest.raises(ValueError, match="node type 'institute'.*no features"):
        ds.node_type("institute").feature_path


def copy_with(written, tmp_path, edit):
    """A copy of the dataset whose meta.json ``edit`` changed (returns the copy's path)."""
    ds, _ = written
    target = tmp_path / "copy"
    shutil.copytree(ds.path, target)
    with open(target / "meta.json") as f:
        meta = json.load(f)
    edit(meta, target)
    with open(target / "meta.json", "w") as f:
        json.dump(meta, f)
    return target


def relation(meta, name):
    return next(r for r in meta["relations"] if r["name"] == name)


def node_entry(meta, name):
    return next(e for e in meta["node_types"] if e["name"] == name)


def swap_feature_files(meta, path):
    paper, author = node_entry(meta, "paper"), node_entry(meta, "author")
    paper["features"]["file"], author["features"]["file"] = author["features"]["file"], paper["features"]["file"]


def short_indptr(meta, path):
    indptr = np.load(path / relation(meta, "writes")["indptr"])
    np.save(path / relation(meta, "writes")["indptr"], indptr[:-1])


@pytest.mark.parametrize("edit, match", [
    (lambda m, p: relation(m, "writes").update(src="venue"), "relation 'venue__writes__paper'.*'venue'"),
    (lambda m, p: relation(m, "cites").update(name="a__b"), "relation 'paper__a__b__paper'"),
    (short_indptr, r"relations/author__writes__paper/indptr.npy: the CSR indptr array has 60 entries, expected 61"),
    (swap_feature_files, r"nodes/author/features.bin: the feature file of node_types.paper is truncated"),
    (lambda m, p: node_entry(m, "author")["features"].update(dim=8), "node_types.author.features.row_bytes"),
    (lambda m, p: m["node_types"].append(dict(node_entry(m, "paper"))), "node type 'paper' is listed twice"),
    (lambda m, p: m.update(target="venue"), "target type 'venue'"),
    (lambda m, p: m.update(target="author"), "target type 'author' has no labels"),
    (lambda m, p: node_entry(m, "paper").update(num_classes=2), r"nodes/paper/labels.npy: label .* outside \[-1, 2\)"),
    (lambda m, p: node_entry(m, "paper").update(num_nodes=0), r"node_types.paper.num_nodes"),
    (lambda m, p: m.update(node_types=[]), "'node_types' must be a non-empty list"),
    (lambda m, p: relation(m, "affiliated_with").update(num_edges=1),
     r"affiliated_with__institute/indices.npy: .* expected 1"),
])
def test_malformed_datasets_name_the_type_or_relation(written, tmp_path, edit, match):
    path = copy_with(written, tmp_path, edit)
    with pytest.raises(DatasetError, match=match):
        open_dataset(path)


def test_neighbor_ids_beyond_the_source_type_are_caught(written, tmp_path):
    def corrupt(meta, path):
        name = relation(meta, "affiliated_with")["indices"]
        indices = np.load(path / name)
        indices[0] = 45  # an author id one past the last author
        np.save(path / name, indices)
    path = copy_with(written, tmp_path, corrupt)
    open_dataset(path, check="fast")  # the O(edges) scan is the full check's
    with pytest.raises(DatasetError, match="author__affiliated_with__institute/indices.npy: neighbor id .* 45"):
        open_dataset(path)


def test_writer_errors_name_the_type_or_relation(tmp_path):
    types = {"paper": {"num_nodes": 5, "feature_dim": 2}, "topic": {"num_nodes": 3}}
    with pytest.raises(ValueError, match="node type 'a b'"):
        HeteroDatasetWriter(tmp_path / "x", node_types={"a b": {"num_nodes": 1}})
    with pytest.raises(ValueError, match="node type 'topic' needs a positive num_nodes"):
        HeteroDatasetWriter(tmp_path / "x", node_types={"topic": {"num_nodes": 0}})
    with pytest.raises(ValueError, match="target type 'venue'"):
        HeteroDatasetWriter(tmp_path / "x", node_types=types, target="venue")
    with HeteroDatasetWriter(tmp_path / "ds", node_types=types, target="paper") as w:
        with pytest.raises(ValueError, match="node type 'topic' was declared without features"):
            w.write_features("topic", np.zeros((3, 2), np.float32))
        with pytest.raises(ValueError, match=r"feature rows of node type 'paper' must have shape \[k, 2\]"):
            w.write_features("paper", np.zeros((3, 3), np.float32))
        with pytest.raises(ValueError, match="relation 'paper__has__venue': its destination type 'venue'"):
            w.write_edges(("paper", "has", "venue"), [])
        with pytest.raises(ValueError, match="relation 'topic__of__paper': edge source 3 is outside"):
            w.write_edges(("topic", "of", "paper"), [(np.array([3]), np.array([0]))])
        w.write_edges(("paper", "has_topic", "topic"), [(np.array([0, 1]), np.array([2, 2]))])
        with pytest.raises(ValueError, match="relation 'paper__has_topic__topic' was already written"):
            w.write_edges(("paper", "has_topic", "topic"), [])
        with pytest.raises(ValueError, match="labels of node type 'paper' must have shape"):
            w.write_labels("paper", np.zeros(4, np.int64))
        w.write_features("paper", np.ones((5, 2), np.float32))
        with pytest.raises(DatasetError, match="target type 'paper' has no labels"):
            w.commit()
    assert not os.path.exists(tmp_path / "ds") and not [p for p in os.listdir(tmp_path) if p.startswith(".")]


def test_a_type_without_all_its_rows_is_refused(tmp_path):
    with HeteroDatasetWriter(tmp_path / "ds", node_types={"paper": {"num_nodes": 5, "feature_dim": 2}}) as w:
        w.write_features("paper", np.ones((4, 2), np.float32))
        w.write_edges(("paper", "cites", "paper"), [(np.array([0]), np.array([1]))])
        with pytest.raises(DatasetError, match="only 4 of 5 feature rows of node type 'paper'"):
            w.commit()
    assert not os.path.exists(tmp_path / "ds")


def test_reverse_and_self_loop_handling(tmp_path):
    """Equal ids of two different types are no self-loop: they are kept; within one type they may go."""
    types = {"user": {"num_nodes": 3}, "item": {"num_nodes": 3}}
    with HeteroDatasetWriter(tmp_path / "ds", node_types=types) as w:
        same = (np.array([0, 1]), np.array([0, 2]))
        w.write_edges(("user", "buys", "item"), [same], self_loops=False)
        w.write_edges(("user", "follows", "user"), [same], self_loops=False)
        ds = w.commit()
    assert csr_rows(*ds.csr(("user", "buys", "item"))) == [[0], [], [1]]
    assert csr_rows(*ds.csr(("user", "follows", "user"))) == [[], [], [1]]


def test_inspect_shows_types_and_relations(written, capsys):
    import json as json_module

    from lsm_gnn.cli import main

    ds, _ = written
    assert main(["inspect", ds.path, "--verify"]) == 0
    text = capsys.readouterr().out
    assert "3 node types, 4 relations" in text and "author__writes__paper" in text and "checksums ok" in text
    assert main(["inspect", ds.path, "--json"]) == 0
    summary = json_module.loads(capsys.readouterr().out)
    assert summary["node_types"]["institute"]["features"] is None and summary["target"] == "paper"
    assert summary["relations"]["paper__cites__paper"]["num_edges"] == ds.num_edges_of(("paper", "cites", "paper"))
    assert summary["node_types"]["paper"]["splits"] == {"train": 30, "val": 15}
