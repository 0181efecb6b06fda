"""The victim-buffer prefetcher (PVP): exact rows, the reference model's decisions, no stale queue,
full queues drop, consistent counts, and no prefetch thread left behind."""
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

import lsm_gnn.cache.pvp as pvp_module
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lsm_gnn import open_storage, testing
from lsm_gnn.cache import POLICIES, PolicyConfig, ReferenceCache, SoftwareCache, VictimBuffer, replay
from lsm_gnn.loader import NodeLoader

N = 600  # nodes of the tiny_cache fixture (conftest.py)


def power_law_trace(seed, iterations, batch, n=N, skew=0.9):
    return testing.power_law_trace(seed, iterations, batch, n, skew)


def check_counts(cache: SoftwareCache):
    s, v = cache.stats, cache.pvp.stats
    assert s.unique == s.hits + s.pvp_hits + s.misses
    assert s.pvp_hits == v.hits and v.bytes_saved == v.hits * cache.storage.row_bytes
    assert s.bytes_read == s.misses * cache.storage.row_bytes
    assert v.offered == s.evictions  # every eviction is queued or dropped, once
    assert v.enqueued == v.hits + v.unused + cache.pvp.pending
    assert v.prefetched <= v.enqueued


def run_both(storage, static, trace, policy, num_sets, ways, window=8, period=2, capacity=4, reinstall=False,
             futures=None, oversubscribe=False):
    """Reference and native caches with PVP side by side: rows, hits, cache metadata, queues and counts."""
    features = storage._rows
    config = PolicyConfig(policy, window=window, period=period)
    ref = ReferenceCache(storage, num_sets, ways, config, static_scores=static, pvp_queue_capacity=capacity,
                         pvp_reinstall=reinstall, oversubscribe=oversubscribe)
    nat = SoftwareCache(storage, num_sets=num_sets, ways=ways, policy=config, static_scores=static, pvp=True,
                        pvp_queue_capacity=capacity, pvp_reinstall=reinstall, oversubscribe=oversubscribe)
    for k, (current, future) in enumerate(replay(trace, window, num_nodes=storage.num_rows)):
        if futures is not None:
            future = futures(k)
        rows_ref, hit_ref = ref.lookup(current, future=future)
        rows_nat, hit_nat = nat.lookup(current, future=future)
        expected = features[current]
        assert torch.equal(rows_ref, expected)
        assert torch.equal(rows_nat, expected), f"iteration {k}: wrong rows"
        assert torch.equal(hit_ref, hit_nat), f"iteration {k}: different hits"
        a, b = ref.snapshot(), nat.snapshot()
        for key in a:
            assert np.array_equal(a[key], b[key]), f"iteration {k}: {key} differs"
        assert ref.pvp_snapshot() == nat.pvp.snapshot(), f"iteration {k}: victim queues differ"
        assert ref.pvp_stats == nat.pvp.stats, f"iteration {k}: PVP counts differ"
    assert ref.stats.as_dict() == nat.stats.as_dict()
    check_counts(nat)
    return nat


@pytest.mark.parametrize("reinstall", [False, True], ids=["bypass", "reinstall"])
@pytest.mark.parametrize("policy", list(POLICIES))
def test_native_pvp_makes_the_reference_decisions(tiny_cache, policy, reinstall):
    storage, _, static = tiny_cache
    nat = run_both(storage, static, power_law_trace(0, 60, 40), policy, num_sets=4, ways=16, capacity=3,
                   reinstall=reinstall)
    v = nat.pvp.stats
    assert v.hits > 0 and v.dropped_full > 0 and v.dropped_no_reuse > 0  # the trace exercises every path
    assert v.unused == 0  # an exact window: every queued line is served by its iteration


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), policy=st.sampled_from(list(POLICIES)), num_sets=st.integers(1, 5),
       ways=st.sampled_from([1, 2, 4, 32]), batch=st.integers(1, 40), window=st.integers(1, 10),
       period=st.integers(1, 4), skew=st.floats(0.0, 1.5), capacity=st.integers(1, 20), reinstall=st.booleans())
