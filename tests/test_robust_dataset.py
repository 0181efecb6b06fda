"""Corrupt datasets: a DatasetError naming the file and the fix, never a crash or a wrong answer.

Opening always checks meta.json key by key and everything O(num_nodes)
(indptr included); the native sampler and PageRank bounds-check the
neighbor ids they read. Training and `prepare scores` run in a subprocess
here, so a segfault fails the test instead of killing pytest.
"""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from lsm_gnn import DatasetError, open_dataset
from lsm_gnn.data.scores import compute_scores, reverse_pagerank
from lsm_gnn.sampling import CSRGraph, OneTypeSampler
from lsm_gnn.testing import edit_meta, write_tiny_dataset
from lsm_gnn.utils.ids import as_id_tensor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_NODES = 200


def make_dataset(path, index_dtype="int32"):
    """A tiny dataset whose indices are stored as ``index_dtype``."""
    dataset, _ = write_tiny_dataset(path, num_nodes=NUM_NODES, dim=4)
    np.save(os.path.join(dataset.path, "indices.npy"), np.asarray(dataset.indices).astype(index_dtype))
    return open_dataset(dataset.path)


@pytest.fixture(params=["int32", "int64"])
def ds(request, tmp_path):
    return make_dataset(tmp_path / "ds", request.param)


def save(dataset, name, array):
    np.save(os.path.join(dataset.path, name), array)


def corrupt_indptr(indptr, kind):
    indptr = np.array(indptr)
    if kind == "negative":
        indptr[3] = -7
    elif kind == "huge":
        indptr[3] = 1 << 40
    else:  # non-monotonic, every entry still within [0, num_edges]
        indptr[3], indptr[4] = indptr[4] + 1, indptr[3]
    return indptr


def corrupt_indices(indices, kind):
    indices = np.array(indices)
    indices[0] = -1 if kind == "negative" else NUM_NODES + 5
    return indices


# -- class 1: the topology ----------------------------------------------------------

@pytest.mark.parametrize("kind", ["negative", "huge", "non-monotonic"])
@pytest.mark.parametrize("check", ["fast", "shape", "full"])
def test_corrupt_indptr_is_refused_on_every_open(ds, kind, check):
    save(ds, "indptr.npy", corrupt_indptr(ds.indptr, kind))
    with pytest.raises(DatasetError, match=r"indptr\.npy: indptr (decreases|starts).*--verify"):
        open_dataset(ds.path, check=check)


@pytest.mark.parametrize("kind", ["negative", "huge", "non-monotonic"])
def test_native_code_bounds_checks_indptr_itself(ds, kind):
    """Arrays that never went through open_dataset: the C++ must refuse, not read out of bounds."""
    raw = CSRGraph(corrupt_indptr(ds.indptr, kind), np.array(ds.indices))
    with pytest.raises(DatasetError, match=r"CSR indptr array: the row of node [23] is .* not an ordered range"):
        OneTypeSampler(raw, [-1, 3]).sample(np.arange(NUM_NODES))
    with pytest.raises(DatasetError, match="CSR indptr array: the row of node"):
        reverse_pagerank(raw.indptr, raw.indices)


@pytest.mark.parametrize("kind", ["negative", "too large"])
def test_out_of_range_neighbor_is_named_by_the_sampler(ds, kind):
    save(ds, "indices.npy", corrupt_indices(ds.indices, kind))
    fast = open_dataset(ds.path, check="fast")  # the O(num_edges) scan is left to the native code
    bad = -1 if kind == "negative" else NUM_NODES + 5
    first = int(np.flatnonzero(np.diff(np.asarray(fast.indptr)))[0])  # the node whose row holds position 0
    message = (rf"{fast.path}/indices\.npy: neighbor id {bad} of node {first} at position 0 is outside \[0, "
               rf"{NUM_NODES}\)\. The topology is corrupt - run 'lsm-gnn inspect {fast.path} --verify'")
    with pytest.raises(DatasetError, match=message):
        OneTypeSampler(fast, [-1]).sample([first])
    with pytest.raises(DatasetError, match=message):
        OneTypeSampler(fast, [2, 2], num_threads=2).sample(np.arange(NUM_NODES))  # found inside the parallel loop
    with pytest.raises(DatasetError, match=message):
        reverse_pagerank(fast.indptr, fast.indices)
    with pytest.raises(DatasetError, match=r"indices\.npy: neighbor id at position 0"):
        compute_scores(fast.indptr, fast.indices, ["degree"])
    with pytest.raises(DatasetError, match=r"indices\.npy: neighbor id at position 0"):
        open_dataset(ds.path, check="full")


