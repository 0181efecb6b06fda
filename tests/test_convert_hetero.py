"""Heterogeneous converters: every source (numpy, memory maps, PyG, DGL, IGBH folders) gives the same dataset,
reverse relations and scores are right, and malformed input is refused naming its node type or relation."""
import os

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from lsm_gnn.data.convert_hetero import (
    hetero_from_dgl, hetero_from_igbh, hetero_from_numpy, hetero_from_pyg, hetero_scores, missing_reverses,
)
from lsm_gnn.data.scores import compute_scores

COUNTS = {"paper": 60, "author": 45, "fos": 9, "institute": 7}  # institute is featureless
CITES, WRITTEN_BY = ("paper", "cites", "paper"), ("paper", "written_by", "author")
AFFILIATED, TOPIC = ("author", "affiliated_to", "institute"), ("paper", "topic", "fos")
CLASSES = 5


@pytest.fixture(scope="module")
def graph():
    """A small IGBH-shaped graph: features of three dtypes and widths, parallel edges, unlabeled papers."""
    rng = np.random.default_rng(3)

    def edges(relation, count):
        src, _, dst = relation
        return rng.integers(0, COUNTS[src], count), rng.integers(0, COUNTS[dst], count)

    cites = edges(CITES, 200)
    cites[0][:10], cites[1][:10] = cites[0][10:20], cites[1][10:20]  # parallel edges
    labels = rng.integers(0, CLASSES, COUNTS["paper"])
    labels[::7] = -1
    return {
        "features": {"paper": rng.standard_normal((60, 13)).astype(np.float32),  # 52-byte rows, padded
                     "author": rng.standard_normal((45, 7)).astype(np.float16),
                     "fos": rng.integers(-5, 5, (9, 4)).astype(np.int8),
                     "institute": None},
        "num_nodes": {"institute": COUNTS["institute"]},
        "edges": {CITES: cites, WRITTEN_BY: edges(WRITTEN_BY, 150), AFFILIATED: edges(AFFILIATED, 40),
                  TOPIC: edges(TOPIC, 80)},
        "labels": {"paper": labels},
        "splits": {"paper": {"train": np.arange(0, 30), "val": np.arange(30, 45), "test": np.arange(45, 60)}},
    }


def _csr(src, dst, num_src, num_dst):
    """Reference CSR: dst's row lists its src neighbors, sorted, parallel edges merged."""
    matrix = sp.csr_matrix((np.ones(len(src)), (dst, src)), shape=(num_dst, num_src))
    matrix.sum_duplicates()
    matrix.sort_indices()
    return matrix.indptr.astype(np.int64), matrix.indices.astype(np.int64)


def _check_relation(ds, relation, src, dst):
    indptr, indices = _csr(src, dst, COUNTS[relation[0]], COUNTS[relation[2]])
    stored_indptr, stored_indices = ds.csr(relation)
    np.testing.assert_array_equal(stored_indptr, indptr, err_msg=str(relation))
    np.testing.assert_array_equal(stored_indices, indices, err_msg=str(relation))


def check_dataset(ds, graph, order=("paper", "author", "fos", "institute"), reverse=False, splits=True):
    """``ds`` holds exactly ``graph``: types, feature bytes, every relation's CSR, labels and splits."""
    assert ds.node_types == list(order)
    assert {t: ds.num_nodes_of(t) for t in ds.node_types} == {t: COUNTS[t] for t in order}
    for t, features in graph["features"].items():
        if features is None:
            assert ds.node_type(t).features is None
        else:
            stored = ds.node_type(t).read_features_direct(np.arange(COUNTS[t]))
            assert stored.dtype == features.dtype
            np.testing.assert_array_equal(stored, features)
    for relation, (src, dst) in graph["edges"].items():
        _check_relation(ds, relation, src, dst)
        if reverse:
            _check_relation(ds, (relation[2], "rev_" + relation[1], relation[0]), dst, src)
    assert len(ds.relations) == len(graph["edges"]) * (2 if reverse else 1)
    assert ds.target == "paper" and ds.num_classes("paper") == CLASSES
    np.testing.assert_array_equal(ds.labels("paper"), graph["labels"]["paper"])
    assert ds.labels("author") is None
    if splits:
        for split, ids in graph["splits"]["paper"].items():
            np.testing.assert_array_equal(ds.split(split, "paper"), ids)


