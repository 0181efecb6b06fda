"""Serving hits first (lsm_gnn.cache.hits_first): a device cache that serves each batch's hits in one kernel before
anything else returns the file's bytes and decides exactly as the CPU cache on the C++ core, batch by batch: the
same rows, hit masks, lines, state and counters, over traces whose batches hit in full, partly and not at all, with
repeated ids, scans due, next use at assign and Belady's bypass. The kernel runs under Triton's interpreter."""
import contextlib

import numpy as np
import pytest
import torch

import lsm_gnn  # noqa: F401  (turns on Triton's interpreter on a machine without a GPU, before triton's import)

pytest.importorskip("triton")

from host_budget import HostWork, device_cache, device_mode  # noqa: E402
from lsm_gnn import kernels, open_storage  # noqa: E402
from lsm_gnn.cache import SoftwareCache, WindowBuffer  # noqa: E402
from lsm_gnn.cache import hits_first  # noqa: E402
from lsm_gnn.testing import RecordedGraph, write_tiny_dataset  # noqa: E402

# The kernel under Triton's interpreter (on a GPU machine triton compiles instead: the cuda cases run there).
interpreted = pytest.mark.skipif(torch.cuda.is_available(), reason="runs the kernel under Triton's interpreter")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_tiny_dataset(tmp_path_factory.mktemp("hits_first") / "ds", num_nodes=300, dim=6)


def trace(seed: int, num_batches: int = 10, size: int = 40, num_nodes: int = 300):
    """Batches of hot ids repeated within and across batches (hits in full, once installed: the first of a run
    found so by the assign, the next ones by the probe) between batches that add a few cold ids (misses, the
    first after a run found so by the probe), and an empty batch."""
    rng = np.random.default_rng(seed)
    hot = rng.choice(num_nodes, 16, replace=False)
    cold = [rng.integers(0, num_nodes, 6) if k % 4 == 0 else np.empty(0, np.int64) for k in range(num_batches)]
    batches = [torch.from_numpy(np.concatenate([rng.choice(hot, size - len(c)), c])) for c in cold]
    batches.insert(5, torch.empty(0, dtype=torch.int64))
    return batches


def warm_cache(path, num_sets: int, ids: torch.Tensor, kind: str = "pread"):
    """A device-mode cache (under device_mode) of ``num_sets`` x 8 lines that has looked ``ids`` up twice: the
    second hit in full, so the next batch is probed."""
    cache = device_cache(open_storage(path, kind), num_sets=num_sets, ways=8, read_ahead=0)
    cache.lookup(ids)
    cache.lookup(ids)
    assert cache._hits_first.probing
    return cache


def serve(cache, batches, window: int = 3):
    out = []
    for k, batch in enumerate(batches):
        future = WindowBuffer(window + 1, cache.storage.num_rows)
        for ahead in batches[k + 1:k + 1 + window]:
            future.push(ahead)
        rows, hit = cache.lookup(batch, future=future)
        state = [t.cpu().clone() for t in cache.state.tensors()]  # every field, last use included
        lines = cache.lines_of(torch.arange(cache.storage.num_rows)).cpu()
        out.append((rows.cpu().clone(), hit.cpu().clone(), lines, state))
    return out


@contextlib.contextmanager
def serving_first(storage, device: str, **kwargs):
    """A cache serving hits first on ``device`` (``cpu``: CPU tensors in device mode, the kernels under the
    interpreter; ``cuda``: as a GPU cache makes it by default), and the list of each lookup's ``served`` (the
    batch hit in full and ended at the probe)."""
    with pytest.MonkeyPatch.context() as monkeypatch, \
            device_mode(monkeypatch) if device == "cpu" else contextlib.nullcontext():
        cache = device_cache(storage, **kwargs) if device == "cpu" else SoftwareCache(storage, device="cuda", **kwargs)
        assert cache._hits_first is not None
        served = []
        original = cache._account
        cache._account = lambda plan, caller=None: (served.append(plan.served), original(plan, caller))[1]
        yield cache, served


