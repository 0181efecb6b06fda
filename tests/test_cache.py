"""The software cache returns exactly the bytes on disk and makes the reference model's decisions."""
import threading

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lsm_gnn import open_storage, testing
from lsm_gnn.cache import (
    POLICIES, PolicyConfig, ReferenceCache, SoftwareCache, WindowBuffer, belady_min, belady_reference, cache_geometry,
    replay,
)
from lsm_gnn.cache.geometry import set_of
from lsm_gnn.testing import write_tiny_dataset

N = 600  # nodes of the tiny_cache fixture (conftest.py)


def power_law_trace(seed, iterations, batch, n=N, skew=0.9):
    return testing.power_law_trace(seed, iterations, batch, n, skew)


def run_both(storage, static, trace, policy, num_sets, ways, window=8, period=2):
    """Drives the reference and native caches side by side, checking rows and metadata each iteration."""
    features = storage._rows
    config = PolicyConfig(policy, window=window, period=period)
    ref = ReferenceCache(storage, num_sets, ways, config, static_scores=static)
    nat = SoftwareCache(storage, num_sets=num_sets, ways=ways, policy=config, static_scores=static)
    for current, future in replay(trace, window, num_nodes=storage.num_rows):
        rows_ref, hit_ref = ref.lookup(current, future=future)
        rows_nat, hit_nat = nat.lookup(current, future=future)
        expected = features[current]
        assert torch.equal(rows_ref, expected)
        assert torch.equal(rows_nat, expected)
        assert torch.equal(hit_ref, hit_nat), f"iteration {ref.iteration - 1}: different hits"
        a, b = ref.snapshot(), nat.snapshot()
        for key in a:
            assert np.array_equal(a[key], b[key]), f"iteration {ref.iteration - 1}: {key} differs"
    assert ref.stats.as_dict() == nat.stats.as_dict()
    return nat


@pytest.mark.parametrize("policy", list(POLICIES))
def test_native_cache_makes_the_reference_decisions(tiny_cache, policy):
    storage, _, static = tiny_cache
    nat = run_both(storage, static, power_law_trace(0, 60, 40), policy, num_sets=4, ways=16)
    assert nat.stats.evictions > 0 and nat.stats.hits > 0  # the trace really exercises eviction


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), policy=st.sampled_from(list(POLICIES)), num_sets=st.integers(1, 5),
       ways=st.sampled_from([1, 2, 4, 32]), batch=st.integers(1, 40), window=st.integers(1, 10),
       period=st.integers(1, 4), skew=st.floats(0.0, 1.5))
def test_property_native_equals_reference(tiny_cache, seed, policy, num_sets, ways, batch, window, period, skew):
    storage, _, static = tiny_cache
    batch = min(batch, num_sets * ways)
    run_both(storage, static, power_law_trace(seed, 15, batch, skew=skew), policy, num_sets, ways,
             window=window, period=min(period, window))


@pytest.mark.parametrize("policy", list(POLICIES))
def test_adversarial_batches(tiny_cache, policy):
    storage, features, static = tiny_cache
    same_set = [v for v in range(N) if set_of([v], 8)[0] == 3][:40]  # every id in one set
    trace = [
        list(range(64)),            # all misses, exactly the capacity
        list(range(64)),            # all hits
        same_set,                   # one set, more ids than ways: lines of this batch evicted
        [5] * 50 + [7] * 3,         # duplicates
        list(range(N - 64, N)),     # all misses again, evicting everything
        [],                         # an empty batch
        list(range(63, -1, -1)),    # reversed
    ]
    nat = run_both(storage, static, trace, policy, num_sets=8, ways=8, window=3, period=1)
    assert nat.stats.evicted_in_use > 0


def test_capacity_smaller_than_a_batch_is_an_error(tiny_cache):
    storage = tiny_cache[0]
    cache = SoftwareCache(storage, num_sets=2, ways=4)
    with pytest.raises(ValueError, match="9 distinct ids but the cache holds 8 lines.*oversubscribe"):
        cache.lookup(list(range(9)))
    rows, hit = cache.lookup(list(range(8)) * 3)  # 8 distinct ids fit, however repeated
    assert torch.equal(rows, tiny_cache[1][list(range(8)) * 3]) and not hit.any()