def test_rows_without_the_bad_id_still_sample_exactly(ds):
    """A fault is reported only where it is read: other batches keep their exact samples."""
    before = OneTypeSampler(ds, [-1]).sample([5], 0)[0]
    save(ds, "indices.npy", corrupt_indices(ds.indices, "too large"))
    first = int(np.flatnonzero(np.diff(np.asarray(ds.indptr)))[0])
    assert first != 5
    after = OneTypeSampler(open_dataset(ds.path, check="fast"), [-1]).sample([5], 0)[0]
    assert torch.equal(before.nodes, after.nodes) and torch.equal(before.edge_index, after.edge_index)


# -- class 2: meta.json, key by key ---------------------------------------------------

@pytest.mark.parametrize("change, match", [
    (lambda m: m.update(num_classes=0), r"'num_classes' is 0, outside \[1, 16777216\]"),
    (lambda m: m.update(num_classes="abc"), "'num_classes' has the wrong type.*integer"),
    (lambda m: m.update(num_classes=1e12), "'num_classes' has the wrong type.*1000000000000.0"),
    (lambda m: m.update(num_classes=10 ** 12), "'num_classes' is 1000000000000, outside"),
    (lambda m: m.update(num_classes=True), "'num_classes' has the wrong type"),
    (lambda m: m.update(num_classes=2), r"labels\.npy: label at position \d+ is [23], outside \[-1, 2\)"),
    (lambda m: m.pop("num_classes"), "'labels' names a file but 'num_classes' is missing"),
    (lambda m: m.update(splits=["train_idx.npy"]), "'splits' has the wrong type.*object"),
    (lambda m: m.update(scores="degree.npy"), "'scores' has the wrong type"),
    (lambda m: m.update(labels=7), "'labels' has the wrong type.*string"),
    (lambda m: m.update(edge_splits=[]), "'edge_splits' has the wrong type"),
    (lambda m: m.update(version="1"), "'version' has the wrong type"),
    (lambda m: m.update(num_edges=-1), "'num_edges' is -1, outside"),
    (lambda m: m.update(num_nodes=0), "'num_nodes' is 0, outside"),
    (lambda m: m.update(name=5), "'name' has the wrong type"),
    (lambda m: m.update(generator=[1]), "'generator' has the wrong type"),
    (lambda m: m.update(num_users=True, num_items=1), "'num_users' has the wrong type"),
    (lambda m: m.update(num_users=100, num_items=99), "must be positive and sum to num_nodes"),
    (lambda m: m["features"].update(dim=0), r"'features\.dim' is 0, outside"),
    (lambda m: m["features"].update(page_size=None), r"'features\.page_size' is null"),
    (lambda m: m["graph"].update(indptr=["indptr.npy"]), r"'graph\.indptr' has the wrong type"),
    (lambda m: m["checksums"].update({"indptr.npy": 5}), r"'checksums\.indptr\.npy' must be a string"),
    (lambda m: m.update(graph=None), "key 'graph' is null"),
])
def test_every_meta_key_is_type_and_range_checked(ds, change, match):
    edit_meta(ds, change)
    with pytest.raises(DatasetError, match=match):
        open_dataset(ds.path, check="fast")


@pytest.mark.parametrize("key, name", [
    ("graph.indptr", "/etc/passwd"), ("graph.indices", "../other/indices.npy"), ("labels", "sub/../../x.npy"),
    ("features.file", "/dev/zero"), ("splits.train", "..\\train_idx.npy"), ("scores.degree", "../degree.npy"),
])
def test_file_names_stay_inside_the_dataset(ds, key, name):
    def change(meta):
        *parents, last = key.split(".")
        node = meta
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = name
    edit_meta(ds, change)
    with pytest.raises(DatasetError, match=rf"key '{key}' is .*not a file inside the dataset directory"):
        open_dataset(ds.path)


def test_non_finite_scores_and_big_endian_arrays_are_refused(ds):
    from lsm_gnn.cli.prepare import recompute_scores

    recompute_scores(ds.path, ["degree"])
    name = open_dataset(ds.path).meta["scores"]["degree"]
    scores = np.load(os.path.join(ds.path, name))
    scores[4] = np.inf
    save(ds, name, scores)
    with pytest.raises(DatasetError, match=r"'degree' score at position 4 is inf, not a finite number"):
        open_dataset(ds.path, check="fast")
    save(ds, "train_idx.npy", np.asarray(ds.split("train")).astype(">i8"))
    with pytest.raises(DatasetError, match=r"train_idx\.npy: the train split array is stored in non-native byte"):
        open_dataset(ds.path)


# -- class 3: ids of every integer dtype ---------------------------------------------

