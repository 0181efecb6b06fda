"""The CUDA stream order of a GPU cache's victim buffer, checked on CPU tensors.

A GPU cache's lookup runs on the cache's stream; the victim buffer's move runs on a background thread. On a GPU
nothing orders two streams but events, stream waits and host synchronizations, so every access the move makes to
the counters, queue labels, queues and prefetch buffer must be ordered with every conflicting access by a lookup,
in both directions. Here the cache and its victim buffer run in their GPU mode on CPU tensors, with torch.cuda's
streams and events replaced by a recording stand-in (tests/fake_cuda.py), and every access is checked against
that order; the move thread runs either at once or only when joined (the two extreme schedules).
"""
import threading

import numpy as np
import pytest
import torch

import lsm_gnn.cache.pvp as pvp_module
from fake_cuda import StreamRecorder, scheduled_thread
from lsm_gnn import testing
from lsm_gnn.cache import PolicyConfig, SoftwareCache, VictimBuffer, replay
from test_kernels_victim_enqueue import victims

WINDOW = 4


def fake_gpu(monkeypatch, schedule) -> StreamRecorder:
    """torch.cuda's streams recorded, and the victim buffer's move thread run on ``schedule``."""
    rec = StreamRecorder()
    rec.install(monkeypatch)
    monkeypatch.setattr(pvp_module, "threading", type("threading", (), {
        "Thread": scheduled_thread(rec, schedule), "Lock": threading.Lock}))
    return rec


def gpu_mode(rec: StreamRecorder, b: VictimBuffer) -> None:
    """Switches a CPU victim buffer into its GPU mode and watches every tensor it shares with its users."""
    b._copy_to_device()
    b._stream.name = "victim-buffer stream"
    rec.watch(device={"count": b.count, "queue_iteration": b.queue_iteration, "prefetch_node": b.prefetch_node,
                      "prefetch_record": b.prefetch_record, "prefetch_data": b.prefetch_data},
              host={"queue node": b.node, "queue record": b.record, "queue data": b.data})


def assert_no_race(rec: StreamRecorder) -> None:
    races = rec.races()
    assert not races, f"{len(races)} unordered pairs of accesses, e.g.:\n" + "\n".join(races[:8])


def parked_ids(parked: torch.Tensor) -> torch.Tensor:
    """Sorted, without a GPU buffer's -1 padding (a CPU buffer's result may be a view of its queue: copied)."""
    return parked[parked >= 0].sort().values


def run(storage, static, trace, reinstall, discard_at, gpu_mode=None):
    """Rows and hits of a PVP cache over ``trace``, the loader's loop (lookup, then prefetch the next move);
    ``gpu_mode(cache)`` switches it into its GPU mode first. The parked copies of a few ids are discarded
    once, as a write-back cache's update does. After each lookup the next batch's parked ids are asked for, as
    the read-ahead does, and the one after's once the next move has started."""
    cache = SoftwareCache(storage, num_sets=16, ways=4, policy=PolicyConfig("hybrid_pvp", window=WINDOW, period=2),
                          static_scores=static, pvp=True, pvp_queue_capacity=6, pvp_reinstall=reinstall)
    if gpu_mode is not None:
        gpu_mode(cache)
    out = []
    for k, (current, future) in enumerate(replay(trace, WINDOW, num_nodes=storage.num_rows)):
        rows, hit = cache.lookup(current, future=future)
        parked = [parked_ids(cache.pvp.parked_for(k + 1))]
        if k == discard_at:
            cache.pvp.discard(torch.as_tensor(current[:5]))
        cache.prefetch()
        parked.append(parked_ids(cache.pvp.parked_for(k + 2)))
        out.append((rows.clone(), hit.clone(), parked))
    cache.settle()
    return out, cache


@pytest.mark.parametrize("schedule", ["early", "late"])
@pytest.mark.parametrize("reinstall", [True, False])
def test_every_access_of_the_move_is_ordered_with_the_lookups(tiny_cache, monkeypatch, schedule, reinstall):
    storage, features, static = tiny_cache
    trace = testing.power_law_trace(5, 14, 40, storage.num_rows, 0.9)
    expected, cpu = run(storage, static, trace, reinstall, discard_at=6)
    assert cpu.pvp.stats.hits > 0, "the trace must make the victim buffer serve rows"

    rec = fake_gpu(monkeypatch, schedule)

    def cache_gpu_mode(cache):
        cache._stream = torch.cuda.Stream(cache.device)  # what a CUDA cache makes: its lookups' stream
        cache._stream.name = "cache stream"
        gpu_mode(rec, cache.pvp)

    with rec.mode():
        got, gpu = run(storage, static, trace, reinstall, discard_at=6, gpu_mode=cache_gpu_mode)

    for k, ((rows, hit, parked), (want_rows, want_hit, want_parked)) in enumerate(zip(got, expected)):
        assert torch.equal(rows, want_rows) and torch.equal(hit, want_hit), f"batch {k} differs from the CPU cache"
        assert all(map(torch.equal, parked, want_parked)), f"batch {k}: other ids parked for the next batches"
    assert all(sum(len(p[j]) for *_, p in expected) > 0 for j in (0, 1)), "ids must be parked for next batches"
    assert gpu.pvp.stats == cpu.pvp.stats
    # What the check covers: the move wrote the counters, labels and prefetch buffer, a lookup wrote the queues.
    for name in ("count", "queue_iteration", "prefetch_node", "prefetch_data"):
        assert rec.writers(name) - {"cache stream"}, f"nothing but the lookups wrote {name}"
    assert "cache stream" in rec.writers("queue data")
    assert_no_race(rec)


@pytest.mark.parametrize("schedule", ["early", "late"])
def test_a_buffer_used_without_take_orders_its_accesses_too(monkeypatch, schedule):
    """Enqueue and discard straight after starting a move, with no take between (the cache always takes
    first): the enqueue waits for the move on the device, discard's host writes to the queues for both streams."""
    rec = fake_gpu(monkeypatch, schedule)
    buffer = VictimBuffer(WINDOW, 4, 5, torch.float32)
    gpu_mode(rec, buffer)
    serving = torch.cuda.Stream()
    serving.name = "serving stream"
    rng = np.random.default_rng(2)
    cache_data = torch.randn(50, 5)
    with rec.mode(), torch.cuda.stream(serving):
        for t in range(8):
            buffer.take(t)
            buffer.consumed(t, 0)
            buffer.prefetch_async(t + 1)
            buffer.enqueue(*victims(rng, 20, 50, t, t, WINDOW), cache_data, t, t)
            buffer.discard(torch.tensor([1, 2, 3]))
        buffer.close()
    assert buffer.stats.prefetched > 0 and rec.writers("queue node") == {"serving stream", "host"}
    assert_no_race(rec)