def test_property_native_pvp_equals_reference(tiny_cache, seed, policy, num_sets, ways, batch, window, period, skew,
                                              capacity, reinstall):
    storage, _, static = tiny_cache
    batch = min(batch, num_sets * ways)
    run_both(storage, static, power_law_trace(seed, 15, batch, skew=skew), policy, num_sets, ways,
             window=window, period=min(period, window), capacity=capacity, reinstall=reinstall)


@pytest.mark.parametrize("policy", ["rr", "hybrid_pvp"])
def test_inexact_windows_never_serve_a_wrong_or_stale_row(tiny_cache, policy):
    """The window lies (it holds other batches): queued lines point at wrong positions and iterations;
    rows stay exact, invalid lines go unused, and the native cache still equals the reference."""
    storage, _, static = tiny_cache
    trace = power_law_trace(3, 50, 40)
    lies = power_law_trace(4, 60, 40)
    nat = run_both(storage, static, trace, policy, num_sets=4, ways=16, window=6, period=1, capacity=8,
                   futures=lambda k: lies[k + 1:k + 7] if k % 3 else trace[k + 1:k + 7])
    assert nat.pvp.stats.unused > 0


def test_oversubscribed_cache_with_pvp_matches_the_reference(tiny_cache):
    storage, _, static = tiny_cache
    for policy in ("rr", "hybrid", "hybrid_pvp_room"):
        run_both(storage, static, power_law_trace(2, 30, 40), policy, num_sets=2, ways=4, window=6, capacity=5,
                 oversubscribe=True)


def test_queues_are_never_served_after_their_iteration():
    vb = VictimBuffer(window=4, queue_capacity=3, dim=2, dtype=torch.float32)
    cache_data = torch.arange(20, dtype=torch.float32).reshape(10, 2)
    record = lambda reuse, index: (reuse << 48) | index  # noqa: E731
    tags = torch.tensor([7, 8, 9])
    records = torch.tensor([record(1, 0), record(2, 1), record(3, 2)])
    lines = torch.tensor([1, 2, 3])
    vb.enqueue(tags, records, lines, cache_data, iteration=0, scan_base=0)  # for iterations 1, 2, 3
    assert vb.snapshot() == {1: [(7, record(1, 0))], 2: [(8, record(2, 1))], 3: [(9, record(3, 2))]}
    node, _, rows = vb.take(1)
    assert node.tolist() == [7] and torch.equal(rows, cache_data[1:2])
    vb.consumed(1, 1)
    node, _, _ = vb.take(3)  # iteration 2 was skipped: its queue expires instead of serving later
    assert node.tolist() == [9]
    vb.consumed(3, 0)
    assert vb.stats.hits == 1 and vb.stats.unused == 2 and vb.pending == 0
    assert vb.take(2)[0].numel() == 0  # a passed iteration finds nothing
    assert vb.snapshot() == {}
    # A record whose reuse is already past, or beyond the window, is dropped.
    vb.enqueue(torch.tensor([5, 6]), torch.tensor([record(2, 0), record(9, 0)]), torch.tensor([0, 0]), cache_data,
               iteration=4, scan_base=2)
    assert vb.stats.dropped_no_reuse == 2 and vb.stats.enqueued == 3


def test_full_queues_drop_instead_of_overwriting():
    vb = VictimBuffer(window=2, queue_capacity=2, dim=3, dtype=torch.float32)
    cache_data = torch.arange(30, dtype=torch.float32).reshape(10, 3)
    tags = torch.arange(10, 15)
    records = torch.tensor([(1 << 48) | k for k in range(5)])  # all for iteration 1
    vb.enqueue(tags, records, torch.arange(5), cache_data, iteration=0, scan_base=0)
    assert vb.stats.enqueued == 2 and vb.stats.dropped_full == 3
    node, rec, rows = vb.take(1)
    assert node.tolist() == [10, 11]  # the first two offered, intact
    assert torch.equal(rows, cache_data[:2]) and (rec & ((1 << 40) - 1)).tolist() == [0, 1]


