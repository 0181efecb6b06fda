"""The write-back cache over a writable storage: no update is ever lost, whatever the eviction order.

Each test runs random batches through a small cache (so lines are evicted all the time) and changes a random
part of every batch with ``update``; a dense copy of the table takes the same changes. Every lookup must return
the dense copy's rows, and after ``flush`` the storage must equal it, for every policy, with and without the
victim-buffer prefetcher, and with batches larger than the cache.
"""
import zlib

import numpy as np
import pytest
import torch

from lsm_gnn.cache import POLICIES, SoftwareCache, WindowBuffer, write_back
from lsm_gnn.testing import tiny_cache_setup

NUM_NODES, DIM = 600, 8


def add(rows: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
    return rows + grads


def run_random(cache: SoftwareCache, reference: torch.Tensor, seed: int, iterations: int = 40, batch: int = 90,
               window: int = 4) -> None:
    """Lookups with an exact window and random updates; every row read must be the reference's."""
    rng = np.random.default_rng(seed)
    hot = rng.random(NUM_NODES) ** 3  # skewed reuse, so lines live long enough to be dirty when evicted
    batches = [np.unique(rng.choice(NUM_NODES, batch, p=hot / hot.sum())) for _ in range(iterations + window)]
    # As asked: with repeats, in any order (the window holds exactly these, so victim records match)
    requests = [torch.from_numpy(rng.permutation(np.repeat(b, 2))) for b in batches]
    future = WindowBuffer(window, NUM_NODES)
    for r in requests[:window]:
        future.push(r)
    for t in range(iterations):
        ids = requests[t]
        future.pop()
        future.push(requests[t + window])
        rows, _ = cache.lookup(ids, future)
        assert torch.equal(rows, reference[ids]), f"iteration {t}: a lookup returned a stale or wrong row"
        changed = torch.from_numpy(rng.choice(batches[t], max(1, batches[t].size // 2), replace=False))
        grads = torch.from_numpy(rng.standard_normal((changed.numel(), DIM)).astype(np.float32))
        cache.update(changed, grads, add)
        reference[changed] += grads
    cache.flush()
    on_disk = cache.storage.read(torch.arange(NUM_NODES))
    assert torch.equal(on_disk, reference), "after flush the storage differs from the updates applied"
    assert not bool(cache.dirty.any())


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("pvp", [None, "reinstall", "paper"])
def test_no_update_is_lost(tmp_path, policy, pvp):
    """Three random runs per policy and PVP mode. Seed 6 of static with reinstall once served a stale parked
    copy: a row its own batch evicted (and PVP parked) was then changed in storage; the copy is now dropped."""
    kwargs = {} if pvp is None else {"pvp": True, "pvp_queue_capacity": 16, "pvp_reinstall": pvp == "reinstall"}
    seeds = [6] if (policy, pvp) == ("static", "reinstall") else []
    for seed in seeds + [zlib.crc32(f"{policy} {pvp} {k}".encode()) % 1000 for k in range(3)]:
        storage, features, static = tiny_cache_setup(tmp_path / str(seed), NUM_NODES, DIM)
        cache = SoftwareCache(storage, num_sets=4, ways=32, policy=policy, window=4, static_scores=static, **kwargs)
        run_random(cache, features.clone(), seed=seed)
        assert cache.stats.evictions > 0 and cache.stats.written_back > 0
        if pvp is not None:
            assert cache.pvp.stats.hits > 0  # parked lines were served, and were clean copies


@pytest.mark.parametrize("seed", range(6))
def test_batches_larger_than_the_cache(tmp_path, seed):
    """Oversubscribed: a batch evicts lines it uses itself, and the update finds some ids uncached."""
    storage, features, static = tiny_cache_setup(tmp_path, NUM_NODES, DIM)
    cache = SoftwareCache(storage, num_sets=1, ways=32, policy="rr", oversubscribe=True)
    run_random(cache, features.clone(), seed=seed, batch=150)
    assert cache.stats.evicted_in_use > 0


def test_flush_writes_bounded_chunks_in_id_order(tmp_path, monkeypatch):
    """A flush hands the storage at most FLUSH_BYTES a write (each write copies its rows: a cache that fills a
    memory cap has no room for a copy of every line), in id order, and leaves every row on disk."""
    storage, features, _ = tiny_cache_setup(tmp_path, NUM_NODES, DIM)
    cache = SoftwareCache(storage, num_sets=4, ways=32, policy="rr")
    ids = torch.arange(0, NUM_NODES, 10)
    cache.lookup(ids)
    cache.update(ids, torch.ones(ids.numel(), DIM), add)
    monkeypatch.setattr(write_back, "FLUSH_BYTES", 7 * storage.row_bytes)
    writes, write = [], storage.write
    monkeypatch.setattr(storage, "write", lambda i, rows: (writes.append(i.clone()), write(i, rows))[1])
    cache.flush()
    assert max(w.numel() for w in writes) == 7 and torch.equal(torch.cat(writes), ids)
    expected = features.clone()
    expected[ids] += 1
    assert torch.equal(storage.read(torch.arange(NUM_NODES)), expected) and not bool(cache.dirty.any())


def test_lines_of_names_the_line_each_row_is_in(tmp_path):
    storage, features, _ = tiny_cache_setup(tmp_path, NUM_NODES, DIM)
    cache = SoftwareCache(storage, num_sets=4, ways=32)
    ids = torch.arange(0, NUM_NODES, 7)
    cache.lookup(ids)
    line = cache.lines_of(torch.arange(NUM_NODES))
    held = line >= 0
    assert int(held.sum()) == int((cache.state.tags >= 0).sum())
    assert torch.equal(cache.state.tags[line[held]], torch.arange(NUM_NODES)[held])
    assert torch.equal(cache.data[line[held]], features[held])


def test_a_failed_write_back_stops_the_cache(tmp_path):
    """The dirty rows a failed write held exist nowhere else: the cache refuses to go on as if they did."""
    storage, features, _ = tiny_cache_setup(tmp_path, NUM_NODES, DIM)
    cache = SoftwareCache(storage, num_sets=1, ways=32, policy="rr")
    cache.lookup(torch.arange(32))
    cache.update(torch.arange(32), torch.ones(32, DIM), add)

    def refuse(ids, rows):
        raise OSError(28, "No space left on device")

    storage._write = refuse
    with pytest.raises(OSError, match="No space"):
        cache.lookup(torch.arange(32, 64))
    with pytest.raises(RuntimeError, match="resume from the last checkpoint"):
        cache.lookup(torch.arange(32))


def test_a_read_only_storage_takes_no_updates(tmp_path, monkeypatch):
    storage, _, _ = tiny_cache_setup(tmp_path, NUM_NODES, DIM)
    monkeypatch.setattr(type(storage), "writable", False)
    cache = SoftwareCache(storage, num_sets=1, ways=32)
    with pytest.raises(TypeError, match="read-only"):
        cache.update(torch.arange(3), torch.ones(3, DIM), add)
    with pytest.raises(TypeError, match="read-only"):
        storage.write(torch.arange(3), torch.ones(3, DIM))
