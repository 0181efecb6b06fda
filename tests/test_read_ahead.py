"""Read-ahead (lsm_gnn.cache.read_ahead): rows a cache's next batches will miss, read early on a thread of
their own. It may change where a miss's bytes come from, never a row, a hit or a decision."""
import inspect
import threading
import time
import zlib

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lsm_gnn import open_storage
from lsm_gnn.cache import SoftwareCache, VictimBuffer
from lsm_gnn.cache.read_ahead import ReadAhead
from lsm_gnn.cache.window import replay
from lsm_gnn.config import ConfigError, load_config
from lsm_gnn.testing import write_tiny_dataset


@pytest.fixture(scope="module")
def disk(tmp_path_factory):
    dataset, features = write_tiny_dataset(tmp_path_factory.mktemp("ra") / "ds", num_nodes=600, dim=20)
    return dataset, features


def trace_of(seed, iterations, batch, n=600, skew=1.1):
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, n + 1) ** skew
    weights /= weights.sum()
    return [np.unique(rng.choice(n, size=batch, p=weights)) for _ in range(iterations)]


def test_take_gives_exactly_the_rows_read_and_forgets_older_chunks(disk):
    dataset, features = disk
    with open_storage(dataset, "io_uring") as storage:
        ahead = ReadAhead(storage, depth=2)
        ahead.request(5, torch.tensor([3, 9, 40, 41]))
        ahead.request(5, torch.tensor([100]))   # a top-up: a second chunk for the same lookup
        ahead.request(4, torch.tensor([7, 8]))  # an older lookup's chunk: dropped when lookup 5 takes
        ahead.request(6, torch.tensor([50]))    # a later lookup's: kept
        read_all(ahead, 8)  # (a chunk still queued when its lookup comes is left to the lookup to read)
        where, rows = ahead.take(5, torch.tensor([1, 9, 100, 3, 2]))
        order = torch.argsort(where)
        assert where[order].tolist() == [1, 2, 3]
        assert np.array_equal(rows[order].numpy(), features[[9, 100, 3]])
        assert ahead.take(5, torch.tensor([40])) is None  # taken once only
        assert ahead.requested(6).tolist() == [50] and ahead.requested(5) is None
        ahead.close()
        s = ahead.stats
        assert (s.requested, s.used) == (8, 3) and s.dropped == 5  # 40, 41, 7, 8 and the closed 50
        assert ahead.take(6, torch.tensor([50])) is None  # close forgot it


def read_all(ahead, rows):
    wait_for(lambda: ahead.stats.read >= rows)