def test_tiny_queues_drop_and_rows_stay_exact(tiny_cache):
    storage, features, static = tiny_cache
    nat = run_both(storage, static, power_law_trace(5, 60, 40), "hybrid_pvp", num_sets=4, ways=16, capacity=1)
    assert nat.pvp.stats.dropped_full > nat.pvp.stats.enqueued > 0
    for slot in range(nat.pvp.num_queues):  # every queued row is its node's row
        n = int(nat.pvp.count[slot].clamp(max=1))
        assert torch.equal(nat.pvp.data[slot, :n], features[nat.pvp.node[slot, :n]])


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "hybrid_pvp_room"])  # it reads the queues
def test_reinstalling_keeps_the_cache_as_without_pvp(tiny_cache, policy):
    """With reinstall, PVP replaces storage reads only: the cache makes the decisions it makes without
    PVP, so PVP can only raise the combined hit ratio."""
    storage, _, static = tiny_cache
    config = PolicyConfig(policy, window=8, period=2)
    plain = SoftwareCache(storage, num_sets=4, ways=16, policy=config, static_scores=static)
    pvp = SoftwareCache(storage, num_sets=4, ways=16, policy=config, static_scores=static, pvp=True,
                        pvp_queue_capacity=4, pvp_reinstall=True)
    for current, future in replay(power_law_trace(6, 60, 40), 8, num_nodes=N):
        plain.lookup(current, future)
        pvp.lookup(current, future)
        assert np.array_equal(plain.snapshot()["tags"], pvp.snapshot()["tags"])
    assert pvp.stats.hits + pvp.stats.pvp_hits + pvp.stats.misses == plain.stats.unique
    assert pvp.stats.hits == plain.stats.hits and pvp.stats.pvp_hits > 0
    assert pvp.stats.combined_hit_ratio > plain.stats.hit_ratio


def test_duplicates_in_a_batch_are_served_everywhere(tiny_cache):
    storage, features, _ = tiny_cache
    cache = SoftwareCache(storage, num_sets=1, ways=4, policy="rr", window=4, period=1, pvp=True,
                          pvp_queue_capacity=16)
    trace = [[1, 2, 3, 4], [5, 6, 7, 8], [1, 9, 1, 2, 1]]  # 1 and 2 are evicted in 1 and come back in 2
    for current, future in replay(trace, 4, num_nodes=N):
        rows, hit = cache.lookup(current, future)
        assert torch.equal(rows, features[current])
    assert cache.stats.pvp_hits == 2 and hit.tolist() == [True, False, True, True, True]


def test_hybrid_pvp_room_without_a_victim_buffer_is_hybrid(tiny_cache):
    storage, _, static = tiny_cache
    trace = power_law_trace(8, 40, 40)
    stats = []
    for policy in ("hybrid", "hybrid_pvp_room"):
        cache = SoftwareCache(storage, num_sets=4, ways=16, policy=policy, window=8, static_scores=static)
        for current, future in replay(trace, 8, num_nodes=N):
            cache.lookup(current, future)
        stats.append(cache.stats.as_dict())
    assert stats[0] == stats[1]


def test_bad_pvp_arguments(tiny_cache):
    storage = tiny_cache[0]
    with pytest.raises(ValueError, match="pvp_queue_capacity"):
        SoftwareCache(storage, num_sets=2, ways=4, pvp=True, pvp_queue_capacity=0)
    with pytest.raises(ValueError, match="needs pvp=True"):
        SoftwareCache(storage, num_sets=2, ways=4, pvp_reinstall=True)


@pytest.mark.parametrize("queue_bytes", ["64K", 200_000, "150%", "300%"])
def test_queue_bytes_bound_the_victim_buffer(tiny_cache, queue_bytes):
    storage = tiny_cache[0]
    cache = SoftwareCache(storage, num_sets=4, ways=8, window=6, pvp=True, pvp_queue_bytes=queue_bytes)
    budget = pvp_module.queue_budget(queue_bytes, cache.capacity_bytes)
    per_line = cache.pvp.num_queues * (storage.row_bytes + pvp_module.LINE_METADATA_BYTES)
    assert cache.pvp.memory_bytes <= budget < cache.pvp.memory_bytes + per_line  # as many lines as fit
    assert cache.pvp.capacity == budget // per_line