CASES = [(device, policy, seed) for device in ("cpu", "cuda") for seed, policy in enumerate(("farthest", "hybrid", "lru"))]


@pytest.mark.parametrize("device,policy,seed", [
    pytest.param(d, p, s, marks=interpreted if d == "cpu" else needs_cuda) for d, p, s in CASES])
def test_serving_hits_first_returns_the_file_and_decides_as_the_cpu_cache(dataset, device, policy, seed):
    """On CPU tensors in device mode (the interpreter), and on a GPU as a CUDA cache makes it by default."""
    ds, features = dataset
    storage = open_storage(ds.path, "pread")
    batches = trace(seed)
    kwargs = dict(num_sets=8, ways=8, policy=policy, window=3, period=2, read_ahead=0)
    reference = SoftwareCache(storage, **kwargs)
    want = serve(reference, batches)
    with serving_first(storage, device, **kwargs) as (cache, served):
        got = serve(cache, batches)
    assert served.count(True) >= 3 and served.count(False) >= 3, served  # both paths ran
    for k, ((want_rows, want_hit, want_lines, want_state), (rows, hit, lines, state)) in enumerate(zip(want, got)):
        assert torch.equal(rows, torch.from_numpy(features[batches[k].numpy()])), f"batch {k}: rows differ"
        assert torch.equal(hit, want_hit), f"batch {k}: hits differ"
        assert torch.equal(lines, want_lines), f"batch {k}: lines differ"
        for name, a, b in zip(("tags", "records", "flags", "static", "last use", "rr pointer"), want_state, state):
            assert torch.equal(a, b), f"batch {k}: {name} differs from the CPU cache's"
    assert vars(cache.stats) == vars(reference.stats)


@interpreted
@pytest.mark.parametrize("probing,pvp", [(False, False), (True, False), (False, True)])
def test_an_id_out_of_range_is_refused_as_the_cpu_cache_refuses_it_and_rows_stay_exact(dataset, probing, pvp):
    """Refused with the CPU cache's message; where the batch was not probed (the one before missed) nothing in
    the cache changed, where it was its hits may be marked used (never a byte). With PVP nothing is parked."""
    ds, features = dataset
    storage = open_storage(ds.path, "pread")
    with pytest.MonkeyPatch.context() as monkeypatch, device_mode(monkeypatch):
        cache = device_cache(storage, num_sets=4, ways=8, read_ahead=0, pvp=pvp)
        for _ in range(1 + probing):  # (the second hits in full: the next batch is probed)
            cache.lookup(torch.arange(10))
        before = [t.clone() for t in cache.state.tensors()]
        for bad, named in (([3, -2, 5], -2), ([1, 300, 2], 300), ([-1, 301], -1)):
            with pytest.raises(IndexError, match=rf"node id {named} is out of range \[0, 300\)"):
                cache.lookup(torch.tensor(bad))
            assert cache._hits_first.probing == probing
        if not probing:
            assert all(torch.equal(a, b) for a, b in zip(before, cache.state.tensors()))
        if pvp:
            assert cache.pvp.stats.offered == 0
        rows, hit = cache.lookup(torch.tensor([2, 9, 2, 11]))
    assert torch.equal(rows, torch.from_numpy(features[[2, 9, 2, 11]]))
    assert hit.tolist() == [True, True, True, False] and cache.stats.iterations == 2 + probing


@interpreted
@pytest.mark.parametrize("dtype,dim", [("float32", 300), ("float16", 3), ("uint8", 5), ("int8", 8), ("float32", 2)])
def test_every_row_width_is_copied_whole(tmp_path, dtype, dim):
    """Rows of 1,200 bytes (more words than one tile holds), 6 (int16 words), 5 (bytes) and 8: the file's bytes,
    into a caller's ``out`` too, one at an address only 4-aligned (lines and out then move as 4-byte words)."""
    ds, features = write_tiny_dataset(tmp_path / "ds", num_nodes=64, dim=dim, dtype=dtype)
    storage = open_storage(ds.path, "pread")
    ids = torch.tensor([5, 63, 0, 5, 17])
    with pytest.MonkeyPatch.context() as monkeypatch, device_mode(monkeypatch):
        cache = device_cache(storage, num_sets=2, ways=8, read_ahead=0)
        cache.lookup(ids)
        out = torch.full((5 * dim + 1,), 7, dtype=cache.data.dtype)[1:].view(5, dim)  # one element in
        rows, hit = cache.lookup(ids, out=out)
    assert rows is out and bool(hit.all())
    assert np.array_equal(out.numpy().view(np.uint8), features[ids.numpy()].view(np.uint8))


