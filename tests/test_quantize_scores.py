"""Static scores quantize to uint16 dense ranks, whatever the block the ranking runs in: the oracle is the
whole-array dense rank (np.unique's inverse index) over float64, as the cache defined it first."""
import numpy as np
import pytest

from lsm_gnn.cache import quantize_scores


def whole_array_ranks(scores) -> np.ndarray:
    scores = np.asarray(scores, dtype=np.float64)
    uniq, inverse = np.unique(scores, return_inverse=True)
    if uniq.size <= 1:
        return np.zeros(scores.shape, dtype=np.uint16)
    return np.round(inverse.reshape(scores.shape) * (65535.0 / (uniq.size - 1))).astype(np.uint16)


rng = np.random.default_rng(7)
CASES = {
    "float32 pagerank-like": rng.pareto(1.5, 1001).astype(np.float32),
    "float16 with ties": rng.integers(0, 9, 333).astype(np.float16),
    "small int degrees": rng.integers(0, 50, 777),
    "int64 beyond 2**53": rng.integers(0, 2**62, 1001),
    "NaN among values": np.array([1.0, np.nan, 2.0, np.nan, 1.0, -3.0]),
    "2-d": rng.random((30, 7)),
    "bool": np.array([True, False, True]),
    "one value": np.full(5, 3.5),
    "empty": np.array([]),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("block", [1, 3, 64, 1 << 20])
def test_blocked_dense_ranks_equal_the_whole_array_ranks(name, block):
    scores = CASES[name]
    got = quantize_scores(scores, chunk=block)
    assert got.dtype == np.uint16 and got.shape == scores.shape
    np.testing.assert_array_equal(got, whole_array_ranks(scores))


def test_a_memory_mapped_score_file_is_ranked_in_place(tmp_path):
    path = tmp_path / "scores.npy"
    scores = rng.random(5000).astype(np.float32)
    np.save(path, scores)
    mapped = np.load(path, mmap_mode="r")
    np.testing.assert_array_equal(quantize_scores(mapped, chunk=999), whole_array_ranks(scores))