@pytest.fixture(scope="module")
def reference(graph, tmp_path_factory):
    return hetero_from_numpy(tmp_path_factory.mktemp("ref") / "ds", **graph, progress=False)


# -- round trips ---------------------------------------------------------------------------

def test_numpy_round_trip_with_scores_on_every_type(graph, reference):
    check_dataset(reference, graph)
    for t in COUNTS:
        assert reference.score_names(t) == ["degree", "reverse_pagerank"]
        for score in ("degree", "reverse_pagerank"):
            values = reference.score(score, t)
            assert values.shape == (COUNTS[t],) and np.all(np.isfinite(values))
    assert reference.meta["converted"]["reverse_relations"] == []
    reference.verify_checksums()


def test_scores_are_those_of_the_union_of_relations_in_the_global_id_space(reference):
    offsets = reference.offsets
    rows, cols = [], []
    for relation in reference.relations:
        indptr, indices = reference.csr(relation)
        rows.append(np.repeat(np.arange(len(indptr) - 1), np.diff(indptr)) + offsets[relation[2]])
        cols.append(np.asarray(indices, dtype=np.int64) + offsets[relation[0]])
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    order = np.lexsort((cols, rows))
    indptr = np.zeros(reference.num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=reference.num_nodes), out=indptr[1:])
    expected = compute_scores(indptr, cols[order])
    computed = hetero_scores(reference)
    for t, n in ((t, reference.num_nodes_of(t)) for t in reference.node_types):
        np.testing.assert_array_equal(computed[t]["degree"], expected["degree"][offsets[t]:offsets[t] + n])
        np.testing.assert_allclose(computed[t]["reverse_pagerank"],
                                   expected["reverse_pagerank"][offsets[t]:offsets[t] + n], atol=1e-6)
        np.testing.assert_array_equal(reference.score("degree", t), computed[t]["degree"])
    leftovers = [n for n in os.listdir(os.path.dirname(reference.path)) if n != os.path.basename(reference.path)]
    assert leftovers == []  # the union's temporary CSR is gone


def test_edges_as_arrays_string_keys_and_tensors_give_the_same_dataset(graph, tmp_path):
    edges = {"paper__cites__paper": np.stack(graph["edges"][CITES]),
             WRITTEN_BY: tuple(torch.from_numpy(e) for e in graph["edges"][WRITTEN_BY]),
             AFFILIATED: torch.from_numpy(np.stack(graph["edges"][AFFILIATED])),
             TOPIC: [e.tolist() for e in graph["edges"][TOPIC]]}
    masks = {}
    for split, ids in graph["splits"]["paper"].items():
        masks[split] = np.zeros(60, dtype=bool)
        masks[split][ids] = True
    args = dict(graph, edges=edges, splits={"paper": masks}, scores=(), progress=False)
    check_dataset(hetero_from_numpy(tmp_path / "ds", **args), graph)


def test_add_reverse_adds_rev_relations_only_where_missing(graph, tmp_path):
    ds = hetero_from_numpy(tmp_path / "rev", **graph, add_reverse=True, scores=(), progress=False)
    check_dataset(ds, graph, reverse=True)
    assert ds.relations[4:] == [("paper", "rev_cites", "paper"), ("author", "rev_written_by", "paper"),
                                ("institute", "rev_affiliated_to", "author"), ("fos", "rev_topic", "paper")]
    assert ds.meta["converted"]["reverse_relations"][1] == "author__rev_written_by__paper"
    # a relation whose reverse is given gets none; the reverse of rev_<r> is <r>
    given = [CITES, WRITTEN_BY, ("author", "rev_written_by", "paper"), ("fos", "rev_topic", "paper")]
    assert missing_reverses(given) == {("paper", "rev_cites", "paper"): CITES,
                                       TOPIC: ("fos", "rev_topic", "paper")}


