"""The CUDA stream order of a GPU cache's victim buffer, checked on CPU tensors.

A GPU cache's lookup runs on the cache's stream; the victim buffer's move runs on a background thread. On a GPU
nothing orders two streams but events, stream waits and host synchronizations, so every access the move makes to
the counters, queue labels, queues and prefetch buffer must be ordered with every conflicting access by a lookup,
in both directions. Here the cache and its victim buffer run in their GPU mode on CPU tensors, with torch.cuda's
streams and events replaced by a recording stand-in (tests/fake_cuda.py), and every access is checked against
that order; the move thread runs either at once or only when joined (the two extreme schedules).
"""
import threading

import pytest
import torch

import lsm_gnn.cache.pvp as pvp_module
from fake_cuda import StreamRecorder, scheduled_thread
from lsm_gnn import testing
from lsm_gnn.cache import PolicyConfig, SoftwareCache, replay

WINDOW = 4


def run(storage, static, trace, reinstall, discard_at, gpu_mode=None):
    """Rows and hits of a PVP cache over ``trace``, the loader's loop (lookup, then prefetch the next move);
    ``gpu_mode(cache)`` switches it into its GPU mode first. The parked copies of a few ids are discarded
    once, as a write-back cache's update does."""
    cache = SoftwareCache(storage, num_sets=16, ways=4, policy=PolicyConfig("hybrid_pvp", window=WINDOW, period=2),
                          static_scores=static, pvp=True, pvp_queue_capacity=6, pvp_reinstall=reinstall)
    if gpu_mode is not None:
        gpu_mode(cache)
    out = []
    for k, (current, future) in enumerate(replay(trace, WINDOW, num_nodes=storage.num_rows)):
        rows, hit = cache.lookup(current, future=future)
        out.append((rows.clone(), hit.clone()))
        if k == discard_at:
            cache.pvp.discard(torch.as_tensor(current[:5]))
        cache.prefetch()
    cache.settle()
    return out, cache


@pytest.mark.parametrize("schedule", ["early", "late"])
@pytest.mark.parametrize("reinstall", [True, False])
def test_every_access_of_the_move_is_ordered_with_the_lookups(tiny_cache, monkeypatch, schedule, reinstall):
    storage, features, static = tiny_cache
    trace = testing.power_law_trace(5, 14, 40, storage.num_rows, 0.9)
    expected, cpu = run(storage, static, trace, reinstall, discard_at=6)
    assert cpu.pvp.stats.hits > 0, "the trace must make the victim buffer serve rows"

    rec = StreamRecorder()
    rec.install(monkeypatch)
    monkeypatch.setattr(pvp_module, "threading", type("threading", (), {
        "Thread": scheduled_thread(rec, schedule), "Lock": threading.Lock}))

    def gpu_mode(cache):
        cache._stream = torch.cuda.Stream(cache.device)  # what a CUDA cache makes: its lookups' stream
        cache._stream.name = "cache stream"
        cache.pvp._copy_to_device()
        cache.pvp._stream.name = "victim-buffer stream"
        b = cache.pvp
        rec.watch(device={"count": b.count, "queue_iteration": b.queue_iteration, "prefetch_node": b.prefetch_node,
                          "prefetch_record": b.prefetch_record, "prefetch_data": b.prefetch_data},
                  host={"queue node": b.node, "queue record": b.record, "queue data": b.data})

    with rec.mode():
        got, gpu = run(storage, static, trace, reinstall, discard_at=6, gpu_mode=gpu_mode)

    for k, ((rows, hit), (want_rows, want_hit)) in enumerate(zip(got, expected)):
        assert torch.equal(rows, want_rows) and torch.equal(hit, want_hit), f"batch {k} differs from the CPU cache"
    assert gpu.pvp.stats == cpu.pvp.stats
    # What the check covers: the move wrote the counters, labels and prefetch buffer, a lookup wrote the queues.
    for name in ("count", "queue_iteration", "prefetch_node", "prefetch_data"):
        assert rec.writers(name) - {"cache stream"}, f"nothing but the lookups wrote {name}"
    assert "cache stream" in rec.writers("queue data")
    races = rec.races()
    assert not races, f"{len(races)} unordered pairs of accesses, e.g.:\n" + "\n".join(races[:8])
