"""Converters agree with each other, keep features exact and refuse bad input clearly."""
import os
import re

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from lsm_gnn.data.convert import (
    find_folder_files, from_dgl, from_folder, from_npy_files, from_numpy, from_pyg, random_split,
)
from lsm_gnn.data.scores import compute_scores

N, DIM, E, CLASSES = 300, 13, 1500, 5  # 13 float32 columns: 52-byte rows packed at a 64-byte stride


@pytest.fixture(scope="module")
def graph():
    rng = np.random.default_rng(7)
    edge_index = rng.integers(0, N, size=(2, E))
    edge_index[:, :20] = edge_index[:, 20:40]  # parallel edges
    edge_index[1, 40:45] = edge_index[0, 40:45]  # self loops
    return {
        "features": rng.standard_normal((N, DIM)).astype(np.float32),
        "edge_index": edge_index,
        "labels": rng.integers(0, CLASSES, size=N),
        "train_idx": np.arange(0, 180), "val_idx": np.arange(180, 240), "test_idx": np.arange(240, N),
    }


def _csr(src, dst, n=N):
    """Reference CSR: dst's row lists src, rows sorted, parallel edges merged."""
    matrix = sp.csr_matrix((np.ones(len(src)), (dst, src)), shape=(n, n))
    matrix.sum_duplicates()
    matrix.sort_indices()
    return matrix.indptr.astype(np.int64), matrix.indices.astype(np.int64)


def _same(a, b):
    np.testing.assert_array_equal(a.indptr, b.indptr)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.read_features_direct(np.arange(a.num_nodes)),
                                  b.read_features_direct(np.arange(b.num_nodes)))
    np.testing.assert_array_equal(a.labels(), b.labels())
    assert a.num_classes() == b.num_classes() and a.feature_dtype == b.feature_dtype
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(a.split(split), b.split(split))


@pytest.fixture(scope="module")
def reference(graph, tmp_path_factory):
    return from_numpy(tmp_path_factory.mktemp("ref") / "ds", **graph, progress=False)


# -- agreement ---------------------------------------------------------------------

def test_edge_index_builds_the_reference_csr_and_features_are_exact(graph, reference):
    indptr, indices = _csr(*graph["edge_index"])
    np.testing.assert_array_equal(reference.indptr, indptr)
    np.testing.assert_array_equal(reference.indices, indices)
    np.testing.assert_array_equal(reference.read_features_direct(np.arange(N)), graph["features"])
    np.testing.assert_array_equal(reference.labels(), graph["labels"])
    assert reference.num_classes() == CLASSES
    assert reference.score_names() == ["degree", "reverse_pagerank"]
    reference.verify_checksums()


def test_csr_input_gives_the_same_dataset(graph, reference, tmp_path):
    indptr, indices = _csr(*graph["edge_index"])
    args = {k: v for k, v in graph.items() if k != "edge_index"}
    _same(from_numpy(tmp_path / "csr", indptr=indptr, indices=indices, **args, progress=False), reference)


def test_undirected_adds_every_reverse_edge_for_edges_and_csr(graph, tmp_path):
    src, dst = graph["edge_index"]
    indptr, indices = _csr(np.concatenate([src, dst]), np.concatenate([dst, src]))
    args = {k: v for k, v in graph.items() if k != "edge_index"}
    from_edges = from_numpy(tmp_path / "e", edge_index=graph["edge_index"], undirected=True, **args, progress=False)
    np.testing.assert_array_equal(from_edges.indptr, indptr)
    np.testing.assert_array_equal(from_edges.indices, indices)
    directed_indptr, directed_indices = _csr(src, dst)
    from_csr = from_numpy(tmp_path / "c", indptr=directed_indptr, indices=directed_indices, undirected=True,
                          **args, progress=False)
    _same(from_csr, from_edges)


def test_parallel_edges_and_self_loops_are_options(graph, reference, tmp_path):
    src, dst = graph["edge_index"]
    args = {k: v for k, v in graph.items() if k != "edge_index"}
    assert reference.meta["converted"]["dedup"] and reference.meta["converted"]["self_loops"]  # the defaults
    assert any(v in reference.indices[reference.indptr[v]:reference.indptr[v + 1]] for v in src[40:45])
    # Every edge kept: each row lists its sources, repeats included (in no particular order).
    kept = from_numpy(tmp_path / "dups", edge_index=graph["edge_index"], dedup=False, scores=(), **args,
                      progress=False)
    np.testing.assert_array_equal(kept.indptr, np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=N))]))
    rows = np.repeat(np.arange(N), np.diff(kept.indptr))
    stored = np.asarray(kept.indices)
    np.testing.assert_array_equal(stored[np.lexsort((stored, rows))], src[np.lexsort((src, dst))])
    # No self-loops, from an edge list and from a CSR alike.
    loop = src == dst
    indptr, indices = _csr(src[~loop], dst[~loop])
    no_loops = from_numpy(tmp_path / "nl", edge_index=graph["edge_index"], self_loops=False, **args, progress=False)
    np.testing.assert_array_equal(no_loops.indptr, indptr)
    np.testing.assert_array_equal(no_loops.indices, indices)
    assert no_loops.meta["converted"]["self_loops"] is False
    full_indptr, full_indices = _csr(src, dst)
    _same(from_numpy(tmp_path / "nlcsr", indptr=full_indptr, indices=full_indices, self_loops=False, **args,
                     progress=False), no_loops)


