"""What a training process keeps per node of the graph stays narrow, with the same results as the
wide versions it replaced (see docs/architecture.md, "Memory per node")."""
import tracemalloc

import numpy as np
import pytest

from lsm_gnn.cache import quantize_scores
from lsm_gnn.comm import hotness_owner
from lsm_gnn.sampling import OneTypeSampler, sampled_access_counts


def dense_rank_oracle(scores):
    """The definition: np.unique's dense rank in float64, scaled to 0..65535."""
    scores = np.asarray(scores, dtype=np.float64)
    uniq, inverse = np.unique(scores, return_inverse=True)
    if uniq.size <= 1:
        return np.zeros(scores.shape, dtype=np.uint16)
    return np.round(inverse.reshape(scores.shape) * (65535.0 / (uniq.size - 1))).astype(np.uint16)


SCORE_CASES = {
    "float32": np.random.default_rng(0).random(3001).astype(np.float32),
    "ties": (np.random.default_rng(1).random(5000) * 50).round().astype(np.float32),
    "integers": np.random.default_rng(2).integers(0, 7, 999),
    "float64": np.random.default_rng(3).standard_normal(20_000),
    "nan_zero_inf": np.array([np.nan, 1.0, np.nan, -0.0, 0.0, np.inf, -np.inf, 2.0]),
    "all_nan": np.array([np.nan, np.nan], np.float32),
    "one": np.array([3.0]),
    "empty": np.zeros(0, np.float32),
    "two_dims": np.random.default_rng(4).random((40, 7)),
}


@pytest.mark.parametrize("case", sorted(SCORE_CASES))
@pytest.mark.parametrize("chunk", [3, 1 << 22])
def test_quantized_scores_equal_the_dense_rank_definition(case, chunk):
    scores = SCORE_CASES[case]
    got = quantize_scores(scores, chunk=chunk)
    expected = dense_rank_oracle(scores)
    assert got.dtype == np.uint16 and got.shape == expected.shape
    assert np.array_equal(got, expected)


def test_quantizing_float32_scores_peaks_near_15_bytes_per_node():
    """A float64 copy and np.unique's int64 temporaries peaked at 55 B/node (5.5 GB at 10^8 nodes)."""
    n = 1_000_000
    scores = np.random.default_rng(5).random(n, dtype=np.float32)
    tracemalloc.start()
    try:
        quantize_scores(scores, chunk=1 << 16)  # float temporaries of a chunk, not of every node
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak / n <= 20, f"quantize_scores peaked at {peak / n:.1f} B/node"


@pytest.mark.parametrize("world_size,dtype", [(1, np.uint8), (4, np.uint8), (256, np.uint8), (257, np.uint16)])
def test_hotness_owners_take_the_narrowest_type_and_the_same_ranks(world_size, dtype):
    n = 5000
    counts = (np.random.default_rng(world_size).pareto(1.5, n) * 10).astype(np.int64)
    counts[::3] = 0  # untouched nodes fall back to modulo
    owners = hotness_owner(counts, world_size).owners
    expected = (np.arange(n) % world_size).astype(np.int64)
    hot = np.flatnonzero(counts > 0)
    hot = hot[np.argsort(-counts[hot], kind="stable")]
    position = np.arange(hot.size) % (2 * world_size)
    expected[hot] = np.where(position < world_size, position, 2 * world_size - 1 - position)
    assert owners.dtype == dtype
    assert np.array_equal(owners.astype(np.int64), expected)


def test_sampled_access_counts_equal_a_bincount_per_batch(loader_graph):
    dataset, _ = loader_graph
    counts = sampled_access_counts(dataset, [3, 2], batch_size=50, num_batches=5, seed=3)
    sampler = OneTypeSampler(dataset, [3, 2], seed=3)
    seeds = np.asarray(dataset.split("train"), dtype=np.int64)
    rng = np.random.default_rng([3, 7])
    expected = np.zeros(dataset.num_nodes, dtype=np.int64)
    for b in range(5):
        batch = rng.choice(seeds, min(50, seeds.size), replace=False)
        expected += np.bincount(sampler.input_nodes(batch, -1 - b).numpy(), minlength=dataset.num_nodes)
    assert counts.dtype == np.int64 and expected.sum() > 0
    assert np.array_equal(counts, expected)