@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "uint64", "int8", ">i8", ">u4", "<i2"])
def test_seeds_of_every_integer_dtype_and_byte_order(ds, dtype):
    seeds = np.array([3, 1, 100], dtype=np.int64)
    expected = OneTypeSampler(ds, [3, 2], seed=4).sample(seeds, 2)
    got = OneTypeSampler(ds, [3, 2], seed=4).sample(seeds.astype(dtype), 2)
    assert all(torch.equal(a.nodes, b.nodes) and torch.equal(a.edge_index, b.edge_index)
               for a, b in zip(expected, got))


def test_unsigned_torch_ids_and_bad_id_types():
    assert as_id_tensor(torch.tensor([1, 2], dtype=torch.uint32)).tolist() == [1, 2]
    assert as_id_tensor(np.array([(1 << 63) - 1], dtype=np.uint64)).tolist() == [(1 << 63) - 1]
    with pytest.raises(IndexError, match=r"node id 9223372036854775808 at position 1 is out of range"):
        as_id_tensor(np.array([0, 1 << 63], dtype=np.uint64))
    with pytest.raises(TypeError, match="got dtype bool.*flatnonzero"):
        as_id_tensor(np.array([True, False]))
    with pytest.raises(TypeError, match="got dtype float64"):
        as_id_tensor([1.5])
    with pytest.raises(TypeError, match="got dtype torch.float16"):
        as_id_tensor(torch.tensor([1.0], dtype=torch.float16))


def test_seed_out_of_range_names_the_id_and_range(ds):
    sampler = OneTypeSampler(ds, [2])
    with pytest.raises(IndexError, match=rf"seed node {NUM_NODES} at position 1 is outside \[0, {NUM_NODES}\)"):
        sampler.sample([0, NUM_NODES])
    with pytest.raises(IndexError, match=r"seed node -1 at position 0 is outside"):
        sampler.sample(np.array([-1], dtype=np.int16))


# -- the command line: exit 1 with one line, never a signal -------------------------

def run_cli(*args):
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "lsm_gnn", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)


def assert_one_line_error(result, *expected):
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])  # a signal would be negative
    err = result.stderr.strip()
    assert "Traceback" not in err and "\n" not in err, err
    assert err.startswith("lsm-gnn: error: ") and all(e in err for e in expected), err


@pytest.mark.parametrize("index_dtype, corrupt, expected", [
    ("int32", lambda d: save(d, "indices.npy", corrupt_indices(d.indices, "negative")), "indices.npy: neighbor id -1"),
    ("int64", lambda d: save(d, "indices.npy", corrupt_indices(d.indices, "too large")),
     f"indices.npy: neighbor id {NUM_NODES + 5}"),
    ("int32", lambda d: save(d, "indptr.npy", corrupt_indptr(d.indptr, "non-monotonic")),
     "indptr.npy: indptr decreases"),
    ("int64", lambda d: save(d, "indptr.npy", corrupt_indptr(d.indptr, "huge")), "indptr.npy: indptr decreases"),
])
@pytest.mark.slow
def test_training_a_corrupt_dataset_exits_1_with_one_line(tmp_path, index_dtype, corrupt, expected):
    pytest.importorskip("torch_geometric")
    ds = make_dataset(tmp_path / "ds", index_dtype)
    corrupt(ds)
    result = run_cli("train", f"dataset={ds.path}", "train.epochs=1", "sampler.batch_size=64",
                     "sampler.fanouts=[-1, 4]", "model.hidden=8", "log.progress=false", "cache.static_score=none",
                     "cache.capacity=100%", f"log.dir={tmp_path / 'log'}", f"checkpoint.dir={tmp_path / 'ckpt'}")
    assert_one_line_error(result, expected, "re-create the dataset")


@pytest.mark.parametrize("corrupt, expected", [
    (lambda d: save(d, "indices.npy", corrupt_indices(d.indices, "too large")), "indices.npy: neighbor id"),
    (lambda d: save(d, "indptr.npy", corrupt_indptr(d.indptr, "negative")), "indptr.npy: indptr decreases"),
    (lambda d: edit_meta(d, lambda m: m.update(num_classes="abc")), "'num_classes' has the wrong type"),
])
@pytest.mark.slow
def test_prepare_scores_and_inspect_on_a_corrupt_dataset(tmp_path, corrupt, expected):
    ds = make_dataset(tmp_path / "ds")
    corrupt(ds)
    assert_one_line_error(run_cli("prepare", "scores", ds.path), expected)
    assert_one_line_error(run_cli("inspect", ds.path, "--verify"), expected.split(": ")[0])