def test_memmap_input_and_chunked_features_match(graph, reference, tmp_path, monkeypatch):
    import lsm_gnn.data.convert as convert

    monkeypatch.setattr(convert, "FEATURE_CHUNK_BYTES", DIM * 4 * 7)  # 7 rows per chunk: many chunks, a ragged end
    np.save(tmp_path / "x.npy", graph["features"])
    args = dict(graph, features=np.load(tmp_path / "x.npy", mmap_mode="r"))
    _same(from_numpy(tmp_path / "mm", **args, progress=False), reference)


def test_from_pyg_agrees_with_from_numpy(graph, reference, tmp_path):
    from torch_geometric.data import Data

    masks = {}
    for split in ("train", "val", "test"):
        mask = torch.zeros(N, dtype=torch.bool)
        mask[graph[f"{split}_idx"]] = True
        masks[f"{split}_mask"] = mask
    data = Data(x=torch.from_numpy(graph["features"]), edge_index=torch.from_numpy(graph["edge_index"]),
                y=torch.from_numpy(graph["labels"]).unsqueeze(1), **masks)  # OGB keeps y as [N, 1]
    ds = from_pyg(tmp_path / "pyg", data, progress=False)
    _same(ds, reference)
    assert ds.meta["converted"]["from"] == "pyg"


def test_from_dgl_agrees_with_from_numpy(graph, reference, tmp_path):
    dgl = pytest.importorskip("dgl")
    src, dst = (torch.from_numpy(row) for row in graph["edge_index"])
    g = dgl.graph((src, dst), num_nodes=N)
    g.ndata["feat"] = torch.from_numpy(graph["features"])
    g.ndata["label"] = torch.from_numpy(graph["labels"])
    for split in ("train", "val", "test"):
        mask = torch.zeros(N, dtype=torch.bool)
        mask[graph[f"{split}_idx"]] = True
        g.ndata[f"{split}_mask"] = mask
    _same(from_dgl(tmp_path / "dgl", g, progress=False), reference)


@pytest.mark.parametrize("pairs_first", [False, True])
def test_from_npy_files_agrees_in_either_edge_layout(graph, reference, tmp_path, pairs_first):
    files = {}
    for key, value in graph.items():
        if key == "edge_index" and pairs_first:
            value = np.ascontiguousarray(value.T)  # (E, 2)
        files[key] = str(tmp_path / f"{key}.npy")
        np.save(files[key], value)
    _same(from_npy_files(tmp_path / "ds", **files, progress=False), reference)


@pytest.mark.parametrize("layout,expected", [(None, None), ("pairs", [(0, 1), (2, 0)]), ("rows", [(0, 2), (1, 0)])])
def test_a_two_by_two_edge_file_is_read_as_its_layout_says(tmp_path, capsys, layout, expected):
    """Two edges as (E, 2), a0->1 and 2->0, read as rows would be 0->2 and 1->0: the CLI asks rather than guess."""
    from lsm_gnn.cli import main
    from lsm_gnn.data import open_dataset

    np.save(tmp_path / "x.npy", np.ones((3, 2), np.float32))
    np.save(tmp_path / "e.npy", np.array([[0, 1], [2, 0]]))
    argv = ["prepare", "npy", "--features", str(tmp_path / "x.npy"), "--edge-index", str(tmp_path / "e.npy"),
            "--out", str(tmp_path / "ds"), "--scores", "none", "--no-progress"]
    if layout is None:
        assert main(argv) == 1
        assert re.search(r"e.npy: shape \(2, 2\) reads either way; say which with edge_layout \(--edge-layout\) "
                         r"rows", capsys.readouterr().err)
        return
    assert main(argv + ["--edge-layout", layout]) == 0
    ds = open_dataset(tmp_path / "ds")
    indptr, indices = np.asarray(ds.indptr), np.asarray(ds.indices)
    got = {(int(indices[j]), v) for v in range(3) for j in range(indptr[v], indptr[v + 1])}
    assert got == set(expected)  # each node's CSR row lists its sources