def test_memory_mapped_inputs_convert_in_small_chunks(graph, reference, tmp_path, monkeypatch):
    import lsm_gnn.data.convert as convert

    monkeypatch.setattr(convert, "FEATURE_CHUNK_BYTES", 13 * 4 * 7)  # 7 paper rows a chunk: a ragged end
    monkeypatch.setattr(convert, "EDGE_CHUNK", 33)

    def mapped(name, array):
        np.save(tmp_path / f"{name}.npy", array)
        return np.load(tmp_path / f"{name}.npy", mmap_mode="r")

    features = {t: None if x is None else mapped(t, x) for t, x in graph["features"].items()}
    edges = {rel: mapped(rel[1], np.stack(pair, axis=1)).T for rel, pair in graph["edges"].items()}  # (E, 2)
    args = dict(graph, features=features, edges=edges, labels={"paper": mapped("y", graph["labels"]["paper"])},
                scores=(), progress=False)
    ds = hetero_from_numpy(tmp_path / "ds", **args)
    check_dataset(ds, graph)
    for relation in ds.relations:
        for stored, expected in zip(ds.csr(relation), reference.csr(relation)):
            np.testing.assert_array_equal(stored, expected)


def test_feature_dtype_per_type(graph, tmp_path):
    ds = hetero_from_numpy(tmp_path / "ds", **graph, feature_dtype={"paper": "float16"}, scores=(),
                           progress=False)
    assert ds.node_type("paper").feature_dtype == np.float16 and ds.node_type("author").feature_dtype == np.float16
    np.testing.assert_array_equal(ds.node_type("paper").read_features_direct(np.arange(60)),
                                  graph["features"]["paper"].astype(np.float16))
    assert ds.node_type("fos").feature_dtype == np.int8


def test_random_split_of_the_labeled_target_nodes(graph, tmp_path):
    args = dict(graph, splits=None, random_split_fractions=(0.5, 0.25, 0.25), seed=4, scores=(), progress=False)
    ds = hetero_from_numpy(tmp_path / "ds", **args)
    chosen = np.concatenate([ds.split(s) for s in ("train", "val", "test")])
    np.testing.assert_array_equal(np.sort(chosen), np.flatnonzero(graph["labels"]["paper"] >= 0))


def test_from_pyg(graph, reference, tmp_path):
    from torch_geometric.data import HeteroData

    data = HeteroData()
    for t, n in COUNTS.items():
        if graph["features"][t] is None:
            data[t].num_nodes = n
        else:
            data[t].x = torch.from_numpy(graph["features"][t])
    data["paper"].y = torch.from_numpy(graph["labels"]["paper"])
    for split, ids in graph["splits"]["paper"].items():
        mask = torch.zeros(60, dtype=torch.bool)
        mask[ids] = True
        data["paper"][f"{split}_mask"] = mask
    for relation, pair in graph["edges"].items():
        data[relation].edge_index = torch.from_numpy(np.stack(pair))
    ds = hetero_from_pyg(tmp_path / "pyg", data, scores=(), progress=False)  # target: the only type with y
    check_dataset(ds, graph)
    assert ds.meta["converted"]["from"] == "pyg"


def _dgl():
    try:
        import dgl
    except Exception as exc:  # a DGL build that does not match torch fails in many ways
        pytest.skip(f"dgl cannot be imported: {exc}")
    return dgl


def test_from_dgl(graph, tmp_path):
    dgl = _dgl()
    g = dgl.heterograph({rel: tuple(torch.from_numpy(e) for e in pair) for rel, pair in graph["edges"].items()},
                        num_nodes_dict=COUNTS)
    for t, features in graph["features"].items():
        if features is not None:
            g.nodes[t].data["feat"] = torch.from_numpy(features)
    g.nodes["paper"].data["label"] = torch.from_numpy(graph["labels"]["paper"])
    for split, ids in graph["splits"]["paper"].items():
        mask = torch.zeros(60, dtype=torch.bool)
        mask[ids] = True
        g.nodes["paper"].data[f"{split}_mask"] = mask
    ds = hetero_from_dgl(tmp_path / "dgl", g, scores=(), progress=False)
    check_dataset(ds, graph, order=sorted(COUNTS))  # DGL sorts its node types


