"""The dataset format: atomic writes, and a clear error for every bad layout."""
import os

import numpy as np
import pytest

from lsm_gnn import DatasetError, DatasetWriter, open_dataset
from lsm_gnn.data.format import HETERO_SCHEMA_VERSION, META_FILE, crc32_file
from lsm_gnn.testing import edit_meta, write_tiny_dataset


@pytest.fixture
def tiny(tmp_path):
    dataset, features = write_tiny_dataset(tmp_path / "ds", num_nodes=100, dim=10)
    return dataset, features


def test_round_trip_layout_and_arrays(tiny):
    dataset, features = tiny
    assert dataset.features.row_bytes == 40 and dataset.features.row_stride == 64  # packed, 8 rows per block
    assert os.path.getsize(dataset.feature_path) % 4096 == 0
    assert np.array_equal(dataset.read_features_direct(np.arange(100)), features)
    assert dataset.indptr[-1] == dataset.num_edges == dataset.indices.shape[0]
    assert sorted(np.concatenate([dataset.split(s) for s in ("train", "val", "test")])) == list(range(100))
    dataset.verify_checksums()


def test_a_schema1_dataset_is_a_graph_of_one_type_and_one_relation(tiny):
    from lsm_gnn.data.dataset import ONE_RELATION, ONE_TYPE

    ds, features = tiny
    assert ds.is_homogeneous and ds.node_types == [ONE_TYPE] and ds.relations == [ONE_RELATION]
    assert ds.target == ONE_TYPE and ds.offsets == {ONE_TYPE: 0} and ds.feature_types == [ONE_TYPE]
    # Every typed question has the one-type answer, with or without the type named.
    assert ds.num_nodes == ds.num_nodes_of() == ds.num_nodes_of(ONE_TYPE) == 100
    assert ds.num_edges == ds.num_edges_of() == ds.num_edges_of(ONE_RELATION) == ds.num_edges_of("node__to__node")
    indptr, indices = ds.csr(ONE_RELATION)
    assert indptr is ds.indptr and indices is ds.indices
    assert np.array_equal(ds.labels(ONE_TYPE), ds.labels()) and ds.num_classes(ONE_TYPE) == ds.num_classes()
    assert ds.split_names() == ds.split_names(ONE_TYPE) == ["test", "train", "val"]
    assert np.array_equal(ds.split("train", ONE_TYPE), ds.split("train"))
    assert ds.score_names(ONE_TYPE) == ds.score_names()
    for name in ds.score_names():
        assert np.array_equal(ds.score(name, ONE_TYPE), ds.score(name))
    node = ds.node_type(ONE_TYPE)
    assert node.features == ds.features and node.feature_path == ds.feature_path
    assert np.array_equal(node.read_features_direct(np.arange(100)), features)
    with pytest.raises(KeyError, match="no node type 'paper'; it has: node"):
        ds.labels("paper")
    with pytest.raises(KeyError, match="no relation"):
        ds.csr(("node", "cites", "node"))


def test_edges_become_sorted_deduplicated_in_rows(tmp_path):
    src = np.array([1, 2, 1, 3, 0, 1])
    dst = np.array([0, 0, 0, 2, 3, 1])
    with DatasetWriter(tmp_path / "g", num_nodes=4, feature_dim=1) as w:
        w.write_features(np.zeros((4, 1), np.float32))
        w.write_edges([(src, dst)], self_loops=False)
        ds = w.commit()
    rows = [list(ds.indices[ds.indptr[v]:ds.indptr[v + 1]]) for v in range(4)]
    assert rows == [[1, 2], [], [3], [0]]  # dst 0 aggregates from 1 (twice, kept once) and 2; 1->1 dropped