@interpreted
def test_repeated_ids_count_once_across_the_stamps_wrap(dataset, monkeypatch):
    """Distinct hits are counted by stamping lines; the stamps start again after 2**31 lookups."""
    with device_mode(monkeypatch):
        cache = warm_cache(dataset[0].path, 4, torch.arange(12))
        cache._hits_first._stamp = hits_first._LAST_STAMP - 1
        for _ in range(3):  # the last stamp, then the wrap
            before = cache.stats.unique
            cache.lookup(torch.tensor([4, 4, 7, 4, 11, 7]))
            assert cache.stats.unique - before == 3
    assert cache._hits_first._stamp == 2 and cache.stats.hits == 12 + 9


@interpreted
def test_an_all_hit_batch_over_a_table_takes_updates_after_it(tmp_path, monkeypatch):
    """A writable storage (an embedding table in memory): rows updated after a served batch are read back."""
    ds, features = write_tiny_dataset(tmp_path / "ds", num_nodes=50, dim=4)
    ids = torch.tensor([3, 8, 3])
    with device_mode(monkeypatch):
        cache = warm_cache(ds.path, 2, ids, kind="memory")
        cache.update(torch.tensor([3]), torch.full((1, 4), 2.5), lambda rows, new: new)
        rows, hit = cache.lookup(ids)
    assert bool(hit.all()) and torch.equal(rows[[0, 2]], torch.full((2, 4), 2.5))
    assert torch.equal(rows[1], torch.from_numpy(features[8]))


@interpreted
def test_an_all_hit_lookup_after_one_is_one_kernel_and_one_read_back_whatever_its_size(dataset, monkeypatch):
    with device_mode(monkeypatch):
        cache = warm_cache(dataset[0].path, 32, torch.arange(60))
        for n in (1, 60, 200):
            ids = torch.arange(60).repeat(4)[:n]
            work = HostWork()
            work.device(cache.state, cache.data, cache._hits_first)
            work.call(lambda i: cache.lookup(i), ids)
            assert work.launched == ["zero_", "_serve_hits"] and work.counts.reads_back == 1, work.what


def pvp_trace(seed: int, num_batches: int = 13, size: int = 36, num_nodes: int = 300):
    """Two pools of ids taking turns in a cache too small for both, so each batch evicts lines the one after
    next uses (parked in the victim buffer and served back), a few new ids in each (read from storage), runs of
    three equal batches (the second hits in full, found so by the assign; the third by the probe), and an empty
    batch."""
    rng = np.random.default_rng(seed)
    pools = np.split(rng.permutation(num_nodes)[:2 * size], 2)
    batches = []
    for k in range(num_batches):
        if k % 5 in (3, 4):
            batches.append(batches[-1].clone())
            continue
        pool = pools[k % 2]
        batches.append(torch.from_numpy(np.concatenate([rng.choice(pool, size - 4), rng.integers(0, num_nodes, 4)])))
    batches.insert(6, torch.empty(0, dtype=torch.int64))
    return batches


@pytest.mark.parametrize("device,policy,seed", [  # (farthest parks little: its victims are the lines not reused)
    pytest.param(d, p, s, marks=interpreted if d == "cpu" else needs_cuda)
    for d in ("cpu", "cuda") for p, s in (("lru", 0), ("hybrid", 2), ("rr", 1))])