def write_igbh(graph, root, split_files=True):
    """``graph`` as IGB lays it out: (E, 2) edge files, float labels, paper features headerless (sizes large
    and full), institute without files (its count is passed)."""
    folder = root / "tiny" / "processed"
    for t, features in graph["features"].items():
        if features is not None:
            (folder / t).mkdir(parents=True)
            if t == "paper":
                features.tofile(folder / t / "node_feat.npy")
            else:
                np.save(folder / t / "node_feat.npy", features)
    labels = graph["labels"]["paper"].astype(np.float32)
    np.save(folder / "paper" / "node_label_19.npy", np.where(labels < 0, np.nan, labels))
    np.save(folder / "paper" / "node_label_2K.npy", np.where(labels < 0, np.nan, (labels + 1) % CLASSES))
    for relation, pair in graph["edges"].items():
        (folder / "__".join(relation)).mkdir()
        np.save(folder / "__".join(relation) / "edge_index.npy", np.stack(pair, axis=1))
    if split_files:
        for split, ids in graph["splits"]["paper"].items():
            np.save(folder / "paper" / f"{split}_idx.npy", ids)
    return folder


def test_from_igbh_reads_igb_layout_with_reverse_relations(graph, tmp_path):
    write_igbh(graph, tmp_path / "igbh")
    ds = hetero_from_igbh(tmp_path / "ds", tmp_path / "igbh", size="tiny", num_nodes={"institute": 7},
                          raw_feature_dim=13, scores=(), progress=False)
    check_dataset(ds, graph, order=("paper", "author", "fos", "institute"), reverse=True)
    assert ds.meta["converted"]["label_file"] == "node_label_19.npy"  # the first, sorted


def test_from_igbh_chooses_labels_by_classes_and_draws_a_split(graph, tmp_path):
    write_igbh(graph, tmp_path / "igbh", split_files=False)
    ds = hetero_from_igbh(tmp_path / "ds", tmp_path / "igbh", num_classes=2983, num_nodes={"institute": 7},
                          raw_feature_dim=13, add_reverse=False, split_fractions=(0.6, 0.2, 0.2), scores=(),
                          progress=False)  # the only size is found
    labels = graph["labels"]["paper"]
    np.testing.assert_array_equal(ds.labels(), np.where(labels < 0, -1, (labels + 1) % CLASSES))
    assert ds.num_classes() == 2983 and len(ds.relations) == 4
    chosen = np.concatenate([ds.split(s) for s in ("train", "val", "test")])
    np.testing.assert_array_equal(np.sort(chosen), np.flatnonzero(labels >= 0))
    assert len(ds.split("train")) == round(0.6 * chosen.size)


def test_igbh_folders_that_do_not_fit_are_explained(graph, tmp_path):
    folder = write_igbh(graph, tmp_path / "igbh")
    with pytest.raises(ValueError, match=r"no large/processed folder; sizes found: tiny"):
        hetero_from_igbh(tmp_path / "ds", tmp_path / "igbh", size="large")
    with pytest.raises(ValueError, match=r"relation 'author__affiliated_to__institute': its destination type "
                                         r"'institute' is not a node type .*num_nodes=\{'institute': n\}"):
        hetero_from_igbh(tmp_path / "ds", tmp_path / "igbh", raw_feature_dim=13, progress=False)
    with pytest.raises(ValueError, match=r"node_feat.npy is neither a .npy file nor headerless float32 rows of 1024"):
        hetero_from_igbh(tmp_path / "ds", tmp_path / "igbh", num_nodes={"institute": 7}, progress=False)
    with pytest.raises(ValueError, match=r"no label file for num_classes=7 \(node_label_7.npy\); its label files "
                                         r"are node_label_19.npy, node_label_2K.npy: pass label_file="):
        hetero_from_igbh(tmp_path / "ds", folder, num_classes=7, raw_feature_dim=13, progress=False)
    (tmp_path / "empty" / "processed").mkdir(parents=True)
    with pytest.raises(ValueError, match="unknown layout, found 0 node type"):
        hetero_from_igbh(tmp_path / "ds", tmp_path / "empty")
    assert not os.path.exists(tmp_path / "ds")