def wait_for(done, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "the read-ahead's worker did not do its work"
        time.sleep(0.001)


def gate_reads(storage) -> tuple[threading.Event, threading.Event]:
    """(gate, entered): every read of ``storage`` sets ``entered``, then waits for ``gate``."""
    gate, entered = threading.Event(), threading.Event()
    real_read = storage.read

    def slow_read(ids, out=None):
        entered.set()
        gate.wait()
        return real_read(ids, out)

    storage.read = slow_read
    return gate, entered


def test_a_chunk_still_queued_is_left_to_its_lookup(disk):
    dataset, _ = disk
    with open_storage(dataset, "pread") as storage:
        ahead = ReadAhead(storage, depth=1)
        gate, entered = gate_reads(storage)
        ahead.request(1, torch.tensor([1, 2]))  # the worker waits in this read
        assert entered.wait(10.0)               # (else both chunks could still be queued at the take)
        ahead.request(1, torch.tensor([3]))     # a top-up queued behind it
        threading.Timer(0.2, gate.set).start()
        where, rows = ahead.take(1, torch.tensor([2, 3]))  # waits for the read in flight, not the queued one
        assert where.tolist() == [0] and ahead.stats.read == 2 and ahead.stats.dropped == 2
        ahead.close()


def test_the_budget_cuts_requests_short(disk):
    dataset, _ = disk
    with open_storage(dataset, "pread") as storage:
        ahead = ReadAhead(storage, depth=1, max_bytes=3 * storage.row_bytes)
        ahead.request(1, torch.tensor([1, 2]))
        ahead.request(2, torch.tensor([3, 4, 5]))
        assert ahead.stats.requested == 3 and ahead.stats.cut == 2
        assert ahead.requested(2).tolist() == [3]
        ahead.close()


def test_bad_arguments_are_refused(disk, tmp_path):
    dataset, _ = disk
    with open_storage(dataset, "pread") as storage:
        with pytest.raises(ValueError, match="depth"):
            ReadAhead(storage, depth=0)
        with pytest.raises(TypeError, match="state="):  # following a cache needs that cache's state
            ReadAhead(storage, depth=1).follow(0, [torch.tensor([1])])
        with pytest.raises(ValueError, match="read_ahead"):
            SoftwareCache(storage, num_sets=2, read_ahead=-1)

        class Writable:
            writable, row_bytes = True, 8

        with pytest.raises(ValueError, match="nobody writes"):
            ReadAhead(Writable())
    for value, match in (("soon", "cache.read_ahead"), ("-1", "cache.read_ahead")):
        with pytest.raises(ConfigError, match=match):
            load_config(None, [f"cache.read_ahead={value}"])
    with pytest.raises(ConfigError, match="read_ahead_bytes"):
        load_config(None, ["cache.read_ahead_bytes=lots"])


def test_on_by_default_only_from_a_disk_on_the_cpu(disk):
    dataset, _ = disk
    with open_storage(dataset, "io_uring") as storage:
        assert SoftwareCache(storage, num_sets=2).read_ahead.depth == 2
        assert SoftwareCache(storage, num_sets=2, read_ahead=0).read_ahead is None
    with open_storage(dataset, "memory") as storage:
        assert SoftwareCache(storage, num_sets=2).read_ahead is None


class FailingAhead:
    """A storage whose reads fail on the read-ahead's thread only: the lookup must read the rows itself."""

    def __init__(self, inner):
        self._inner = inner
        self.writable, self.from_disk = False, True
        self.num_rows, self.dim, self.dtype = inner.num_rows, inner.dim, inner.dtype
        self.row_bytes, self.backend = inner.row_bytes, inner.backend
        self.read_into = inner.read_into

    def read(self, ids, out=None):
        if threading.current_thread().name == "lsm-gnn-read-ahead":
            raise OSError("injected read error")
        return self._inner.read(ids, out)


def test_a_failed_read_ahead_leaves_the_lookup_to_read(disk):
    dataset, features = disk
    trace = trace_of(3, 20, 60)
    with open_storage(dataset, "pread") as inner:
        cache = SoftwareCache(FailingAhead(inner), num_sets=4, ways=16, window=4, read_ahead=2)
        for ids, future in replay(trace, 4, num_nodes=600):
            rows, _ = cache.lookup(ids, future=future)
            assert np.array_equal(rows.numpy(), features[np.asarray(ids)])
        cache.settle()
        assert cache.read_ahead.stats.failed > 0 and cache.read_ahead.stats.used == 0


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), depth=st.integers(1, 4), budget_rows=st.sampled_from([1, 7, 64, 10_000]),
       policy=st.sampled_from(["farthest", "hybrid", "lru"]), pvp=st.booleans(),
       num_sets=st.sampled_from([1, 2, 5]), batch=st.integers(1, 90))
def test_property_read_ahead_changes_no_row_hit_or_decision(disk, seed, depth, budget_rows, policy, pvp,
                                                            num_sets, batch):
    """Against the same cache without read-ahead, batch after batch: the same rows (the file's), the same
    hit masks and the same lines, whatever the depth, budget and policy; every miss is read once."""
    dataset, features = disk
    trace = trace_of(seed, 30, batch)
    with open_storage(dataset, "io_uring") as storage, open_storage(dataset, "pread") as plain_storage:
        kwargs = dict(num_sets=num_sets, ways=16, policy=policy, window=5, period=2, pvp=pvp, pvp_queue_capacity=4,
                      oversubscribe=True)
        early = SoftwareCache(storage, read_ahead=depth, read_ahead_bytes=budget_rows * storage.row_bytes, **kwargs)
        plain = SoftwareCache(plain_storage, read_ahead=0, **kwargs)
        for k, (ids, future) in enumerate(replay(trace, 5, num_nodes=600)):
            rows, hit = early.lookup(ids, future=future)
            want_rows, want_hit = plain.lookup(ids, future=list(future))
            assert np.array_equal(rows.numpy(), features[np.asarray(ids)]), f"batch {k}"
            assert torch.equal(hit, want_hit) and torch.equal(early.state.tags, plain.state.tags), f"batch {k}"
        early.settle()
        ahead = early.read_ahead.stats
        assert storage.stats().unique_rows == early.stats.misses - ahead.used + ahead.read
        assert early.stats.misses == plain.stats.misses
        # Every batch asked for is looked up, and what is asked for is exactly what will miss (the ids not held
        # nor installed by a nearer batch nor parked for the batch): no row is read in vain.
        assert ahead.read == ahead.used