def test_commit_computes_the_static_scores_not_written(tmp_path):
    from lsm_gnn.data.scores import compute_scores

    def write(name, **kw):
        with DatasetWriter(tmp_path / name, num_nodes=4, feature_dim=1, **kw) as w:
            w.write_features(np.zeros((4, 1), np.float32))
            w.write_edges([(np.array([0, 1, 2]), np.array([1, 2, 3]))], undirected=True)
            if name == "given":
                w.write_score("degree", np.arange(4, dtype=np.float32))
            return w.commit()

    default = write("default")
    assert default.score_names() == ["degree", "reverse_pagerank"]  # what the trainer's cache ranks by
    expected = compute_scores(default.indptr, default.indices)
    for score_name, values in expected.items():
        np.testing.assert_array_equal(default.score(score_name), values)
    given = write("given", scores=("degree",))
    assert given.score_names() == ["degree"] and list(given.score("degree")) == [0, 1, 2, 3]  # not recomputed
    assert write("none", scores=()).score_names() == []
    with pytest.raises(ValueError, match="unknown score.*pagerank"):
        DatasetWriter(tmp_path / "bad", num_nodes=4, feature_dim=1, scores=("pagerank",))
    assert not os.path.exists(tmp_path / "bad") and not [p for p in os.listdir(tmp_path) if p.startswith(".bad")]


def test_undirected_adds_reverse_edges(tmp_path):
    with DatasetWriter(tmp_path / "g", num_nodes=3, feature_dim=1) as w:
        w.write_features(np.zeros((3, 1), np.float32))
        w.write_edges([(np.array([0]), np.array([2]))], undirected=True)
        ds = w.commit()
    assert ds.num_edges == 2 and list(ds.indices) == [2, 0]


def test_exception_inside_writer_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with DatasetWriter(tmp_path / "ds", num_nodes=10, feature_dim=2) as w:
            w.write_features(np.zeros((10, 2), np.float32))
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_existing_dataset_is_kept_unless_overwrite(tiny, tmp_path):
    dataset, features = tiny
    with pytest.raises(FileExistsError, match="overwrite"):
        DatasetWriter(dataset.path, num_nodes=5, feature_dim=1)
    with DatasetWriter(dataset.path, num_nodes=7, feature_dim=3, overwrite=True) as w:
        w.write_features(np.ones((7, 3), np.float32))
        w.write_csr(np.zeros(8, np.int64), np.zeros(0, np.int64))
        new = w.commit()
    assert new.num_nodes == 7 and open_dataset(dataset.path).num_nodes == 7
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []


def test_commit_requires_every_row_and_a_topology(tmp_path):
    with DatasetWriter(tmp_path / "a", num_nodes=10, feature_dim=2) as w:
        w.write_features(np.zeros((4, 2), np.float32))
        w.write_csr(np.zeros(11, np.int64), np.zeros(0, np.int64))
        with pytest.raises(DatasetError, match="4 of 10"):
            w.commit()
    with DatasetWriter(tmp_path / "b", num_nodes=10, feature_dim=2) as w:
        w.write_features(np.zeros((10, 2), np.float32))
        with pytest.raises(DatasetError, match="topology"):
            w.commit()
    assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")


@pytest.mark.parametrize("call, match", [
    (lambda w: w.write_features(np.zeros((3, 5), np.float32)), "shape"),
    (lambda w: w.write_features(np.zeros((11, 2), np.float32)), "too many"),
    (lambda w: w.write_features(np.zeros((3, 2), np.int32)), "dtype"),
    (lambda w: w.write_edges([(np.array([0, 1]), np.array([1]))]), "sources"),
    (lambda w: w.write_edges([(np.array([0]), np.array([10]))]), "outside"),
    (lambda w: w.write_csr(np.zeros(5, np.int64), np.zeros(0, np.int64)), "indptr"),
    (lambda w: w.write_csr(np.array([0, 2, 1] + [2] * 8), np.zeros(2, np.int64)), "never decrease"),
    (lambda w: w.write_split("train", np.array([0.7, 1.9])), "integer node ids"),
    (lambda w: w.write_labels(np.zeros(9, np.int64)), "shape"),
    (lambda w: w.write_labels(np.zeros(10, np.float32)), "integers"),
    (lambda w: w.write_labels(np.full(10, 5), num_classes=3), "labels must lie"),
    (lambda w: w.write_split("holdout", np.arange(3)), "unknown split"),
    (lambda w: w.write_split("train", np.array([10])), "outside"),
    (lambda w: w.write_score("degree", np.zeros(3)), "shape"),
])
def test_writer_rejects_bad_input(tmp_path, call, match):
    with DatasetWriter(tmp_path / "ds", num_nodes=10, feature_dim=2) as w:
        with pytest.raises(ValueError, match=match):
            call(w)