# -- errors --------------------------------------------------------------------------------

def _with(graph, **change):
    """The graph's arguments with ``change`` merged into its dicts (a value of None drops the key)."""
    args = {key: dict(value) for key, value in graph.items()}
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(args.get(key), dict):
            args[key].update(value)
            args[key] = {k: v for k, v in args[key].items() if not (v is None and key != "features")}
        else:
            args[key] = value
    return args


def _shifted(pair, position, value):
    src = pair[0].copy()
    src[position] = value
    return src, pair[1]


@pytest.mark.parametrize("change, message", [
    (lambda g: {"edges": {("venue", "hosts", "paper"): g["edges"][CITES]}},
     r"relation 'venue__hosts__paper': its source type 'venue' is not a node type \(paper, author, fos, "
     r"institute\); give its features or num_nodes=\{'venue': n\}"),
    (lambda g: {"edges": {WRITTEN_BY: _shifted(g["edges"][WRITTEN_BY], 3, 60)}},
     r"relation 'paper__written_by__author': src \(paper\) has node id 60 at position 3, outside \[0, 60\); "
     r"num_nodes=60 is taken from features\['paper'\].shape\[0\]"),
    (lambda g: {"edges": {AFFILIATED: (g["edges"][AFFILIATED][0], g["edges"][AFFILIATED][1] + 7)}},
     r"relation 'author__affiliated_to__institute': dst \(institute\) has node id \d+ at position 0, outside "
     r"\[0, 7\); num_nodes=7 is taken from num_nodes\['institute'\]"),
    (lambda g: {"num_nodes": {"author": 46}},
     r"node type 'author': features have 45 rows but num_nodes\['author'\]=46"),
    (lambda g: {"num_nodes": {"institute": None}}, r"node type 'institute': it has neither features nor a node count"),
    (lambda g: {"features": {"author": np.zeros(45)}}, r"node type 'author': features must be a 2-D array"),
    (lambda g: {"labels": {"paper": g["labels"]["paper"][:-1]}},
     r"node type 'paper': labels must have one class id per node, shape \(60,\) with num_nodes from "
     r"features\['paper'\].shape\[0\], got shape \(59,\)"),
    (lambda g: {"labels": {"venue": np.zeros(3)}}, r"labels names node type\(s\) 'venue', which are not node types"),
    (lambda g: {"target": "author"}, r"target type 'author' has no labels; pass labels=\{'author': ...\}"),
    (lambda g: {"labels": {"author": np.zeros(45, np.int64)}}, r"several node types have labels \(paper, author\)"),
    (lambda g: {"num_classes": 3}, r"node type 'paper': num_classes=3 but labels go up to 4"),
    (lambda g: {"edges": {CITES: (g["edges"][CITES][0][:-1], g["edges"][CITES][1])}},
     r"relation 'paper__cites__paper': \(src, dst\) must be two 1-D id arrays of one length, got shapes \(199,\) "
     r"and \(200,\)"),
    (lambda g: {"edges": {CITES: np.stack(g["edges"][CITES], axis=1)}},
     r"relation 'paper__cites__paper': edge_index must have shape \(2, num_edges\).*pass edge_index.T"),
    (lambda g: {"edges": {TOPIC: np.stack(g["edges"][TOPIC]).astype(np.float32)}},
     r"relation 'paper__topic__fos': edge_index must hold integer node ids"),
    (lambda g: {"edges": {("paper", "a.b", "fos"): g["edges"][TOPIC]}},
     r"relation 'paper__a.b__fos': relation name 'a.b' is not a valid name"),
    (lambda g: {"splits": {"paper": {"test": np.array([0, 60])}}},
     r"node type 'paper': test_idx has node id 60 at position 1, outside \[0, 60\)"),
    (lambda g: {"splits": {"paper": {"dev": np.arange(3)}}}, r"node type 'paper': unknown split 'dev'"),
    (lambda g: {"feature_dtype": {"author": "int8"}}, r"node type 'author': features are float16 but "
                                                      r"feature_dtype=int8"),
    (lambda g: {"scores": ("pagerank",)}, "unknown score"),
])
def test_bad_input_is_refused_naming_its_type_or_relation(graph, tmp_path, change, message):
    args = _with(graph, **change(graph))
    with pytest.raises(ValueError, match=message):
        hetero_from_numpy(tmp_path / "bad", **args, progress=False)
    assert os.listdir(tmp_path) == []  # nothing written, no temporary left