def test_default_queues_take_a_quarter_of_the_cache(tiny_cache):
    storage = tiny_cache[0]
    big = SoftwareCache(storage, num_sets=64, ways=8, window=6, pvp=True)
    assert big.pvp.memory_bytes <= big.capacity_bytes // 4 < big.pvp.memory_bytes + 7 * (storage.row_bytes + 16)
    tiny = SoftwareCache(storage, num_sets=1, ways=4, window=6, pvp=True)  # a quarter holds no line: one each
    assert tiny.pvp.capacity == 1


def test_queue_bytes_errors(tiny_cache):
    storage = tiny_cache[0]
    with pytest.raises(ValueError, match="not both"):
        SoftwareCache(storage, num_sets=2, ways=4, pvp=True, pvp_queue_capacity=8, pvp_queue_bytes="1M")
    with pytest.raises(ValueError, match=r"cannot hold one line in each of the 5 victim queues"):
        SoftwareCache(storage, num_sets=2, ways=4, window=4, pvp=True, pvp_queue_bytes=100)
    with pytest.raises(ValueError, match="share of the cache"):
        SoftwareCache(storage, num_sets=2, ways=4, pvp=True, pvp_queue_bytes="many%")


def test_a_failed_lookup_keeps_the_prefetched_lines(tiny_cache):
    storage, features, _ = tiny_cache
    cache = SoftwareCache(storage, num_sets=1, ways=4, policy="rr", window=4, period=1, pvp=True,
                          pvp_queue_capacity=16)
    trace = [[1, 2, 3, 4], [5, 6, 7, 8], [1, 2]]
    for k, (current, future) in enumerate(replay(trace, 4, num_nodes=N)):
        if k == 2:
            with pytest.raises(ValueError, match="distinct ids"):
                cache.lookup(list(range(10, 20)))  # too many ids: raises after taking the prefetched lines
        rows, hit = cache.lookup(current, future)
    assert torch.equal(rows, features[[1, 2]]) and hit.all() and cache.stats.pvp_hits == 2


# -- through the loader -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data(loader_graph):
    return loader_graph


def pvp_threads():
    return [t for t in threading.enumerate() if t.name in ("lsm-gnn-pvp", "lsm-gnn-loader")]


@pytest.mark.parametrize("policy", list(POLICIES))
def test_loader_features_equal_the_file_with_pvp(data, policy):
    dataset, features = data
    with open_storage(dataset, "io_uring") as storage:
        degree = np.diff(np.asarray(dataset.indptr)).astype(np.float64)
        cache = SoftwareCache(storage, num_sets=8, ways=32, policy=policy, window=16, period=2, static_scores=degree,
                              oversubscribe=True, pvp=True, pvp_queue_capacity=32)
        loader = NodeLoader(dataset, cache, [4, 2], batch_size=64, window=16)
        served = 0
        for epoch in range(2):
            for batch in loader:
                assert torch.equal(batch.x, features[batch.input_nodes])
                served += batch.io["pvp_hits"]
        assert served == cache.stats.pvp_hits > 0
        assert cache.pvp.stats.prefetched > 0  # the loader asked the cache to prefetch
        assert storage.stats().unique_rows == cache.stats.misses  # PVP hits never reached storage
        check_counts(cache)
    assert pvp_threads() == []


def test_no_prefetch_thread_left_after_an_exception_or_break(data):
    dataset, _ = data
    cache = SoftwareCache(open_storage(dataset, "memory"), num_sets=8, ways=32, policy="hybrid_pvp", window=8,
                          oversubscribe=True, pvp=True, pvp_queue_capacity=16)
    loader = NodeLoader(dataset, cache, [4, 2], batch_size=32, window=8, prefetch=1)
    with pytest.raises(RuntimeError, match="boom"):
        for k, batch in enumerate(loader):
            if k == 5:
                raise RuntimeError("boom")
    assert pvp_threads() == []
    for k, batch in enumerate(loader):
        if k == 3:
            break
    loader.close()
    assert pvp_threads() == []
    assert cache.pvp.stats.prefetched > 0