def test_serving_hits_first_with_pvp_returns_the_file_and_counts_as_the_cpu_cache(dataset, device, policy, seed):
    """A device cache with PVP (reinstalling) serves hits first too: victims parked and lines matched on the
    device before the one read back, whose misses leave out what the victim buffer serves. Rows, hit masks, lines,
    state, the cache's and the victim buffer's counters: the CPU cache's, batch by batch, with and without the
    queue moved ahead (the loader's prefetch). On CPU tensors in device mode, and on a GPU by default."""
    ds, features = dataset
    storage = open_storage(ds.path, "pread")
    batches = pvp_trace(seed)
    kwargs = dict(num_sets=8, ways=8, policy=policy, window=3, period=1, read_ahead=0, pvp=True,
                  pvp_queue_capacity=16)
    reference = SoftwareCache(storage, **kwargs)
    with serving_first(storage, device, **kwargs) as (cache, served):
        for k, batch in enumerate(batches):
            future = WindowBuffer(4, storage.num_rows)
            for ahead in batches[k + 1:k + 4]:
                future.push(ahead)
            want_rows, want_hit = reference.lookup(batch, future=future)
            rows, hit = cache.lookup(batch, future=future)
            assert torch.equal(rows.cpu(), torch.from_numpy(features[batch.numpy()])), f"batch {k}: rows differ"
            assert torch.equal(hit.cpu(), want_hit), f"batch {k}: hits differ"
            for name, a, b in zip(("tags", "records", "flags", "static", "last use", "rr pointer"),
                                  reference.state.tensors(), cache.state.tensors()):
                assert torch.equal(a, b.cpu()), f"batch {k}: {name} differs from the CPU cache's"
            assert vars(cache.stats) == vars(reference.stats), f"batch {k}"
            assert cache.pvp.stats == reference.pvp.stats, f"batch {k}"
            if k % 3:  # the loader's move ahead; else the lookup moves its queue itself
                cache.prefetch()
                reference.prefetch()
        cache.settle()
    assert served.count(True) >= 2 and served.count(False) >= 6, served  # both paths ran
    assert reference.pvp.stats.hits > 0 and reference.stats.pvp_hits == reference.pvp.stats.hits


@interpreted
def test_hits_first_is_refused_where_it_cannot_run(dataset, tmp_path):
    ds, _ = dataset
    storage = open_storage(ds.path, "pread")
    with pytest.raises(ValueError, match="needs pvp_reinstall=True over a read-only storage"), \
            kernels.using("triton"):
        SoftwareCache(storage, num_sets=4, ways=8, pvp=True, pvp_reinstall=False, hits_first=True)
    table = open_storage(write_tiny_dataset(tmp_path / "table", num_nodes=50, dim=6)[0].path, "memory")
    assert table.writable
    with pytest.raises(ValueError, match="needs pvp_reinstall=True over a read-only storage"), \
            kernels.using("triton"):
        SoftwareCache(table, num_sets=4, ways=8, pvp=True, hits_first=True)
    with kernels.using("triton"):  # (default: off on a CPU cache; on for a GPU one where it can run)
        assert SoftwareCache(storage, num_sets=4, ways=8, pvp=True, hits_first=True)._hits_first is not None
    with pytest.raises(ValueError, match="under Triton's interpreter"), kernels.using("native"):
        SoftwareCache(storage, num_sets=4, ways=8, hits_first=True)
    assert SoftwareCache(storage, num_sets=4, ways=8)._hits_first is None  # a CPU cache assigns whole batches


def serve_into(cache, batches, window: int = 3, num_outs: int = 2):
    """As the loader serves: one window kept across batches (pushed ahead, popped), and the rows into a few
    ``out`` buffers taken in turn."""
    future = WindowBuffer(window, cache.storage.num_rows)
    outs = {}
    got = []
    for k, batch in enumerate(batches):
        while len(future) < min(window, len(batches) - k - 1):
            future.push(batches[k + 1 + len(future)])
        out = outs.setdefault((batch.numel(), k % num_outs), torch.empty(
            (batch.numel(), cache.storage.dim), dtype=cache.data.dtype, device=cache.device))
        rows, hit = cache.lookup(batch, future=future, out=out)
        assert rows is out
        got.append((rows.cpu().clone(), hit.cpu().clone(), [t.cpu().clone() for t in cache.state.tensors()]))
        if len(future):
            future.pop()
    return got