def test_the_ring_takes_spans_first_fit_and_the_longest_gap_when_none_fits():
    from lsm_gnn.cache.read_ahead import _RowRing

    ring = _RowRing(10, 2, torch.float32)
    assert [ring.take(3), ring.take(3), ring.take(3)] == [(0, 3), (3, 3), (6, 3)]
    ring.free(3)
    assert ring.take(2) == (3, 2)  # the first gap that fits (9..10 is too short)
    ring.free(0)
    assert ring.take(1) == (0, 1)  # first fit: the lowest rows again, so few pages are ever touched
    assert ring.take(5) == (1, 2)  # none fits 5: the longest gap (1..3, not 5..6 or 9..10), cut
    assert [ring.take(1), ring.take(1), ring.take(1)] == [(5, 1), (9, 1), (0, 0)]  # then full
    ring.clear()
    assert ring.take(10) == (0, 10)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), budget_rows=st.sampled_from([1, 5, 40, 1_000]))
def test_property_chunks_read_into_one_ring_never_overlap_and_give_the_files_rows(disk, seed, budget_rows):
    """Requests for lookups in any order, takes of some of them, reads in flight or done: every chunk's rows
    are read into the ring (no buffer of its own), live chunks never share a row of it, the rows held stay
    within the budget and every row taken is the file's."""
    dataset, features = disk
    rng = np.random.default_rng(seed)
    with open_storage(dataset, "pread") as storage:
        ahead = ReadAhead(storage, depth=3, max_bytes=budget_rows * storage.row_bytes)
        iteration = 0
        for _ in range(40):
            if rng.random() < 0.6:
                ids = np.unique(rng.integers(0, 600, size=int(rng.integers(1, 30))))
                ahead.request(iteration + int(rng.integers(0, 4)), torch.from_numpy(ids))
            else:
                if rng.random() < 0.5:  # else the take may find reads in flight or queued
                    with ahead._cond:
                        live = list(ahead._chunks)
                    assert all(chunk.done.wait(10.0) for chunk in live)
                ask = torch.from_numpy(np.unique(rng.integers(0, 600, size=40)))
                got = ahead.take(iteration, ask)
                if got is not None:
                    where, rows = got
                    assert np.array_equal(rows.numpy(), features[ask[where].numpy()])
                iteration += 1
            with ahead._cond:
                spans = sorted((c.start, c.start + c.ids.numel()) for c in ahead._chunks)
                assert spans == ahead._ring._spans and sum(e - s for s, e in spans) == ahead._held
                assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
                assert not spans or spans[-1][1] <= budget_rows
                for chunk in ahead._chunks:
                    if chunk.rows is not None:
                        assert chunk.rows.data_ptr() == ahead._ring.view(chunk.start, 1).data_ptr()
        ahead.close()
        assert ahead._ring._spans == []