def test_writer_rejects_bad_construction(tmp_path):
    with pytest.raises(ValueError, match="num_nodes"):
        DatasetWriter(tmp_path / "x", num_nodes=0, feature_dim=2)
    with pytest.raises(ValueError, match="not supported"):
        DatasetWriter(tmp_path / "x", num_nodes=3, feature_dim=2, feature_dtype="complex64")


def test_boolean_split_masks_become_ids(tmp_path):
    with DatasetWriter(tmp_path / "ds", num_nodes=4, feature_dim=1) as w:
        w.write_features(np.zeros((4, 1), np.float32))
        w.write_csr(np.zeros(5, np.int64), np.zeros(0, np.int64))
        w.write_split("train", np.array([True, False, True, False]))
        ds = w.commit()
    assert list(ds.split("train")) == [0, 2]


# -- open_dataset: each broken layout gets its own message ----------------------

def test_missing_directory(tmp_path):
    with pytest.raises(DatasetError, match="no such dataset directory.*prepare"):
        open_dataset(tmp_path / "nope")


def test_missing_meta(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(DatasetError, match="meta.json: missing"):
        open_dataset(tmp_path / "d")


def test_meta_not_json(tiny):
    with open(os.path.join(tiny[0].path, META_FILE), "w") as f:
        f.write("{oops")
    with pytest.raises(DatasetError, match="not valid JSON"):
        open_dataset(tiny[0].path)


@pytest.mark.parametrize("change, match", [
    (lambda m: m.update(format="something-else"), "not an lsm-gnn dataset"),
    (lambda m: m.update(version=HETERO_SCHEMA_VERSION + 1), "newer than this lsm-gnn"),
    (lambda m: m.update(version=0), "unknown schema version"),
    (lambda m: m.pop("num_nodes"), "missing key 'num_nodes'"),
    (lambda m: m.update(num_nodes="100"), "wrong type"),
    (lambda m: m["features"].update(dtype="complex64"), "not supported"),
    (lambda m: m["features"].update(row_bytes=44), "does not equal dim"),
    (lambda m: m["features"].update(row_stride=500), "multiple of 512 nor a power of two"),
    (lambda m: m["features"].update(file_bytes=1), "inconsistent"),
    (lambda m: m.update(num_nodes=101), "inconsistent|entries"),
    (lambda m: m.update(num_edges=m["num_edges"] + 1), "entries"),
    (lambda m: m["splits"].update(holdout="train_idx.npy"), "unknown split"),
    (lambda m: m["scores"].update(degree="nope.npy"), "missing"),
])
def test_bad_meta_is_named(tiny, change, match):
    edit_meta(tiny[0], change)
    with pytest.raises(DatasetError, match=match):
        open_dataset(tiny[0].path)


def test_truncated_and_oversized_feature_file(tiny):
    path = tiny[0].feature_path
    size = os.path.getsize(path)
    os.truncate(path, size - 4096)
    with pytest.raises(DatasetError, match="features.bin: the feature file is truncated"):
        open_dataset(tiny[0].path)
    os.truncate(path, size + 4096)
    with pytest.raises(DatasetError, match="larger than described"):
        open_dataset(tiny[0].path)


def test_missing_feature_file(tiny):
    os.remove(tiny[0].feature_path)
    with pytest.raises(DatasetError, match="feature file is missing"):
        open_dataset(tiny[0].path)


def test_truncated_npy(tiny):
    path = os.path.join(tiny[0].path, "indices.npy")
    os.truncate(path, 60)
    with pytest.raises(DatasetError, match="indices.npy: cannot read"):
        open_dataset(tiny[0].path)


def replace_array(dataset, name, array):
    np.save(os.path.join(dataset.path, name), array)


@pytest.mark.parametrize("name, make, match", [
    ("indices.npy", lambda ds: np.full(ds.num_edges, ds.num_nodes, np.int32), "neighbor id .* outside"),
    ("indices.npy", lambda ds: np.zeros(ds.num_edges, np.float32), "dtype"),
    ("indptr.npy", lambda ds: np.zeros((ds.num_nodes + 1, 1), np.int64), "one dimension"),
    ("labels.npy", lambda ds: np.full(ds.num_nodes, 99, np.int64), "label .* outside"),
    ("labels.npy", lambda ds: np.zeros(ds.num_nodes - 1, np.int64), "entries, expected"),
    ("train_idx.npy", lambda ds: np.array([0, -5]), "train node id .* outside"),
])
def test_bad_arrays_are_named(tiny, name, make, match):
    replace_array(tiny[0], name, make(tiny[0]))
    with pytest.raises(DatasetError, match=match):
        open_dataset(tiny[0].path)


def test_decreasing_indptr(tiny):
    ds = tiny[0]
    indptr = np.array(ds.indptr)
    indptr[1], indptr[2] = indptr[2] + 1, indptr[1]
    replace_array(ds, "indptr.npy", indptr)
    with pytest.raises(DatasetError, match="decreases"):
        open_dataset(ds.path)


def test_shape_check_skips_value_scans(tiny):
    ds = tiny[0]
    replace_array(ds, "indices.npy", np.full(ds.num_edges, ds.num_nodes, np.int32))
    assert open_dataset(ds.path, check="shape").num_nodes == ds.num_nodes
    with pytest.raises(ValueError, match="check"):
        open_dataset(ds.path, check="some")


def test_checksums_catch_a_flipped_byte(tiny):
    ds = tiny[0]
    with open(ds.feature_path, "r+b") as f:
        f.seek(3)
        byte = f.read(1)
        f.seek(3)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(DatasetError, match="checksum"):
        open_dataset(ds.path).verify_checksums()


def test_checksums_are_crc32_of_the_files(tiny):
    ds = tiny[0]
    for name, value in ds.meta["checksums"].items():
        assert crc32_file(ds.file_path(name)) == value


def test_missing_split_and_score_names_list_what_exists(tiny):
    edit_meta(tiny[0], lambda m: m["scores"].pop("reverse_pagerank"))
    with pytest.raises(KeyError, match=r"no 'reverse_pagerank' score; it has: \['degree'\]"):
        open_dataset(tiny[0].path).score("reverse_pagerank")
    edit_meta(tiny[0], lambda m: m["splits"].pop("test"))
    with pytest.raises(KeyError, match="train, val|'train', 'val'"):
        open_dataset(tiny[0].path).split("test")


def test_integer_features_that_do_not_fit_are_refused(tmp_path):
    with DatasetWriter(tmp_path / "ds", num_nodes=1, feature_dim=2, feature_dtype="int8") as w:
        with pytest.raises(ValueError, match="do not fit int8"):
            w.write_features(np.array([[300, -200]]))


def test_an_invalid_new_dataset_never_replaces_a_good_one(tiny):
    dataset, _ = tiny
    with DatasetWriter(dataset.path, num_nodes=3, feature_dim=1, overwrite=True) as w:
        w.write_features(np.zeros((3, 1), np.float32))
        with pytest.raises(ValueError, match="outside"):
            w.write_csr(np.array([0, 1, 1, 1]), np.array([7]))  # neighbor id 7 does not exist
    assert open_dataset(dataset.path).num_nodes == 100