def test_from_folder_reads_an_igb_layout(graph, reference, tmp_path):
    root = tmp_path / "igb"
    (root / "processed" / "paper").mkdir(parents=True)
    (root / "processed" / "paper__cites__paper").mkdir(parents=True)
    np.save(root / "processed" / "paper" / "node_feat.npy", graph["features"])
    np.save(root / "processed" / "paper" / "node_label_19.npy", graph["labels"].astype(np.float32))  # IGB: floats
    np.save(root / "processed" / "paper__cites__paper" / "edge_index.npy", np.ascontiguousarray(graph["edge_index"].T))
    np.save(root / "processed" / "paper" / "paper_id_index_mapping.npy", np.arange(N))  # ignored
    splits = {f"{s}_idx": graph[f"{s}_idx"] for s in ("train", "val", "test")}  # IGB ships no split files
    assert from_folder(tmp_path / "nosplit", root, scores=(), progress=False).meta["splits"] == {}
    _same(from_folder(tmp_path / "ds", root, progress=False, **splits), reference)


def test_from_folder_reads_an_ogb_layout(graph, reference, tmp_path):
    root = tmp_path / "ogb"
    (root / "raw").mkdir(parents=True)
    (root / "split" / "time").mkdir(parents=True)
    np.save(root / "raw" / "node-feat.npy", graph["features"])
    np.save(root / "raw" / "edge_index.npy", graph["edge_index"])
    np.save(root / "raw" / "node-label.npy", graph["labels"].reshape(-1, 1))
    np.save(root / "split" / "time" / "train_idx.npy", graph["train_idx"])
    np.save(root / "split" / "time" / "valid_idx.npy", graph["val_idx"])
    np.save(root / "split" / "time" / "test_idx.npy", graph["test_idx"])
    assert find_folder_files(str(root))["val_idx"] == [os.path.join("split", "time", "valid_idx.npy")]
    _same(from_folder(tmp_path / "ds", root, progress=False), reference)


def test_float_labels_with_nan_mean_unlabeled_and_random_split_uses_labeled_nodes(graph, tmp_path):
    labels = graph["labels"].astype(np.float64)
    labels[::3] = np.nan
    ds = from_numpy(tmp_path / "nan", features=graph["features"], edge_index=graph["edge_index"], labels=labels,
                    random_split_fractions=(0.5, 0.25, 0.25), seed=3, scores=(), progress=False)
    stored = np.asarray(ds.labels())
    assert np.all(stored[::3] == -1)
    labeled = np.flatnonzero(stored >= 0)
    chosen = np.concatenate([ds.split(s) for s in ("train", "val", "test")])
    assert np.array_equal(np.sort(chosen), labeled)


def test_feature_dtypes_follow_the_input_or_the_request(graph, tmp_path):
    wide = graph["features"].astype(np.float64)
    args = dict(edge_index=graph["edge_index"], scores=(), progress=False)
    assert from_numpy(tmp_path / "a", features=wide, **args).feature_dtype == np.float32
    half = from_numpy(tmp_path / "b", features=wide, feature_dtype="float16", **args)
    np.testing.assert_array_equal(half.read_features_direct(np.arange(N)), wide.astype(np.float16))
    small = np.arange(N * 4).reshape(N, 4) % 100
    assert from_numpy(tmp_path / "c", features=small, feature_dtype="int8", **args).feature_dtype == np.int8


def test_random_split_is_seeded_and_sized():
    a, b = random_split(1000, (0.6, 0.2, 0.1), seed=1), random_split(1000, (0.6, 0.2, 0.1), seed=1)
    assert [len(a[s]) for s in ("train", "val", "test")] == [600, 200, 100]
    assert all(np.array_equal(a[s], b[s]) for s in a)
    assert np.unique(np.concatenate(list(a.values()))).size == 900


# -- errors --------------------------------------------------------------------------