def test_busy_time_counts_overlapping_reads_once(disk):
    dataset, _ = disk
    with open_storage(dataset, "pread") as storage:
        ids = torch.arange(600)

        def reads():
            for _ in range(30):
                storage.read(ids)

        threads = [threading.Thread(target=reads) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        s = storage.stats()
        assert 0 < s.busy_seconds <= s.total_seconds
        assert storage.counters()["read_seconds"] == s.busy_seconds


def test_auto_reads_ahead_only_with_room_and_bounds_its_budget_by_the_memory_left(monkeypatch):
    import lsm_gnn.utils.memcap as memcap
    from lsm_gnn.cache.read_ahead import default_depth, read_ahead_budget
    from lsm_gnn.defaults import READ_AHEAD_DEPTH, READ_AHEAD_MAX_BYTES, AUTO_MIN_ROOM

    monkeypatch.setattr(memcap, "available_memory", lambda: 16 << 30)
    assert default_depth(True) == READ_AHEAD_DEPTH and read_ahead_budget("auto") == READ_AHEAD_MAX_BYTES
    assert default_depth(False) == 0  # misses from memory
    monkeypatch.setattr(memcap, "available_memory", lambda: AUTO_MIN_ROOM - 1)  # a tight memory cap
    assert default_depth(True) == 0
    monkeypatch.setattr(memcap, "available_memory", lambda: 300 << 20)
    assert default_depth(True) == READ_AHEAD_DEPTH and read_ahead_budget("auto") == (300 << 20) // 8
    assert read_ahead_budget("8M") == 8 << 20
    with pytest.raises(ValueError, match="at least one byte"):
        read_ahead_budget("0")


# -- the miss probe of a cache on a device (its tags never come to the host) ---------------------------------------

HAVE_CUDA = torch.cuda.is_available()
PROBE_DEVICES = [pytest.param("cpu", marks=pytest.mark.skipif(HAVE_CUDA, reason="triton compiles for the GPU here: "
                                                             "no interpreter for CPU tensors")),
                 pytest.param("cuda", marks=pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA GPU"))]


def tags_holding(rng, num_sets, ways, fill, n=600):
    """A cache's tags: each set's ways hold distinct ids of that set (by the cache's hash), a ``fill`` share of
    the ways valid (1.0: every set full), the rest invalid (-1)."""
    from lsm_gnn.cache.geometry import set_of

    tags = np.full((num_sets, ways), -1, dtype=np.int64)
    nodes = np.concatenate([rng.permutation(n), n + rng.permutation(19 * n)])  # full sets need ids beyond n
    sets, kept = set_of(nodes, num_sets), rng.random(nodes.size) < fill
    for s in range(num_sets):
        mine = nodes[(sets == s) & kept][:ways]
        tags[s, :mine.size] = mine
        rng.shuffle(tags[s])
    return torch.from_numpy(tags.reshape(-1))


def probe_case(rng, kind):
    """(tags, ways, batches, known) of a random case, or an adversarial one named by ``kind``."""
    num_sets, ways = {"one set": (1, 32), "odd ways": (5, 3), "full": (7, 8)}.get(kind, (int(rng.integers(1, 9)),
                                                                                     int(rng.choice([1, 4, 16]))))
    tags = tags_holding(rng, num_sets, ways, 1.0 if kind == "full" else float(rng.random()))
    held = tags[tags >= 0]
    depth = int(rng.integers(1, 5))
    batches, known = [], []
    for j in range(depth):
        size = 0 if kind == "empty" and j % 2 == 0 else int(rng.integers(0, 80))
        ids = rng.integers(0, 600, size)
        if kind == "duplicates" and size:  # ids repeated in the batch and taken from the nearer batches and the tags
            pool = np.concatenate([ids, *(b.numpy() for b in batches), held.numpy()])
            ids = rng.choice(pool, 2 * size)
        batches.append(torch.from_numpy(ids.astype(np.int64)))
        asked = rng.choice(np.concatenate([ids, rng.integers(0, 600, 10)]), int(rng.integers(0, 30)))
        if kind == "parked":  # a victim queue's ids: discarded ones are -1
            asked = np.where(rng.random(asked.size) < 0.3, -1, asked)
        known.append(torch.from_numpy(asked.astype(np.int64)))
    return tags, ways, batches, known


@pytest.mark.parametrize("device", PROBE_DEVICES)
@pytest.mark.parametrize("kind", ["random", "duplicates", "parked", "empty", "full", "one set", "odd ways"])
def test_the_device_probe_wants_exactly_what_the_native_pass_wants(device, kind):
    """misses_on_device (the tags looked up where they are, the Triton kernel) against _C.ahead_misses over a
    host copy of the same tags, batch by batch: random cases, and adversarial ones (ids repeated within and across
    batches and held, ids already asked for or parked, -1 among them, empty batches, every set full, one set,
    ways that are not a power of two)."""
    from lsm_gnn import _C
    from lsm_gnn.cache.read_ahead import misses_on_device

    rng = np.random.default_rng(zlib.crc32(kind.encode()))
    held = wanted = 0
    for _ in range(6):
        tags, ways, batches, known = probe_case(rng, kind)
        want = _C.ahead_misses(tags, ways, batches, known)
        got = misses_on_device(tags.to(device), ways, batches, known)
        assert [w.tolist() for w in got] == [w.tolist() for w in want]
        held += int(torch.isin(torch.cat(batches), tags).sum())
        wanted += sum(w.numel() for w in want)
    assert held and wanted, "cases where the probe decides"
    assert misses_on_device(tags.to(device), ways, [], []) == []


@pytest.mark.parametrize("device", PROBE_DEVICES)
def test_a_lookup_finishes_a_probe_the_busy_worker_has_not(disk, device):
    """With the worker inside a read, a device probe waits in its queue; the next take finishes it on its own
    thread, in order after the one before, and asks for what the native pass wants."""
    from lsm_gnn import _C

    dataset, _ = disk
    rng = np.random.default_rng(7)
    tags = tags_holding(rng, 4, 8, 0.7)
    batches = [torch.from_numpy(rng.integers(0, 600, 40)) for _ in range(2)]
    with open_storage(dataset, "pread") as storage:
        ahead = ReadAhead(storage, depth=2, device=device)
        ahead.on_device = True  # (on CPU tensors too: the device path under the interpreter)
        gate, entered = gate_reads(storage)
        ahead.request(9, torch.tensor([0]))  # a later lookup's chunk: the take below does not wait for it
        assert entered.wait(10.0)  # the worker is in that read
        ahead.request_misses(2, batches[:1], tags.to(device), 8)
        ahead.request_misses(2, batches, tags.to(device), 8)  # reads what the first asked for
        assert ahead.requested(3) is None, "still queued behind the read"
        ahead.take(2, torch.empty(0, dtype=torch.int64))  # finishes both here (the worker still reads)
        first = _C.ahead_misses(tags, 8, batches[:1], [torch.empty(0, dtype=torch.int64)])[0]
        want = _C.ahead_misses(tags, 8, batches, [first, torch.empty(0, dtype=torch.int64)])
        assert ahead.requested(3).tolist() == want[1].tolist()
        assert ahead.stats.requested == 1 + first.numel() + sum(w.numel() for w in want)
        gate.set()
        ahead.close()


def test_each_cache_finds_misses_where_its_tags_are(disk):
    dataset, _ = disk
    with open_storage(dataset, "pread") as storage:
        assert not SoftwareCache(storage, num_sets=2, read_ahead=2).read_ahead.on_device
        assert ReadAhead(storage, 2, device="cuda").on_device and ReadAhead(storage, 2, device="cuda:1").on_device


@pytest.mark.slow  # (seconds: the cache's kernels under the interpreter, every call recorded)
@pytest.mark.parametrize("pvp", [False, True])
def test_a_device_cache_reads_ahead_on_the_device_and_returns_the_file(disk, monkeypatch, pvp):
    """A cache taking its GPU path on CPU tensors (tests/host_budget.py), reading ahead with the device probe:
    every batch's rows are the file's, its hits those of the same cache without read-ahead, and what it asked for
    was read and used; the lookup's thread never waits for the probe (the read-ahead's worker does), nor, with
    PVP, for the victim buffer's parked ids that the probe leaves out."""
    pytest.importorskip("triton")
    if HAVE_CUDA:
        pytest.skip("triton compiles for the GPU here: no interpreter for CPU tensors")
    from host_budget import HostWork, device_cache, device_mode

    dataset, features = disk
    trace = trace_of(5, 4, 20)
    lines, first = inspect.getsourcelines(VictimBuffer.parked_for)
    parked_for = {f"lsm_gnn/cache/pvp.py:{n}" for n in range(first, first + len(lines))}  # where a read back is
    with device_mode(monkeypatch), open_storage(dataset, "pread") as storage:
        kwargs = dict(num_sets=4, ways=8, window=3, period=2, pvp=pvp, pvp_queue_capacity=4)
        early = device_cache(storage, read_ahead=2, **kwargs)
        plain = SoftwareCache(storage, read_ahead=0, **kwargs)
        ahead = early.read_ahead
        assert ahead.on_device
        for k, (ids, future) in enumerate(replay(trace, 3, num_nodes=600)):
            work = HostWork()
            work.device(early.state, early.data)
            if pvp:  # the victim buffer's counters and queue labels live on the device
                work.device([early.pvp.count, early.pvp.queue_iteration])
            rows, hit = work.call(lambda i: early.lookup(i, future=future), ids)
            _, want_hit = plain.lookup(ids, future=list(future))
            assert np.array_equal(rows.numpy(), features[np.asarray(ids)]), f"batch {k}"
            assert torch.equal(hit, want_hit), f"batch {k}"
            waits = [w for w in work.what if "read_ahead.py" in w or w.rsplit(" at ", 1)[1] in parked_for]
            assert not waits, f"batch {k}: {work.what}"
            wait_for(lambda: not ahead._probes and not ahead._probing)  # else the next lookup finishes it
        early.settle()
    ahead = early.read_ahead.stats
    assert ahead.used > 0 and ahead.read == ahead.used