@pytest.mark.parametrize("policy", list(POLICIES))
def test_oversubscribed_cache_matches_the_reference(tiny_cache, policy):
    storage, _, static = tiny_cache
    config = PolicyConfig(policy, window=6, period=2)
    ref = ReferenceCache(storage, 2, 4, config, static_scores=static, oversubscribe=True)
    nat = SoftwareCache(storage, num_sets=2, ways=4, policy=config, static_scores=static, oversubscribe=True)
    for current, future in replay(power_law_trace(2, 30, 40), 6, num_nodes=N):
        rows_ref, hit_ref = ref.lookup(current, future)
        rows_nat, hit_nat = nat.lookup(current, future)
        assert torch.equal(rows_ref, storage._rows[current]) and torch.equal(rows_nat, rows_ref)
        assert torch.equal(hit_ref, hit_nat)
        for key, value in ref.snapshot().items():
            assert np.array_equal(value, nat.snapshot()[key]), key
    assert nat.stats.as_dict() == ref.stats.as_dict() and nat.stats.evicted_in_use > 0


def test_capacity_in_bytes_and_strings(tiny_cache):
    storage = tiny_cache[0]
    assert cache_geometry("2K", storage.row_bytes, 4) == (2048 // storage.row_bytes // 4, 4)
    cache = SoftwareCache(storage, capacity=storage.row_bytes * 64, ways=32)
    assert (cache.num_sets, cache.ways, cache.num_lines) == (2, 32, 64)
    with pytest.raises(ValueError, match="fewer than one set"):
        SoftwareCache(storage, capacity=storage.row_bytes * 31, ways=32)
    with pytest.raises(ValueError, match="byte size"):
        SoftwareCache(storage, capacity="lots")


@pytest.mark.parametrize("kwargs, match", [
    ({"policy": "fifo"}, "unknown cache policy.*hybrid"),
    ({"window": 0}, "window"),
    ({"window": 70000}, "window"),
    ({"period": 0}, "period"),
    ({"threshold": 999}, "threshold"),
    ({"policy": "hybrid", "levels": ("none", "far", "near")}, "levels"),
    ({"policy": "static", "levels": ("none", "far", "fresh", "near")}, "only apply"),
])
def test_bad_policy_configs_name_the_problem(tiny_cache, kwargs, match):
    with pytest.raises(ValueError, match=match):
        SoftwareCache(tiny_cache[0], num_sets=2, ways=4, **kwargs)


def test_out_of_range_and_float_ids(tiny_cache):
    cache = SoftwareCache(tiny_cache[0], num_sets=2, ways=4)
    with pytest.raises(IndexError, match=str(N)):
        cache.lookup([1, N])
    with pytest.raises(IndexError, match="-3"):
        cache.lookup([-3])
    with pytest.raises(TypeError, match="integers"):
        cache.lookup(torch.tensor([1.5]))


def test_static_scores_must_cover_every_node(tiny_cache):
    with pytest.raises(ValueError, match="static_scores"):
        SoftwareCache(tiny_cache[0], num_sets=2, ways=4, static_scores=np.zeros(10, np.float32))


def test_custom_levels_change_the_order(tiny_cache):
    storage, _, static = tiny_cache
    trace = power_law_trace(3, 40, 30)
    a = run_both(storage, static, trace, "hybrid", 4, 8)
    config = PolicyConfig("hybrid", window=8, period=2, levels=("fresh", "none", "far", "near"))
    b = SoftwareCache(storage, num_sets=4, ways=8, policy=config, static_scores=static)
    ref = ReferenceCache(storage, 4, 8, config, static_scores=static)
    for current, future in replay(trace, 8, num_nodes=N):
        b.lookup(current, future)
        ref.lookup(current, future)
    assert b.stats.as_dict() == ref.stats.as_dict()
    assert b.stats.hits != a.stats.hits  # the order matters on this trace


def test_window_index_matches_a_scan_of_the_batches():
    from lsm_gnn import _C

    rng = np.random.default_rng(5)
    window = WindowBuffer(10, num_nodes=50)
    for _ in range(10):
        window.push(rng.integers(0, 50, 12))
    for step in range(30):
        ids = torch.arange(50)
        records = window.index.next_records(ids, 6).numpy().view(np.uint64)
        for v in range(50):
            expect = next(((k + 1, int(np.flatnonzero(window[k].numpy() == v)[0]))
                           for k in range(min(6, len(window))) if (window[k] == v).any()), None)
            reuse = int(records[v] >> np.uint64(48))
            if expect is None:
                assert reuse == 0xFFFF
            else:
                assert (reuse, int(records[v] & np.uint64((1 << 40) - 1))) == expect
        window.pop()
        window.push(rng.integers(0, 50, rng.integers(0, 20)))
    with pytest.raises(IndexError):
        _C.WindowIndex(5).push(torch.tensor([5]), 0)


def test_plain_list_future_equals_window_buffer(tiny_cache):
    storage, _, static = tiny_cache
    trace = power_law_trace(9, 30, 30)
    a = SoftwareCache(storage, num_sets=4, ways=8, policy="hybrid", window=8, period=2, static_scores=static)
    b = SoftwareCache(storage, num_sets=4, ways=8, policy="hybrid", window=8, period=2, static_scores=static)
    for current, future in replay(trace, 8, num_nodes=N):
        a.lookup(current, future)
        b.lookup(current, list(future))
    assert a.stats.as_dict() == b.stats.as_dict()


def test_concurrent_lookups_never_return_a_wrong_row(tiny_cache):
    storage, features, static = tiny_cache
    cache = SoftwareCache(storage, num_sets=4, ways=16, policy="hybrid", static_scores=static)
    errors = []

    def worker(seed):
        for ids in power_law_trace(seed, 40, 50):
            rows, _ = cache.lookup(ids)
            if not torch.equal(rows, features[ids]):
                errors.append(seed)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and cache.stats.iterations == 240


@pytest.mark.parametrize("policy", ["farthest", "lru"])  # overflowing sets: bypassed misses, lines taken twice
@pytest.mark.parametrize("pvp", [False, True])
@pytest.mark.parametrize("backend,read_ahead", [("io_uring", 0), ("pread", 0), ("io_uring", 2), ("pread", 3)])
def test_misses_read_into_their_lines_over_the_ssd_backends(tmp_path, backend, read_ahead, pvp, policy):
    """Over an SSD backend the misses are read straight into their lines (read_into); every batch must equal
    the file, with and without PVP and read-ahead, and batches whose sets overflow (a miss bypassed, or a line
    taken twice) take the other path. Every row is read once: at its lookup, or ahead of it."""
    dataset, features = write_tiny_dataset(tmp_path / "ds", num_nodes=400, dim=33)
    trace = power_law_trace(5, 60, 70, n=400)
    with open_storage(dataset, backend) as storage:
        cache = SoftwareCache(storage, num_sets=2, ways=32, policy=policy, window=6, period=1, pvp=pvp,
                              pvp_queue_capacity=8, oversubscribe=True, read_ahead=read_ahead)
        for k, (current, future) in enumerate(replay(trace, 6, num_nodes=400)):
            rows, _ = cache.lookup(current, future=future)
            assert np.array_equal(rows.numpy(), features[current]), f"batch {k}"
        cache.settle()
        ahead = cache.read_ahead.stats if read_ahead else None
        early = 0 if ahead is None else ahead.used
        assert storage.stats().unique_rows == cache.stats.misses - early + (0 if ahead is None else ahead.read)
        assert ahead is None or early > 0
        overflowed = cache.stats.bypassed if policy == "farthest" else cache.stats.evicted_in_use
        assert overflowed > 0 and (not pvp or cache.stats.pvp_hits > 0)


@pytest.mark.parametrize("backend", ["io_uring", "pread"])
def test_cache_over_the_ssd_backends(tiny_cache, tmp_path, backend):
    dataset, features = write_tiny_dataset(tmp_path / "ds", num_nodes=300, dim=130)
    with open_storage(dataset, backend) as storage:
        cache = SoftwareCache(storage, num_sets=2, ways=32, policy="lru")
        for ids in power_law_trace(1, 20, 50, n=300):
            rows, _ = cache.lookup(ids)
            assert np.array_equal(rows.numpy(), features[ids])
        assert storage.stats().unique_rows == cache.stats.misses
        assert storage.stats().bytes_useful == cache.stats.bytes_read


# -- Belady ----------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_belady_is_optimal_on_tiny_traces(seed):
    rng = np.random.default_rng(seed)
    trace = [rng.integers(0, 6, rng.integers(1, 4)) for _ in range(6)]
    for capacity in (1, 2, 3):
        hits, total = belady_reference(trace, capacity)
        assert hits == testing.brute_force_min(trace, capacity)
        assert belady_min(trace, capacity, num_nodes=6) == (hits, total)


@pytest.mark.parametrize("capacity", [0, 10, 64, 200])
def test_native_belady_equals_reference(capacity):
    trace = power_law_trace(4, 60, 50)
    assert belady_min(trace, capacity, num_nodes=N) == belady_reference(trace, capacity)


def test_belady_bounds_every_policy(tiny_cache):
    storage, _, static = tiny_cache
    trace = power_law_trace(11, 80, 40)
    optimum, total = belady_reference(trace, 64)
    for policy in POLICIES:
        cache = SoftwareCache(storage, num_sets=2, ways=32, policy=policy, window=16, period=1, static_scores=static)
        for current, future in replay(trace, 16, num_nodes=N):
            cache.lookup(current, future)
        assert cache.stats.unique == total
        assert cache.stats.hits <= optimum, policy


def test_lookup_fills_a_given_out_tensor(tiny_cache):
    storage, features, _ = tiny_cache
    cache = SoftwareCache(storage, num_sets=4, ways=16)
    ids = torch.tensor([5, 9, 5, 300])
    out = torch.empty((4, storage.dim), dtype=storage.dtype)
    for _ in range(2):  # a miss pass, then a hit pass
        rows, _ = cache.lookup(ids, out=out)
        assert rows is out and torch.equal(out, features[ids])
    with pytest.raises(ValueError, match="shape"):
        cache.lookup(ids, out=torch.empty((3, storage.dim), dtype=storage.dtype))


class FlakyStorage:
    """Storage whose reads fail when ``fail`` is set (a disk error in the middle of a lookup)."""

    writable = False
    read_into = None  # no direct read into the cache's lines: the cache reads, then copies

    def __init__(self, storage):
        self._inner, self.fail = storage, False
        self.num_rows, self.dim, self.dtype = storage.num_rows, storage.dim, storage.dtype
        self.row_bytes, self.backend = storage.row_bytes, storage.backend

    def read(self, ids):
        if self.fail:
            raise OSError("injected read error")
        return self._inner.read(ids)


class FlakyDirectStorage(FlakyStorage):
    """The same with the direct read into cache lines; a failing read first leaves garbage in half its
    slots (rows the disk returned before the error, or a torn read)."""

    def read_into(self, ids, out, slots):
        if self.fail:
            out[slots[: len(slots) // 2]] = 7.5
            raise OSError("injected read error")
        self._inner.read_into(ids, out, slots)


@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("pvp", [False, True])
def test_a_failed_read_leaves_no_line_with_stale_bytes(tiny_cache, pvp, direct):
    storage, features, static = tiny_cache
    flaky = (FlakyDirectStorage if direct else FlakyStorage)(storage)
    trace = power_law_trace(3, 40, 40)
    cache = SoftwareCache(flaky, num_sets=4, ways=16, window=4, period=1, static_scores=static, pvp=pvp,
                          pvp_queue_capacity=8)
    for k, (current, future) in enumerate(replay(trace, 4, num_nodes=storage.num_rows)):
        if k % 3 == 1:  # this iteration's read fails once; the retry must still get the file's bytes
            flaky.fail = True
            with pytest.raises(OSError, match="injected"):
                cache.lookup(current, future=future)
            flaky.fail = False
        rows, _ = cache.lookup(current, future=future)
        assert torch.equal(rows, features[current]), f"iteration {k}"
    assert cache.stats.iterations == len(trace)