def test_pyg_and_dgl_inputs_that_cannot_convert_are_explained(graph, tmp_path):
    from torch_geometric.data import Data, HeteroData

    with pytest.raises(ValueError, match="needs a torch_geometric HeteroData, got Data"):
        hetero_from_pyg(tmp_path / "ds", Data(x=torch.zeros(3, 2)))
    data = HeteroData()
    data["paper"].x = torch.zeros(4, 2)
    data["venue"].y = torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"node type 'venue' has no x and no num_nodes; set data\['venue'\]"):
        hetero_from_pyg(tmp_path / "ds", data)
    data["venue"].num_nodes = 3
    data["paper"].y = torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"several node types have labels \(paper, venue\) in data \(y\)"):
        hetero_from_pyg(tmp_path / "ds", data)
    assert os.listdir(tmp_path) == []


def test_prepare_hetero_igbh_from_the_cli(graph, tmp_path, capsys):
    from lsm_gnn.cli import main
    from lsm_gnn.data import open_dataset

    write_igbh(graph, tmp_path / "igbh")
    out = tmp_path / "ds"
    assert main(["prepare", "hetero", "igbh", str(tmp_path / "igbh"), "--out", str(out), "--num-nodes",
                 "institute=7", "--raw-feature-dim", "13", "--scores", "none", "--no-progress"]) == 0
    assert "target paper" in capsys.readouterr().out
    check_dataset(open_dataset(out), graph, order=("paper", "author", "fos", "institute"), reverse=True)


# -- a folder of .npy files and a manifest (lsm-gnn prepare hetero arrays) ------------------------------------------

