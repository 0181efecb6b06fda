"""A short, reproducible run of the dataset fuzzer (benchmarks/fuzz_dataset.py runs it for minutes):
every corrupted dataset gives a clear DatasetError or the exact right answer."""
import importlib.util
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZ_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "fuzz_dataset.py")
spec = importlib.util.spec_from_file_location("fuzz_dataset", FUZZ_PATH)
fuzz = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fuzz)


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    return {d: fuzz.make_base(str(tmp / f"base-{d}"), index_dtype=d) for d in ("int32", "int64")}, tmp


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(index_dtype=st.sampled_from(["int32", "int64"]), case=fuzz.mutations)
def test_corrupted_dataset_is_refused_clearly_or_answered_exactly(bases, index_dtype, case):
    paths, tmp = bases
    fuzz.run_case(paths[index_dtype], str(tmp / "work"), case)


def test_the_reference_matches_the_native_sampler_on_a_valid_dataset(bases):
    paths, tmp = bases
    assert fuzz.run_case(paths["int64"], str(tmp / "work"), [("meta", "name", "renamed")]) == "accepted"


@pytest.mark.parametrize("case", [
    [("set", "indices.npy", 0, -1)],
    [("set", "indices.npy", 7, fuzz.NUM_NODES)],
    [("set", "indptr.npy", 5, -3)],
    [("swap", "indptr.npy", 3, 30)],
    [("set", "labels.npy", 2, 3)],
    [("set_float", "scores/degree.npy", 1, float("nan"))],
    [("set", "val_edges.npy", 3, fuzz.NUM_NODES)],
    [("meta", "num_classes", 1e12)],
    [("meta", "splits", ["train_idx.npy"])],
    [("meta", "graph.indices", "../base-int32/indices.npy")],
    [("meta", "scores", None)],  # found by the long run: readers do meta.get("scores", {})
    [("meta", "edge_splits", None)],
    [("meta", "splits", {"\n": None})],  # messages stay one line whatever the keys hold
    [("meta", "scores", {"degree": "x\n.npy"})],
])
def test_known_corruptions(bases, case):
    """Cases the random search must never regress on; corrupt neighbor ids pass the fast open and are
    caught by the native code, everything else is refused on open."""
    paths, tmp = bases
    outcome = fuzz.run_case(paths["int32"], str(tmp / "work"), case)
    assert outcome == ("accepted" if case[0][1] == "indices.npy" else "rejected")


def test_reference_sampler_detects_what_the_native_one_must(bases):
    indptr, indices = np.array([0, 2, 3]), np.array([1, 5, 0])
    with pytest.raises(fuzz.CorruptCSR):
        fuzz.reference_sample(indptr, indices, [0], [-1], seed=0, iteration=0)
    assert fuzz.reference_sample(indptr, indices, [1], [-1], seed=0, iteration=0) == [([1, 0], 1, [1], [0])]
