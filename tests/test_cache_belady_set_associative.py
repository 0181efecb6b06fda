"""Set-associative Belady: the native bound equals its Python definition, is optimal, sits below the
fully associative bound, and bounds every real policy on the same sets and ways."""
import numpy as np
import pytest

from lsm_gnn import testing
from lsm_gnn.cache import (
    POLICIES, SoftwareCache, belady_min, belady_reference, belady_set_associative, belady_set_associative_reference,
    replay,
)
from lsm_gnn.cache.geometry import set_of

N = 600  # nodes of the tiny_cache fixture (conftest.py)


def same_set_ids(num_sets, count, target=0):
    """The first ``count`` ids that the cache maps to set ``target``: a set under maximal conflict."""
    ids = np.arange(N)
    return ids[set_of(ids, num_sets) == target][:count]


@pytest.mark.parametrize("seed", range(4))
def test_set_associative_min_is_optimal_on_tiny_traces(seed):
    rng = np.random.default_rng(seed)
    trace = [rng.integers(0, 7, rng.integers(1, 4)) for _ in range(6)]
    for num_sets, ways in ((2, 1), (2, 2), (3, 1)):
        hits, total = belady_set_associative_reference(trace, num_sets, ways)
        assert hits == testing.brute_force_min(trace, ways, num_sets), (num_sets, ways)
        assert belady_set_associative(trace, num_sets, ways, num_nodes=7) == (hits, total)


@pytest.mark.parametrize("num_sets,ways", [(1, 0), (1, 7), (3, 4), (8, 2), (16, 32)])
@pytest.mark.parametrize("seed", range(3))
def test_native_equals_reference_on_random_traces(seed, num_sets, ways):
    trace = testing.power_law_trace(seed, 50, 40, N, 0.9)
    assert belady_set_associative(trace, num_sets, ways, num_nodes=N) == \
        belady_set_associative_reference(trace, num_sets, ways)


@pytest.mark.parametrize("ways", [1, 3, 8])
def test_native_equals_reference_on_adversarial_traces(ways):
    hot = same_set_ids(4, 3 * ways)  # every id in one set: the other three stay empty
    cyclic = [hot[(k + np.arange(ways + 1)) % hot.size] for k in range(40)]  # windows one longer than a set
    scan = [hot] * 5  # batches larger than a set, reused every iteration
    rng = np.random.default_rng(ways)
    mixed = [np.concatenate([rng.choice(hot, 2 * ways), rng.integers(0, N, 5)]) for _ in range(30)]
    for trace in (cyclic, scan, mixed):
        expected = belady_set_associative_reference(trace, 4, ways)
        assert belady_set_associative(trace, 4, ways, num_nodes=N) == expected
        # One set does all the work, so the bound is that of a single set of `ways` lines.
        if trace is not mixed:
            assert expected == belady_reference(trace, ways)


@pytest.mark.parametrize("capacity", [0, 5, 64, 200])
def test_one_set_is_fully_associative_min(capacity):
    trace = testing.power_law_trace(7, 60, 50, N, 0.9)
    assert belady_set_associative_reference(trace, 1, capacity) == belady_reference(trace, capacity)
    for count_from in (0, 10):
        assert belady_set_associative(trace, 1, capacity, N, count_from) == belady_min(trace, capacity, N, count_from)


@pytest.mark.parametrize("num_sets,ways", [(2, 32), (8, 8), (25, 4)])
def test_sets_cost_hits(num_sets, ways):
    trace = testing.power_law_trace(3, 80, 50, N, 0.9)
    sa, total = belady_set_associative(trace, num_sets, ways, N)
    fa, total_fa = belady_min(trace, num_sets * ways, N)
    assert total == total_fa
    assert sa <= fa


@pytest.mark.parametrize("num_sets,batch", [(2, 40), (1, 90)])  # 90 ids > the 64 lines: oversubscribed
def test_set_associative_min_bounds_every_policy(tiny_cache, num_sets, batch):
    storage, _, static = tiny_cache
    trace = testing.power_law_trace(11, 80, batch, N, 0.9)
    warmup = 10
    optimum, total = belady_set_associative(trace, num_sets, 32, N, count_from=warmup)
    for policy in POLICIES:
        cache = SoftwareCache(storage, num_sets=num_sets, ways=32, policy=policy, window=16, period=2,
                              static_scores=static, oversubscribe=True)
        for t, (current, future) in enumerate(replay(trace, 16, num_nodes=N)):
            if t == warmup:
                hits0, unique0 = cache.stats.hits, cache.stats.unique
            cache.lookup(current, future)
        assert cache.stats.unique - unique0 == total
        assert cache.stats.hits - hits0 <= optimum, policy


def test_rejects_bad_geometry():
    with pytest.raises(ValueError, match="num_sets"):
        belady_set_associative([np.array([1])], 0, 4, num_nodes=N)
    with pytest.raises(ValueError, match="num_sets"):
        belady_set_associative_reference([np.array([1])], 0, 4)
    with pytest.raises(IndexError):
        belady_set_associative([np.array([N])], 1, 4, num_nodes=N)
