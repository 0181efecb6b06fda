"""NCCL's ordering rule in the stream stand-in (tests/fake_cuda.py), and the shared cache's exchange checked
against it on device-mode tensors: over torch's fake process group (one process) and over gloo (2 processes).

Under NCCL a collective runs on NCCL's own stream after the work its issuing stream had been given, and its work's
``wait()`` makes the current stream wait for it, not the host. Code that treats ``wait()`` as the host's
synchronization (as gloo's is) reads rows NCCL has not written yet, or overwrites a buffer NCCL still sends.
"""
import contextlib

import pytest
import torch
import torch.distributed as dist

from fake_cuda import StreamRecorder


@pytest.fixture
def group():
    """A process group of 2 ranks in this process (torch's fake group: it moves no real data)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.fixture
def rec(monkeypatch, group):
    rec = StreamRecorder()
    rec.install(monkeypatch, collectives=True)
    return rec


def exchange(send, async_op=True):
    recv = torch.empty_like(send)
    return recv, dist.all_to_all_single(recv, send, [2, 2], [2, 2], async_op=async_op)


def waited(send=None):
    """The output of a collective of ``send`` (default: fresh), once its work was waited on."""
    recv, work = exchange(torch.arange(4) if send is None else send)
    work.wait()
    return recv


CASES = {
    # the exchange's own pattern: wait, then read the rows through the stream (a copy to the host waits for it)
    "wait, then a copy to the host": lambda rec: waited().tolist(),
    "wait, then the stream reads": lambda rec: waited().sum(),
    "async_op=False, then the stream reads": lambda rec: exchange(torch.arange(4), async_op=False)[0].sum(),
    "wait, synchronize, read in place": lambda rec: (
        recv := waited(), torch.cuda.current_stream().synchronize(), recv.numpy()),
    "the input written on the stream before the collective": lambda rec: (
        send := torch.zeros(4), rec.watch({"send": send}), send.copy_(torch.arange(4.0)),
        waited(send).sum()),
    # wait() does not block the host: what NCCL writes is not the host's to read until it synchronizes
    "wait, then read in place": lambda rec: waited().numpy(),
    # the stream that waited is ordered; another stream is not
    "wait, then a copy on another stream": lambda rec: copy_on_another_stream(waited()),
    "the input reused before the wait": lambda rec: (
        send := torch.arange(4), rec.watch({"send": send}), work := exchange(send)[1], send.fill_(0), work.wait()),
    "the output read before the wait": lambda rec: (
        pair := exchange(torch.arange(4)), pair[0].sum(), pair[1].wait()),
}
RACY = {"wait, then read in place", "wait, then a copy on another stream", "the input reused before the wait",
        "the output read before the wait"}


def copy_on_another_stream(t):
    with torch.cuda.stream(torch.cuda.Stream()):
        return t.tolist()


@pytest.mark.parametrize("case", list(CASES))
def test_nccl_rule(rec, case):
    with rec.mode():
        CASES[case](rec)
    races = rec.races()
    assert bool(races) == (case in RACY), races
    if races:
        assert all("all_to_all_single" in r for r in races), races


def test_a_collective_waits_for_its_stream_and_wait_orders_the_current_stream_only(rec):
    with rec.mode():
        recv, work = exchange(torch.arange(4))
        work.wait()
    assert rec.log[-2:] == [("collective", "default", "all_to_all_single #1"), ("wait", "default", "nccl")]
    assert rec.host == {}, "wait() told the host nothing"


# -- the shared cache's exchange under the rule ---------------------------------------------------------------------

@contextlib.contextmanager
def device_shared_cache(dataset, monkeypatch, owner):
    """A :class:`SharedCache` over the default group whose cache and exchange take their GPU paths on CPU tensors
    (streams from the stand-in, the Triton kernels under the interpreter, the rows gathered on the device after
    they arrive), as they run over NCCL; yields it and the recorder that checks its accesses."""
    from host_budget import device_cache, device_mode
    from lsm_gnn import open_storage
    from lsm_gnn.comm import SharedCache

    with device_mode(monkeypatch):
        rec = StreamRecorder()  # installed after device_mode's, so the cache's stream is this one's
        rec.install(monkeypatch, collectives=True)
        cache = device_cache(open_storage(dataset, "memory"), num_sets=8, ways=8, read_ahead=0)  # writable
        shared = SharedCache(cache, owner, group=dist.group.WORLD, exchange="collective")
        shared.unpack_on_host = False
        rec.watch({"cache tags": cache.state.tags, "cache data": cache.data})
        yield shared, rec


#: the ids every rank changes between the second and third lookup, by 1 each (so their rows grow by the world size)
UPDATED = torch.arange(0, 60, 3)


def exchanges_under_the_rule(shared, rec, rank: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Three lookups (the second announced by the first, as the loader does; the later ones reuse the exchange's
    buffers), the third after an update of :data:`UPDATED`, under the recorder; the lookups' (ids, rows).
    Raises AssertionError naming the accesses NCCL would race."""
    batches = [torch.arange(10 * k + rank, 10 * k + rank + 40) for k in range(3)]
    found = []
    with rec.mode():
        for k, ids in enumerate(batches):
            if k == 2:
                shared.update(UPDATED, torch.ones(UPDATED.numel(), shared.cache.data.shape[1]), torch.add)
            following = (batches[1], []) if k == 0 else None
            found.append((ids, shared.lookup(ids, following=following)[0]))
    races = rec.races()
    if races:
        raise AssertionError(f"rank {rank}: {len(races)} accesses not ordered under NCCL's rule: {races[:3]}")
    return found


# the device paths on CPU tensors: the Triton kernels under the interpreter, which a GPU machine does not turn on
on_the_interpreter = pytest.mark.skipif(torch.cuda.is_available(), reason="runs the kernels under the interpreter")


@pytest.fixture
def dataset(tmp_path):
    from host_budget import tiny_dataset

    return tiny_dataset(tmp_path / "ds")


@on_the_interpreter
def test_the_exchange_is_ordered_under_nccls_rule_over_the_fake_group(dataset, monkeypatch, group):
    """The fake group hands back made-up rows, so only the order of the accesses is checked here."""
    pytest.importorskip("triton")
    from lsm_gnn.comm import ModuloOwner

    with device_shared_cache(dataset, monkeypatch, ModuloOwner(2)) as (shared, rec):
        exchanges_under_the_rule(shared, rec)
        assert sum(kind == "collective" for kind, *_ in rec.log) == 8  # ids, then rows, per lookup and update
        assert shared.stats.announced == 1
        assert rec.writers("cache data") == {"side1", "default"}, "looked up on its stream, updated on the caller's"


@on_the_interpreter
@pytest.mark.slow
def test_the_exchange_is_ordered_under_nccls_rule_over_gloo_and_gives_the_rows(tmp_path):
    """2 processes over gloo: the same exchanges, each rank's rows checked against the feature file (and the
    update)."""
    pytest.importorskip("triton")
    from host_budget import tiny_dataset
    from test_comm import run_ranks

    from lsm_gnn import open_dataset

    codes, logs, _ = run_ranks("nccl_rule", open_dataset(tiny_dataset(tmp_path / "ds")), tmp_path, 2, timeout=120)
    assert codes == [0, 0], "\n".join(logs)
