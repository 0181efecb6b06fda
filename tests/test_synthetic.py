"""The synthetic generator: deterministic, power law, clean undirected CSR, learnable labels."""
import os

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from lsm_gnn.data.synthetic import AffineBijection, community, generate_synthetic

N = 2000  # not a power of two on purpose
DIM = 32
CLASSES = 8


def _make(path, **kw):
    args = dict(num_nodes=N, feature_dim=DIM, num_classes=CLASSES, seed=0, progress=False)
    args.update(kw)
    return generate_synthetic(path, **args)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return _make(tmp_path_factory.mktemp("syn") / "g")


def _bytes(ds, name):
    with open(ds.file_path(name), "rb") as f:
        return f.read()


def _adjacency(ds):
    indptr, indices = np.asarray(ds.indptr), np.asarray(ds.indices)
    return sp.csr_matrix((np.ones(indices.size), indices, indptr), shape=(ds.num_nodes, ds.num_nodes))


def test_same_seed_gives_identical_bytes_whatever_the_chunk_size(tmp_path, ds):
    again = _make(tmp_path / "again", chunk_nodes=4096 * 3)
    for name in ("features.bin", "indptr.npy", "indices.npy", "labels.npy", "train_idx.npy", "test_idx.npy"):
        assert _bytes(again, name) == _bytes(ds, name), name


def test_a_different_seed_gives_a_different_dataset(tmp_path, ds):
    other = _make(tmp_path / "other", seed=1)
    for name in ("features.bin", "indices.npy", "labels.npy"):
        assert _bytes(other, name) != _bytes(ds, name), name


def test_degrees_follow_a_power_law(ds):
    degree = np.diff(np.asarray(ds.indptr))
    assert degree.max() > 10 * degree.mean()
    assert degree.min() >= 0 and np.mean(degree == 0) < 0.01  # anchors leave (almost) no node isolated
    # The affine permutation scatters the hubs: they are not all at small ids.
    hubs = np.argsort(degree)[-10:]
    assert hubs.max() > N // 2


def test_csr_is_symmetric_without_self_loops_or_duplicates(ds):
    indptr, indices = np.asarray(ds.indptr), np.asarray(ds.indices)
    rows = np.repeat(np.arange(N), np.diff(indptr))
    assert not np.any(rows == indices)
    same_row = rows[1:] == rows[:-1]
    assert np.all(indices[1:][same_row] > indices[:-1][same_row])  # sorted, so no repeats
    adjacency = _adjacency(ds)
    assert (adjacency != adjacency.T).nnz == 0
    assert indices.min() >= 0 and indices.max() < N


def test_num_nodes_need_not_be_a_power_of_two(tmp_path):
    small = generate_synthetic(tmp_path / "odd", num_nodes=777, avg_degree=6, feature_dim=3, num_classes=3,
                               progress=False, scores=())
    assert small.num_nodes == 777 and small.feature_dim == 3
    assert np.asarray(small.indices).max() < 777
    assert small.score_names() == []


def test_float16_features_are_the_float32_ones_rounded(tmp_path, ds):
    half = _make(tmp_path / "half", feature_dtype="float16", scores=())
    assert half.feature_dtype == np.float16
    ids = np.arange(0, N, 7)
    np.testing.assert_array_equal(half.read_features_direct(ids), ds.read_features_direct(ids).astype(np.float16))


def test_labels_are_the_communities_and_edges_stay_inside_them(ds):
    labels = np.asarray(ds.labels())
    np.testing.assert_array_equal(labels, community(np.arange(N), 0, CLASSES))
    assert ds.num_classes() == CLASSES
    counts = np.bincount(labels, minlength=CLASSES)
    assert counts.min() > 0.5 * N / CLASSES  # balanced
    indptr, indices = np.asarray(ds.indptr), np.asarray(ds.indices)
    rows = np.repeat(np.arange(N), np.diff(indptr))
    assert np.mean(labels[rows] == labels[indices]) > 0.6  # chance is 1/8


def test_splits_partition_the_nodes(ds):
    train, val, test = (np.asarray(ds.split(s)) for s in ("train", "val", "test"))
    assert (len(train), len(val), len(test)) == (1200, 400, 400)
    assert np.unique(np.concatenate([train, val, test])).size == N