@pytest.mark.parametrize("change, message", [
    ({"features": np.zeros(N, np.float32)}, "features must be a 2-D array"),
    ({"edge_index": np.zeros((E, 2), np.int64)}, r"shape \(2, num_edges\).*edge_index\.T"),
    ({"edge_index": np.zeros((3, E), np.int64)}, r"edge_index must have shape"),
    ({"edge_index": np.zeros((2, E), np.float32)}, "edge_index must hold integer node ids"),
    ({"labels": np.zeros(N - 1, np.int64)}, r"labels must have one class id per node, shape \(300,\)"),
    ({"labels": np.full(N, 0.5)}, "labels must be integral"),
    ({"labels": np.full(N, -2)}, "-1 for unlabeled"),
    ({"labels": np.zeros(N, np.int64), "num_classes": 0}, "num_classes=0"),
    ({"train_idx": np.zeros(N + 1, bool)}, r"train_idx is a boolean mask of shape \(301,\)"),
    ({"test_idx": np.array([0, N])}, r"test_idx has node id 300 at position 1, outside \[0, 300\)"),
    ({"edge_index": None}, "pass the topology once"),
    ({"indptr": np.zeros(N + 1, np.int64), "indices": np.zeros(0, np.int64)}, "pass the topology once"),
    ({"scores": ("pagerank",)}, "unknown score"),
])
def test_bad_input_is_refused_with_a_message_naming_it(graph, tmp_path, change, message):
    args = dict(graph, progress=False)
    args.update(change)
    with pytest.raises(ValueError, match=message):
        from_numpy(tmp_path / "bad", **args)
    assert not os.path.exists(tmp_path / "bad")


def test_out_of_range_edges_are_refused_and_nothing_is_left_behind(graph, tmp_path):
    edge_index = graph["edge_index"].copy()
    edge_index[1, 77] = N + 5
    with pytest.raises(ValueError, match=r"edge_index\[1\] \(destinations\) has node id 305 at position 77"):
        from_numpy(tmp_path / "bad", features=graph["features"], edge_index=edge_index, progress=False)
    assert os.listdir(tmp_path) == []  # the writer's temporary directory is gone too


def test_bad_csr_is_refused(graph, tmp_path):
    indptr, indices = _csr(*graph["edge_index"])
    with pytest.raises(ValueError, match="indptr must have num_nodes \\+ 1"):
        from_numpy(tmp_path / "x", features=graph["features"], indptr=indptr[:-1], indices=indices)
    broken = indptr.copy()
    broken[5] = broken[7] + 1
    with pytest.raises(ValueError, match="non-decreasing"):
        from_numpy(tmp_path / "x", features=graph["features"], indptr=broken, indices=indices)
    with pytest.raises(ValueError, match=r"indices has node id"):
        from_numpy(tmp_path / "x", features=graph["features"], indptr=indptr, indices=indices + N)


def test_unknown_and_ambiguous_folders_are_explained(graph, tmp_path):
    (tmp_path / "odd").mkdir()
    np.save(tmp_path / "odd" / "matrix.npy", graph["features"])
    with pytest.raises(ValueError, match=r"unknown layout, found no features file; looked recursively for "
                                         r"node_feat\.npy, node-feat\.npy"):
        from_folder(tmp_path / "ds", tmp_path / "odd")
    root = tmp_path / "two"
    for part in ("a", "b"):
        (root / part).mkdir(parents=True)
        np.save(root / part / "node_label.npy", graph["labels"])
    np.save(root / "a" / "node_feat.npy", graph["features"])
    np.save(root / "a" / "edge_index.npy", graph["edge_index"])
    with pytest.raises(ValueError, match=r"several files could be the labels: a/node_label\.npy, b/node_label\.npy"):
        from_folder(tmp_path / "ds", root)
    ds = from_folder(tmp_path / "ds", root, labels="b/node_label.npy", scores=(), progress=False)
    np.testing.assert_array_equal(ds.labels(), graph["labels"])
    with pytest.raises(ValueError, match="not a directory"):
        from_folder(tmp_path / "ds2", tmp_path / "missing")


# -- reverse PageRank against a reference ------------------------------------------------

def test_reverse_pagerank_matches_a_power_iteration_reference():
    rng = np.random.default_rng(11)
    n = 200
    src, dst = rng.integers(0, n, 900), rng.integers(0, n, 900)
    keep = ~np.isin(dst, np.arange(0, n, 9))  # rows 0, 9, 18, ... are empty: dangling nodes
    indptr, indices = _csr(src[keep], dst[keep], n)
    # Walk from v to a uniform member of its CSR row; dangling mass and teleports spread uniformly.
    degree = np.diff(indptr)
    rows = np.repeat(np.arange(n), degree)
    step = sp.csr_matrix((1.0 / degree[rows], (rows, indices)), shape=(n, n))
    rank = np.full(n, 1.0 / n)
    for _ in range(300):
        rank = 0.15 / n + 0.85 * (step.T @ rank + rank[degree == 0].sum() / n)
    scores = compute_scores(indptr, indices, ("reverse_pagerank",))["reverse_pagerank"]
    assert scores.dtype == np.float32
    np.testing.assert_allclose(scores, rank, atol=1e-5, rtol=0)
    assert abs(scores.sum(dtype=np.float64) - 1) < 1e-5