def write_arrays(graph, folder) -> str:
    """The graph as .npy files beside a manifest (edges as (E, 2) and (2, E) alike); returns its path."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    types = {}
    for t, features in graph["features"].items():
        if features is None:
            types[t] = {"num_nodes": graph["num_nodes"][t]}
        else:
            np.save(folder / f"{t}_x.npy", features)
            types[t] = {"features": f"{t}_x.npy"}
    np.save(folder / "paper_y.npy", graph["labels"]["paper"])
    types["paper"].update(labels="paper_y.npy", num_classes=CLASSES, splits={})
    for split, ids in graph["splits"]["paper"].items():
        np.save(folder / f"{split}.npy", ids)
        types["paper"]["splits"][split] = f"{split}.npy"
    relations = {}
    for i, ((src, name, dst), (a, b)) in enumerate(graph["edges"].items()):
        pairs = np.stack([a, b]) if i % 2 else np.stack([a, b], axis=1)
        np.save(folder / f"{name}.npy", pairs)
        relations[f"{src}__{name}__{dst}"] = f"{name}.npy"
    manifest = folder / "manifest.json"
    manifest.write_text(json.dumps({"target": "paper", "node_types": types, "relations": relations}))
    return str(manifest)


def test_a_manifest_of_npy_files_converts_to_the_same_dataset(graph, tmp_path, capsys):
    from lsm_gnn.cli import main

    manifest = write_arrays(graph, tmp_path / "arrays")
    assert main(["prepare", "hetero", "arrays", manifest, "--out", str(tmp_path / "ds"), "--no-progress",
                 "--no-reverse"]) == 0
    from lsm_gnn.data import open_dataset

    check_dataset(open_dataset(tmp_path / "ds"), graph)
    assert main(["prepare", "hetero", "arrays", manifest, "--out", str(tmp_path / "rev"), "--no-progress"]) == 0
    check_dataset(open_dataset(tmp_path / "rev"), graph, reverse=True)


@pytest.mark.parametrize("change,message", [
    (lambda m: m["node_types"]["paper"].update(feature="x.npy"), r"unknown key\(s\) \['feature'\]"),
    (lambda m: m["node_types"]["author"].update(features="missing.npy"), "no such file .*missing.npy"),
    (lambda m: m["node_types"].update(topic={}), "node type 'topic' needs features"),
    (lambda m: m.pop("relations"), "must map node_types"),
    (lambda m: m["node_types"].update(topic={"num_nodes": "many"}), "node type 'topic' num_nodes must be a whole"),
    (lambda m: m["node_types"]["paper"].update(num_classes=2.5), "'paper' num_classes must be a whole number, got 2.5"),
])
def test_a_bad_manifest_is_refused_naming_what_is_wrong(graph, tmp_path, change, message):
    import json

    from lsm_gnn.data.convert_hetero import hetero_from_manifest

    manifest = write_arrays(graph, tmp_path / "arrays")
    spec = json.loads(open(manifest).read())
    change(spec)
    open(manifest, "w").write(json.dumps(spec))
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        hetero_from_manifest(tmp_path / "ds", manifest, progress=False)
    assert not (tmp_path / "ds").exists()


def _two_edge_manifest(tmp_path, pairs, layout=None, dtype=None):
    """A two-node-type manifest whose one relation is ``pairs`` (given with ``layout`` when set)."""
    import json

    np.save(tmp_path / "e.npy", np.asarray(pairs, dtype=dtype))
    relation = "e.npy" if layout is None else {"file": "e.npy", "layout": layout}
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"node_types": {"a": {"num_nodes": 3}, "b": {"num_nodes": 3}},
                                    "relations": {"a__to__b": relation}}))
    return str(manifest)


@pytest.mark.parametrize("layout,expected", [("pairs", [(0, 1), (2, 0)]), ("rows", [(0, 2), (1, 0)])])
def test_a_manifest_layout_reads_a_two_by_two_relation_as_told(tmp_path, layout, expected):
    from lsm_gnn.data import open_dataset
    from lsm_gnn.data.convert_hetero import hetero_from_manifest

    # (E, 2) of edges a0->b1 and a2->b0; as rows it is a0->b2 and a1->b0
    manifest = _two_edge_manifest(tmp_path, [[0, 1], [2, 0]], layout)
    ds = hetero_from_manifest(tmp_path / "ds", manifest, add_reverse=False, scores=(), progress=False)
    relation = ds.relations[0]
    indptr, indices = (np.asarray(a) for a in ds.csr(relation))
    got = sorted((int(indices[j]), b) for b in range(3) for j in range(indptr[b], indptr[b + 1]))
    assert got == sorted(expected)


@pytest.mark.parametrize("pairs,layout,message", [
    ([[0, 1], [2, 0]], None, r"relation 'a__to__b' \(e.npy\): shape \(2, 2\) reads either way; say which with layout rows"),
    ([[0, 1, 2], [1, 2, 0]], "pairs", r"relation 'a__to__b' \(e.npy\): layout pairs means \(E, 2\).*shape is \(2, 3\)"),
    ([[0, 1], [1, 2], [2, 0]], "rows", r"layout rows means \(2, E\).*shape is \(3, 2\)"),
    ([[0, 1], [1, 2]], "columns", "layout must be rows or pairs"),
    ([[0, 1], [1, "x"]], "pairs", r"e.npy holds Python objects \(dtype object\).*astype\(np.int64\)"),
])
def test_a_manifest_relation_of_unclear_or_wrong_layout_is_refused(tmp_path, pairs, layout, message):
    from lsm_gnn.data.convert_hetero import hetero_from_manifest

    manifest = _two_edge_manifest(tmp_path, pairs, layout, dtype=object if "x" in str(pairs) else None)
    with pytest.raises(ValueError, match=message):
        hetero_from_manifest(tmp_path / "ds", manifest, progress=False)
    assert not (tmp_path / "ds").exists()