def test_scores_are_written_and_pagerank_sums_to_one(ds):
    assert ds.score_names() == ["degree", "reverse_pagerank"]
    assert abs(float(np.sum(ds.score("reverse_pagerank"), dtype=np.float64)) - 1) < 1e-4
    np.testing.assert_array_equal(ds.score("degree"), np.bincount(np.asarray(ds.indices), minlength=N))
    ds.verify_checksums()


def test_generator_parameters_are_recorded(ds):
    params = ds.meta["generator"]
    assert params["num_nodes"] == N and params["seed"] == 0 and params["rmat"] == [0.57, 0.19, 0.19, 0.05]


def test_progress_off_prints_nothing(tmp_path, capsys):
    generate_synthetic(tmp_path / "quiet", num_nodes=100, feature_dim=4, progress=False, scores=())
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


@pytest.mark.parametrize("n", [1, 2, 3, 1000, 4096, 10**9 + 7, (1 << 45) + 3])
def test_affine_permutation_is_a_bijection_and_exact(n):
    perm = AffineBijection(n, seed=5)
    sample = np.unique(np.concatenate([np.arange(min(n, 5000)), np.arange(max(0, n - 100), n)]))
    expected = [(perm.mult * int(r) + perm.shift) % n for r in sample]
    np.testing.assert_array_equal(perm(sample), expected)  # the limb path agrees with Python integers
    if n <= 5000:
        assert np.array_equal(np.sort(perm(np.arange(n))), np.arange(n))


@pytest.mark.parametrize("kw, message", [
    ({"feature_dtype": "int8"}, "float32 or float16"),
    ({"rmat": (0.5, 0.2, 0.2, 0.2)}, "summing to 1"),
    ({"homophily": 1.5}, "homophily"),
    ({"split": (0.8, 0.3, 0.1)}, "fractions"),
    ({"num_nodes": 0}, "num_nodes"),
])
def test_bad_parameters_are_refused_before_writing(tmp_path, kw, message):
    args = dict(num_nodes=50, feature_dim=4, progress=False)
    args.update(kw)
    with pytest.raises(ValueError, match=message):
        generate_synthetic(tmp_path / "bad", **args)
    assert os.listdir(tmp_path) == []


# -- a GNN learns what features alone cannot -------------------------------------

def _mean_neighbors(h, rows, cols):
    total = torch.zeros_like(h).index_add_(0, rows, h[cols])
    return total / torch.bincount(rows, minlength=h.shape[0]).clamp(min=1).unsqueeze(1)


class _Sage(torch.nn.Module):
    """Two GraphSAGE-style layers: [self, mean of neighbors] -> linear."""

    def __init__(self, dim, hidden, classes):
        super().__init__()
        self.first = torch.nn.Linear(2 * dim, hidden)
        self.second = torch.nn.Linear(2 * hidden, classes)

    def forward(self, x, rows, cols):
        h = torch.relu(self.first(torch.cat([x, _mean_neighbors(x, rows, cols)], 1)))
        return self.second(torch.cat([h, _mean_neighbors(h, rows, cols)], 1))


def _fit(model, forward, y, train, test, epochs):
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    for _ in range(epochs):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(forward()[train], y[train]).backward()
        optimizer.step()
    with torch.no_grad():
        return (forward()[test].argmax(1) == y[test]).float().mean().item()


def test_a_two_layer_gnn_beats_features_alone(ds, one_torch_thread):
    torch.manual_seed(0)
    indptr = torch.from_numpy(np.array(ds.indptr))
    cols = torch.from_numpy(np.array(ds.indices, dtype=np.int64))
    rows = torch.repeat_interleave(torch.arange(N), indptr.diff())
    x = torch.from_numpy(ds.read_features_direct(np.arange(N)))
    y = torch.from_numpy(np.array(ds.labels()))
    train, test = torch.from_numpy(np.array(ds.split("train"))), torch.from_numpy(np.array(ds.split("test")))
    linear = torch.nn.Linear(DIM, CLASSES)
    features_only = _fit(linear, lambda: linear(x), y, train, test, epochs=100)
    sage = _Sage(DIM, 64, CLASSES)
    gnn = _fit(sage, lambda: sage(x, rows, cols), y, train, test, epochs=50)
    print(f"features only {features_only:.3f}, gnn {gnn:.3f}")
    assert features_only < 0.85  # features alone are clearly imperfect
    assert gnn > 0.7 and gnn > features_only + 0.1, (gnn, features_only)