def graphed_cache(storage, device: str, **kwargs):
    """A cache whose hits are served by graphs: CUDA graphs on a GPU, the recorded stand-in on CPU tensors."""
    if device == "cuda":
        return SoftwareCache(storage, device="cuda", graphs=True, **kwargs)
    cache = device_cache(storage, **kwargs)
    cache._hits_first.graphs = hits_first.ServeGraphs(cache.device, new_graph=RecordedGraph.new)
    return cache


@pytest.mark.parametrize("device,policy,seed", [
    pytest.param(d, p, s, marks=interpreted if d == "cpu" else needs_cuda)
    for d, p, s in [("cpu", "farthest", 0), ("cpu", "lru", 1), ("cuda", "farthest", 0), ("cuda", "lru", 1)]])
def test_hits_served_by_replayed_graphs_equal_the_cpu_cache(dataset, device, policy, seed):
    """Replays take each call's stamp, iteration, scan base and window front from memory (a graph's arguments
    are fixed at capture): rows, hits and every state field as the CPU cache's, batch by batch."""
    ds, features = dataset
    storage = open_storage(ds.path, "pread")
    batches = [b for b in trace(seed, num_batches=14) if b.numel()]
    kwargs = dict(num_sets=8, ways=8, policy=policy, window=3, period=2, read_ahead=0)
    want = serve_into(SoftwareCache(storage, **kwargs), batches)
    with pytest.MonkeyPatch.context() as monkeypatch, \
            device_mode(monkeypatch) if device == "cpu" else contextlib.nullcontext():
        cache = graphed_cache(storage, device, **kwargs)
        got = serve_into(cache, batches)
    graphs = cache._hits_first.graphs
    assert graphs.captures == 2 and len(graphs) == 2  # one per out buffer, batches all of one size
    if device == "cpu":
        assert sum(entry.graph.replays for entry in graphs._graphs.values()) >= 4
    for k, ((want_rows, want_hit, want_state), (rows, hit, state)) in enumerate(zip(want, got)):
        assert torch.equal(rows, torch.from_numpy(features[batches[k].numpy()])), f"batch {k}: rows differ"
        assert torch.equal(hit, want_hit), f"batch {k}: hits differ"
        for name, a, b in zip(("tags", "records", "flags", "static", "last use", "rr pointer"), want_state, state):
            assert torch.equal(a, b), f"batch {k}: {name} differs from the CPU cache's"


@interpreted
def test_graphs_are_kept_per_size_and_buffer_up_to_their_bound(dataset, monkeypatch):
    with device_mode(monkeypatch):
        cache = warm_cache(dataset[0].path, 8, torch.arange(40))
        cache._hits_first.graphs = graphs = hits_first.ServeGraphs(cache.device, max_graphs=3,
                                                                   new_graph=RecordedGraph.new)
        outs = [torch.empty((n, 6)) for n in (5, 7, 9, 11)]
        for out in outs + outs[-1:] + outs[:1]:  # four keys through three places, then the last, then the first
            ids = torch.arange(out.shape[0]) * 3
            rows, hit = cache.lookup(ids, out=out)
            assert bool(hit.all()) and torch.equal(rows, torch.from_numpy(dataset[1][ids.numpy()]))
        cache.lookup(torch.arange(5))  # no out: launched as it is, nothing captured
    assert graphs.captures == 5 and len(graphs) == 3
    assert [key[0] for key in graphs._graphs] == [9, 11, 5]


def test_graphs_are_refused_where_they_cannot_run(dataset):
    storage = open_storage(dataset[0].path, "pread")
    with pytest.raises(ValueError, match="graphs=True captures the serving of hits first"):
        SoftwareCache(storage, num_sets=4, ways=8, graphs=True)
    with pytest.raises(ValueError, match="CUDA graphs need a cache on a CUDA device, not cpu"):
        hits_first.ServeGraphs(torch.device("cpu"))