@pytest.mark.parametrize("prefetch_features", [True, False])
def test_the_loader_only_asks_the_features_to_prefetch(data, monkeypatch, prefetch_features):
    """The loader knows no victim buffer: it calls features.prefetch() after each gather, or never."""
    dataset, features = data
    calls = []
    cache = SoftwareCache(open_storage(dataset, "memory"), num_sets=8, ways=32, oversubscribe=True, pvp=True,
                          pvp_queue_capacity=16, window=8)
    monkeypatch.setattr(cache.pvp, "prefetch_async", lambda t, real=cache.pvp.prefetch_async: (calls.append(t),
                                                                                                 real(t)))
    loader = NodeLoader(dataset, cache, [2], 32, window=8, prefetch_features=prefetch_features)
    for batch in loader:
        assert torch.equal(batch.x, features[batch.input_nodes])
    assert (len(calls) == len(loader)) if prefetch_features else calls == []
    assert cache.stats.pvp_hits > 0  # without the loader's prefetch, the lookup moves the queue itself
    plain = NodeLoader(dataset, open_storage(dataset, "memory"), [2], 500)
    assert all("pvp_hits" not in b.io for b in plain)  # no victim buffer: no PVP counters


def test_errors_in_the_prefetch_thread_reach_the_caller():
    vb = VictimBuffer(window=2, queue_capacity=2, dim=1, dtype=torch.float32)
    vb._background, vb._in_place = True, False  # a GPU cache's threaded copy, on the CPU
    vb.prefetch_data = None  # breaks the move
    vb.count[1] = 1
    vb.prefetch_async(1)
    with pytest.raises(TypeError):
        vb.take(1)
    vb.close()
    assert pvp_threads() == []


@pytest.mark.slow
def test_two_ranks_with_victim_buffers_get_the_file_bytes(data, tmp_path):
    """Over a SharedCache (gloo, 2 processes), each owner's victim buffer serves the merged batch it
    owns: every batch of every policy still equals the file, and the buffers do serve."""
    dataset, _ = data
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    port = testing.free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        procs.append(subprocess.Popen([sys.executable, os.path.join(root, "tests", "pvp_worker.py"), dataset.path,
                                       str(tmp_path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    try:
        logs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(logs)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for policy in POLICIES:
        assert sum(r[policy]["pvp_hits"] for r in results) > 0, policy
        assert sum(r[policy]["unused"] for r in results) == 0, policy  # the owners' windows are exact


def test_a_cpu_victim_buffer_serves_in_place_without_threads(data, monkeypatch):
    """On a CPU cache the prefetch moves nothing: no thread, no copy, and batches whose queue is
    empty skip PVP's matching altogether; the rows still equal the file."""
    from lsm_gnn import _C

    dataset, features = data
    started, matched = [], []
    real_start, real_fill = threading.Thread.start, _C.pvp_fill
    monkeypatch.setattr(threading.Thread, "start",
                        lambda self: (started.append(self.name), real_start(self))[1])
    monkeypatch.setattr(_C, "pvp_fill", lambda *a: (matched.append(a[4].numel()), real_fill(*a))[1])
    cache = SoftwareCache(open_storage(dataset, "memory"), num_sets=8, ways=32, oversubscribe=True, pvp=True,
                          pvp_queue_capacity=16, window=8)
    loader = NodeLoader(dataset, cache, [2], 32, window=8)
    for batch in loader:
        assert torch.equal(batch.x, features[batch.input_nodes])
    assert "lsm-gnn-pvp" not in started
    assert cache.stats.pvp_hits > 0 and matched and all(n > 0 for n in matched)
    assert len(matched) < len(loader)  # the first batches have empty queues
    check_counts(cache)
