"""One rank of a multi-process test of the communication layer (run by tests/test_comm.py).

    python tests/comm_worker.py SCENARIO DATASET OUT_DIR   (RANK, WORLD_SIZE, MASTER_* in the environment)
"""
import json
import os
import sys
import threading
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from lsm_gnn import open_dataset, open_storage
from lsm_gnn.cache import SoftwareCache, WindowBuffer
from lsm_gnn.comm import ExchangeError, ModuloOwner, SharedCache
from lsm_gnn.loader import NodeLoader

FANOUTS, BATCH, WINDOW = [4, 3], 64, 8


def make_loader(ds, features, rank, world):
    return NodeLoader(ds, features, FANOUTS, BATCH, window=WINDOW, rank=rank, world_size=world, seed=0)


def correctness(ds, rank, world, out):
    expected = torch.from_numpy(ds.read_features_direct(np.arange(ds.num_nodes)))
    cache = SoftwareCache(open_storage(ds, "io_uring"), num_sets=4, ways=32, policy="hybrid", window=WINDOW,
                          oversubscribe=True)
    shared = SharedCache(cache, ModuloOwner(world), timeout_s=60)
    requested, served = [], []
    lookup = shared.lookup

    def logged(*args, **kwargs):  # on the loader's thread, which runs ahead of this one
        found = lookup(*args, **kwargs)
        served.append(shared.last_served)
        return found

    shared.lookup = logged
    loader = make_loader(ds, shared, rank, world)
    epochs = int(os.environ.get("COMM_TEST_EPOCHS", "2"))
    for _ in range(epochs):
        for batch in loader:
            if not torch.equal(batch.x, expected[batch.input_nodes]):
                raise AssertionError(f"rank {rank}: batch {batch.iteration} differs from the feature file")
            requested.append(np.unique(batch.input_nodes.numpy()))
            assert "exchange" in batch.timings
    if shared.stats.announced != len(requested) - epochs:  # every lookup but the first of each epoch
        raise AssertionError(f"rank {rank}: {shared.stats.announced} lookups announced of {len(requested)}")
    np.savez(os.path.join(out, f"rank{rank}.npz"), requested=np.array(requested, dtype=object),
             served=np.array(served, dtype=object), allow_pickle=True)


def hit_ratios(ds, rank, world, out):
    lines = 32  # sets of 32 ways per rank
    results = {}
    for mode in ("shared", "isolated"):
        cache = SoftwareCache(open_storage(ds, "io_uring"), num_sets=lines, ways=32, policy="hybrid", window=WINDOW,
                              oversubscribe=True)
        features = SharedCache(cache, ModuloOwner(world), timeout_s=60) if mode == "shared" else cache
        hits = total = 0
        for batch in make_loader(ds, features, rank, world):
            hits += int(batch.hit_mask.sum())
            total += batch.hit_mask.numel()
        results[mode] = [hits, total]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
        json.dump(results, fh)


def killed(ds, rank, world, out):
    cache = SoftwareCache(open_storage(ds, "io_uring"), num_sets=4, ways=32, oversubscribe=True, window=WINDOW)
    shared = SharedCache(cache, ModuloOwner(world), timeout_s=30)
    if shared.exchange == "shm":  # for the test to find the segments' files
        with open(os.path.join(out, f"token{rank}.txt"), "w") as fh:
            fh.write(shared._shm.tokens[rank])
    try:
        for batch in make_loader(ds, shared, rank, world):
            if rank == 1 and batch.iteration == 2:
                os._exit(3)  # dies without a word, as a crashed process does
    except ExchangeError as exc:
        with open(os.path.join(out, f"rank{rank}.txt"), "w") as fh:
            fh.write(str(exc))
        return
    raise AssertionError(f"rank {rank} finished the epoch although rank 1 died")


def count_collectives(calls):
    """Wraps all_to_all_single so every call is recorded: (thread name, dtype sent, shape sent)."""
    real = dist.all_to_all_single

    def counted(output, input, *args, **kwargs):
        calls.append((threading.current_thread().name, str(input.dtype), list(input.shape)))
        return real(output, input, *args, **kwargs)

    dist.all_to_all_single = counted


def adversarial_batches(rank, world, num_nodes):
    """(name, ids) pairs every rank runs in the same order: random with duplicates, one rank empty, all ids
    owned by one rank, one id repeated, everyone empty, ids at both ends of the range."""
    rng = np.random.default_rng(rank)
    owned_by_0 = np.arange(0, num_nodes, world)
    return [("random", rng.integers(0, num_nodes, 300)),
            ("rank 0 empty", np.empty(0, dtype=np.int64) if rank == 0 else rng.integers(0, num_nodes, 200)),
            ("all owned by rank 0", rng.choice(owned_by_0, 150)),
            ("one id repeated", np.full(77, 5 + rank)),
            ("all empty", np.empty(0, dtype=np.int64)),
            ("range ends", np.array([num_nodes - 1, 0, num_nodes - 1, 1]))]


def protocol(paths, rank, world, out):
    """Exact bytes, hit flags and 2 collectives per lookup, for each dataset (several dtypes and row sizes)."""
    calls = []
    count_collectives(calls)
    report = {}
    for path in paths.split(os.pathsep):
        ds = open_dataset(path)
        expected = torch.from_numpy(ds.read_features_direct(np.arange(ds.num_nodes)))
        # room for every row (2048 lines per rank), so the hit flags are known: the first lookup of an id
        # misses and every later one hits
        cache = SoftwareCache(open_storage(ds, "io_uring"), num_sets=64, ways=32, policy="hybrid", window=4,
                              oversubscribe=True)
        seen = np.zeros(ds.num_nodes, dtype=bool)
        shared = SharedCache(cache, ModuloOwner(world), timeout_s=60)
        batches = adversarial_batches(rank, world, ds.num_nodes)
        window = WindowBuffer(len(batches), ds.num_nodes)
        for name, ids in batches:
            window.push(np.unique(ids))  # the owners' windows get every batch, some of them empty
        lookups = 0
        everyone = [adversarial_batches(r, world, ds.num_nodes) for r in range(world)]
        for repeat in range(2):
            for i, (name, ids) in enumerate(batches):
                before = len(calls)
                if repeat:
                    out_rows = torch.empty((ids.size, expected.shape[1]), dtype=expected.dtype)
                    rows, hit = shared.lookup(ids, future=window, out=out_rows)
                    assert rows.data_ptr() == out_rows.data_ptr() or ids.size == 0
                else:
                    rows, hit = shared.lookup(ids, future=window if name == "random" else None)
                lookups += 1
                want = expected[torch.from_numpy(ids).long()]
                assert rows.dtype == expected.dtype and hit.dtype == torch.bool and hit.shape == (ids.size,), name
                assert torch.equal(rows.view(torch.uint8), want.view(torch.uint8)), f"{path} {name}: bytes differ"
                assert len(calls) - before == 2, f"{name}: {len(calls) - before} collectives"
                rows_sent, row_bytes = calls[-1], expected.shape[1] * expected.element_size()
                if shared.exchange == "collective":  # the rows' bytes, not widened
                    assert rows_sent[1] == "torch.uint8" and rows_sent[2][1:] == [row_bytes], rows_sent
                else:  # where the rows are in the owners' shared memory
                    assert rows_sent[1] == "torch.int64" and len(rows_sent[2]) == 1, rows_sent
                assert np.array_equal(hit.numpy(), seen[ids]), f"{name}: wrong hit flags"
                for other in everyone:  # every rank's requests fill the shared cache
                    seen[other[i][1]] = True
        report[path] = {"lookups": lookups, "collectives": shared.stats.collectives, "exchange": shared.exchange,
                        "by_kind": sorted(shared.stats.collective_seconds)}
        report[path]["spill"] = spill(shared, expected, rank, world)
    # Through the loader the exchange runs on its background thread, beside training on the main thread.
    ds = open_dataset(paths.split(os.pathsep)[0])
    cache = SoftwareCache(open_storage(ds, "io_uring"), num_sets=4, ways=32, oversubscribe=True, window=WINDOW)
    del calls[:]
    shared = SharedCache(cache, ModuloOwner(world), timeout_s=60)
    for batch in make_loader(ds, shared, rank, world):
        pass
    report["loader_threads"] = sorted({c[0] for c in calls})
    report["loader"] = {"calls": len(calls), "batches": batch.iteration + 1,
                        "spills": shared.stats.collective_calls.get("ids and future, spill", 0)}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
        json.dump(report, fh)


def spill(shared, expected, rank, world):
    """A request longer than the agreed chunk (a whole window of every node) takes a third collective, the
    rows are still the file's, and the lookup after it is back to two collectives. Returns the collectives
    each of the two lookups made."""
    num = expected.shape[0]
    window = WindowBuffer(6, num)
    for j in range(6):
        window.push(np.arange(num))  # every node in every future batch: far over a chunk to each owner
    made = []
    for ids, future in ((np.arange(rank, num, 3), window), (np.array([1, 2, 3]), None)):
        before = shared.stats.collectives
        rows, hit = shared.lookup(ids, future=future)
        made.append(shared.stats.collectives - before)
        assert torch.equal(rows.view(torch.uint8), expected[torch.from_numpy(ids)].view(torch.uint8)), made
    return made


def reference_batches(rank, world, num_nodes, iterations):
    """Each rank's batches, the same on every rank that asks: mostly random with duplicates, and at fixed
    iterations an empty batch on rank 0, every id owned by rank 0, one id repeated, everyone empty."""
    rng = np.random.default_rng([11, rank])
    batches = [rng.integers(0, num_nodes, int(rng.integers(50, 400))) for _ in range(iterations)]
    if rank == 0:
        batches[3] = np.empty(0, dtype=np.int64)
    batches[5] = rng.choice(np.arange(0, num_nodes, world), 200)
    batches[7] = np.full(40, 9 + rank)
    batches[9] = np.empty(0, dtype=np.int64)
    return batches


def reference(ds, rank, world, out):
    """Small slices that evict every iteration, with windows: every rank's hit flags must equal those of a
    single-process reference, one SoftwareCache per owner fed what that owner should see (the union of every
    rank's distinct ids it owns, and likewise its window), and its rows the file's; 2 collectives a lookup."""
    from lsm_gnn.cache import replay

    iterations, window_size = 16, 4
    expected = torch.from_numpy(ds.read_features_direct(np.arange(ds.num_nodes)))
    config = dict(num_sets=2, ways=32, policy="hybrid", window=window_size, oversubscribe=True)
    owner = ModuloOwner(world)
    shared = SharedCache(SoftwareCache(open_storage(ds, "memory"), **config), owner, timeout_s=60)
    mine = reference_batches(rank, world, ds.num_nodes, iterations)
    announce = os.environ.get("COMM_TEST_ANNOUNCE") == "1"  # each lookup's request sent during the one before
    got = []
    for t, ids, future in zip(range(iterations), mine, replay(mine, window_size, ds.num_nodes)):
        following = None
        if announce and t + 1 < iterations:  # replay pushes batch t + 1 + window before the next lookup
            entering = mine[t + 1 + window_size:t + 2 + window_size]
            following = (np.concatenate([mine[t + 1], mine[t + 1][:3]]), entering)  # repeats are fine
        rows, hit = shared.lookup(ids, future=future[1], following=following)
        if not torch.equal(rows, expected[torch.from_numpy(ids)]):
            raise AssertionError(f"rank {rank}: iteration {t}: rows differ from the feature file")
        got.append(hit.numpy())
    if shared.stats.collectives != 2 * iterations or shared.stats.announced != (iterations - 1 if announce else 0):
        raise AssertionError(f"rank {rank}: {shared.stats.collectives} collectives in {iterations} lookups, "
                             f"{shared.stats.announced} announced")
    everyone = [reference_batches(r, world, ds.num_nodes, iterations) for r in range(world)]
    hit_of = {}  # (iteration, id) -> hit, from each owner's reference cache
    evictions = 0
    for o in range(world):
        trace = [np.unique(np.concatenate([b[t] for b in everyone])) for t in range(iterations)]
        trace = [ids[owner(ids) == o] for ids in trace]
        cache = SoftwareCache(open_storage(ds, "memory"), **config)
        for t, (ids, future) in enumerate(replay(trace, window_size, ds.num_nodes)):
            _, hit = cache.lookup(ids, future=future)
            hit_of.update(zip(((t, int(i)) for i in ids.tolist()), hit.tolist()))
        evictions += cache.stats.evictions
    for t, (ids, hit) in enumerate(zip(mine, got)):
        want = np.array([hit_of[t, int(i)] for i in ids], dtype=bool)
        if not np.array_equal(hit, want):
            raise AssertionError(f"rank {rank}: iteration {t}: hit flags {hit.astype(int)} differ from the "
                                 f"reference's {want.astype(int)}")
    if evictions == 0 or not any(h.any() for h in got):
        raise AssertionError(f"rank {rank}: no eviction or no hit in the reference; the test is too easy")


def growing_batches(rank, world, num_nodes):
    """:func:`reference_batches` with sizes that jump up and down (the segments must grow, in both parities, and
    a smaller batch after a larger one reuses them) and every rank's ids owned by one rank in one batch."""
    rng = np.random.default_rng([23, rank])
    batches = reference_batches(rank, world, num_nodes, 12)
    batches[1] = rng.integers(0, num_nodes, 20)
    batches[2] = rng.integers(0, num_nodes, 2500)
    batches[4] = rng.integers(0, num_nodes, 6000)  # over the node count: every id, some many times
    batches[6] = np.arange(1, num_nodes, world)    # everyone's ids owned by rank 1
    return batches


def shm_matches_collective(ds, rank, world, out):
    """Rows through shared memory and through the rows collective, side by side over the same batches (random,
    adversarial, growing) with windows and ``following``: the same bytes as an isolated cache's (the file's)
    and the same hit flags, each lookup; the segments grow, and are unlinked once mapped and at close."""
    from lsm_gnn.cache import replay
    from lsm_gnn.comm import shm

    config = dict(num_sets=2, ways=32, policy="hybrid", window=4, oversubscribe=True)
    owner = ModuloOwner(world)
    paths = {name: SharedCache(SoftwareCache(open_storage(ds, "memory"), **config), owner, timeout_s=60,
                               exchange=name) for name in ("shm", "collective")}
    assert paths["shm"].exchange == "shm" and paths["collective"].exchange == "collective"
    isolated = SoftwareCache(open_storage(ds, "memory"), num_sets=64, ways=64, oversubscribe=True)
    mine = growing_batches(rank, world, ds.num_nodes)
    segments = paths["shm"]._shm
    token = segments.tokens[rank]

    def named():  # this rank's segments still in /dev/shm
        return sorted(f for f in os.listdir(shm.SHM_DIR) if f.startswith(f"{shm.PREFIX}-{token}-"))

    generations, hits, requests = [], 0, 0
    for t, (ids, future) in enumerate(replay(mine, 4, ds.num_nodes)):  # one window, read by both paths
        following = (mine[t + 1], mine[t + 5:t + 6]) if t + 1 < len(mine) else None
        found = {name: p.lookup(ids, future=future, following=following) for name, p in paths.items()}
        want, _ = isolated.lookup(torch.as_tensor(ids))
        for name, (rows, hit) in found.items():
            if not torch.equal(rows.view(torch.uint8), want.view(torch.uint8)) or hit.shape != (len(ids),):
                raise AssertionError(f"rank {rank}: iteration {t}: {name} rows differ from the isolated cache's")
        if not torch.equal(found["shm"][1], found["collective"][1]):
            raise AssertionError(f"rank {rank}: iteration {t}: hit flags differ between the two paths")
        hits, requests = hits + int(found["shm"][1].sum()), requests + len(ids)
        generations.append(segments.generation)
        files = [f for f in named() if "-for" not in f]  # (a requester's own name goes once it mapped)
        if len(files) > 2:  # the files of this lookup at most: the earlier ones every rank has mapped
            raise AssertionError(f"rank {rank}: iteration {t}: files still named: {named()}")
    if not 0 < hits < requests:
        raise AssertionError(f"rank {rank}: {hits} hits of {requests}: the hit flags prove nothing")
    if generations[-1] < 3 or generations[0] > 2:  # both parities made, and then grown
        raise AssertionError(f"rank {rank}: the segments did not grow: generations {generations}")
    if paths["shm"].stats.collectives != paths["collective"].stats.collectives:
        raise AssertionError("the shared-memory path made other collectives than the rows collective's")
    dist.barrier()
    paths["shm"].close()
    if named():
        raise AssertionError(f"rank {rank}: files left after close: {named()}")
    slow_reader(ds, rank, world)


def shm_cache(ds, world):
    """A small shared cache whose rows go through /dev/shm."""
    return SharedCache(SoftwareCache(open_storage(ds, "memory"), num_sets=2, ways=32, oversubscribe=True),
                       ModuloOwner(world), timeout_s=60, exchange="shm")


def map_late(shared, seconds: float) -> None:
    """This rank maps every owner's segment ``seconds`` late (after the rows collective, before the copy)."""
    import time

    peer = shared._shm.peer

    def late(*args):
        time.sleep(seconds)
        return peer(*args)

    shared._shm.peer = late


def slow_reader(ds, rank, world):
    """Rank 1 copies its rows from the owners' segments late, while rank 0 runs on to its next lookup (sent
    ahead with ``following``) and serves it: into the other segment, so rank 1 still reads the rows it asked."""
    expected = torch.from_numpy(ds.read_features_direct(np.arange(ds.num_nodes)))
    shared = shm_cache(ds, world)
    if rank == 1:
        map_late(shared, 0.05)
    batches = [np.random.default_rng([t, rank]).integers(0, ds.num_nodes, 300) for t in range(8)]
    for t, ids in enumerate(batches):
        rows, _ = shared.lookup(ids, following=(batches[t + 1], []) if t + 1 < len(batches) else None)
        if not torch.equal(rows, expected[ids]):
            raise AssertionError(f"rank {rank}: lookup {t}: rows overwritten before this rank read them")


def owner_gone_before_reader_maps(ds, rank, world, out):
    """Rank 0's last lookup grows its segment, and rank 0 drops its cache (its files unlinked) as soon as that
    lookup returns, while rank 1 is slow to map the new segment: rank 1 still reads the rows it asked for, and
    no file of either rank is left once both are done."""
    import gc

    from lsm_gnn.comm import shm

    expected = torch.from_numpy(ds.read_features_direct(np.arange(ds.num_nodes)))
    shared = shm_cache(ds, world)
    tokens = shared._shm.tokens
    for t in range(3):
        shared.lookup(np.random.default_rng([t, rank]).integers(0, ds.num_nodes, 50))
    if rank == 1:
        map_late(shared, 0.3)
    every = np.arange(ds.num_nodes)  # each owner serves half the graph: every segment grows
    rows, _ = shared.lookup(every)
    if not torch.equal(rows, expected):
        raise AssertionError(f"rank {rank}: the last lookup's rows differ from the file's")
    if rank == 0:
        del shared, rows
        gc.collect()  # the owner's files unlinked now, before rank 1 mapped its new segment
    else:
        shared.close()
    dist.barrier()
    left = [f for f in os.listdir(shm.SHM_DIR) if any(f.startswith(f"{shm.PREFIX}-{t}-") for t in tokens)]
    if left:
        raise AssertionError(f"rank {rank}: files left: {left}")


def exchange_choice(ds, rank, world, out):
    """``auto`` falls back to the rows collective, with no error, when the ranks do not share /dev/shm (here
    each rank has a directory of its own) or it has too little free; ``shm`` raises on every rank without a
    shared /dev/shm, as do ranks that ask for different exchanges."""
    from lsm_gnn.comm import shm

    expected = torch.from_numpy(ds.read_features_direct(np.arange(ds.num_nodes)))
    cache = SoftwareCache(open_storage(ds, "memory"), num_sets=4, ways=32, oversubscribe=True)
    real = shm.SHM_DIR
    shm.SHM_DIR = os.path.join(out, f"shm{rank}")
    os.makedirs(shm.SHM_DIR, exist_ok=True)
    shared = SharedCache(cache, ModuloOwner(world), timeout_s=60, exchange="auto")
    assert shared.exchange == "collective", shared.exchange
    ids = np.arange(rank, 500, 2)
    assert torch.equal(shared.lookup(ids)[0], expected[ids])
    try:
        SharedCache(cache, ModuloOwner(world), timeout_s=60, exchange="shm")
    except ValueError as exc:
        assert "cannot read rank" in str(exc) and "use auto or collective" in str(exc), exc
    else:
        raise AssertionError("exchange=shm was granted without a shared /dev/shm")
    shm.SHM_DIR = os.path.join(out, "absent")  # no file can be made there, as in a read-only /dev/shm
    try:
        SharedCache(cache, ModuloOwner(world), timeout_s=60, exchange="shm")
    except ValueError as exc:
        assert f"needs a writable {shm.SHM_DIR}: rank 0" in str(exc) and "cache.exchange=collective" in str(exc), exc
    else:
        raise AssertionError("exchange=shm was granted where no rank can write")
    shm.SHM_DIR = real
    shm.AUTO_MIN_FREE = 1 << 60  # more than /dev/shm has free: auto declines, shm is still granted
    assert SharedCache(cache, ModuloOwner(world), timeout_s=60).exchange == "collective"
    assert SharedCache(cache, ModuloOwner(world), timeout_s=60, exchange="shm").exchange == "shm"
    try:
        SharedCache(cache, ModuloOwner(world), timeout_s=60, exchange="shm" if rank == 0 else "collective")
    except ValueError as exc:
        assert "different exchanges" in str(exc), exc
    else:
        raise AssertionError("ranks asking for different exchanges were accepted")


def announce_misuse(ds, rank, world, out):
    """A lookup other than the one announced (``following``) is refused on every rank; settle() drops the
    announcement and the cache serves on; an announced lookup gets its rows whatever the order and repeats of
    its ids, with only the rows collective left to make."""
    expected = torch.from_numpy(ds.read_features_direct(np.arange(ds.num_nodes)))
    shared = SharedCache(SoftwareCache(open_storage(ds, "memory"), num_sets=4, ways=32, oversubscribe=True),
                         ModuloOwner(world), timeout_s=60)
    ids = np.arange(rank, 300, 3)
    shared.lookup(ids, following=(np.arange(10), []))
    try:
        shared.lookup(np.arange(11))
    except ValueError as exc:
        assert "11 distinct ids, not the 10 announced" in str(exc) and "settle()" in str(exc), exc
    else:
        raise AssertionError("a lookup other than the announced one was served")
    shared.settle()
    rows, _ = shared.lookup(ids, following=(ids[::-1], []))
    assert torch.equal(rows, expected[ids])
    asked = np.concatenate([ids, ids[:7]])
    before = shared.stats.collectives
    rows, _ = shared.lookup(asked)
    assert torch.equal(rows, expected[asked]) and shared.stats.collectives - before == 1  # the rows only
    assert shared.stats.announced == 2
    # A wrong out is refused before any collective on every rank, and the cache serves on.
    before = shared.stats.collectives
    try:
        shared.lookup(ids, out=torch.empty((ids.size + 1, ds.feature_dim)))
    except ValueError as exc:
        assert "out must be a contiguous" in str(exc) and f"({ids.size}, {ds.feature_dim})" in str(exc), exc
    else:
        raise AssertionError("a wrong out was taken")
    assert shared.stats.collectives == before
    out = torch.empty((ids.size, ds.feature_dim), dtype=expected.dtype)
    rows, _ = shared.lookup(ids, out=out)
    assert rows.data_ptr() == out.data_ptr() and torch.equal(out, expected[ids])


def write_back(ds, rank, world, out):
    """Every rank looks up and changes random rows each iteration; owners apply the changes. Every lookup must
    return the rows a dense table given every rank's changes holds, and after a flush each owner's storage too."""
    num, dim = ds.num_nodes, ds.feature_dim
    reference = torch.from_numpy(ds.read_features_direct(np.arange(num)))
    storage = open_storage(ds, "memory")  # writable, in this process only: each owner writes its own rows
    cache = SoftwareCache(storage, num_sets=5, ways=32, policy="farthest", window=4, pvp=True,
                          pvp_queue_capacity=16)
    shared = SharedCache(cache, ModuloOwner(world), timeout_s=60)
    streams = [np.random.default_rng([7, r]) for r in range(world)]  # every rank replays every rank's draws
    iterations, window = 30, 4
    batches = [[np.unique(s.integers(0, num, 120)) for s in streams] for _ in range(iterations + window)]
    future = WindowBuffer(window, num)
    for t in range(window):
        future.push(torch.from_numpy(batches[t][rank]))
    for t in range(iterations):
        future.pop()
        future.push(torch.from_numpy(batches[t + window][rank]))
        rows, _ = shared.lookup(torch.from_numpy(batches[t][rank]), future)
        if not torch.equal(rows, reference[batches[t][rank]]):
            raise AssertionError(f"rank {rank}: iteration {t} read a row without every rank's earlier changes")
        grads = [torch.from_numpy(np.random.default_rng([t, r]).standard_normal((batches[t][r].size, dim))
                                  .astype(np.float32)) for r in range(world)]
        shared.update(torch.from_numpy(batches[t][rank]), grads[rank], lambda old, g: old + g)
        total = torch.zeros_like(reference)
        for r in range(world):  # summed in rank order, as the owner sums
            total.index_add_(0, torch.from_numpy(batches[t][r]), grads[r])
        reference += total
    shared.flush()
    mine = np.flatnonzero(np.arange(num) % world == rank)
    if not torch.equal(storage.read(torch.from_numpy(mine)), reference[mine]):
        raise AssertionError(f"rank {rank}: after flush its rows on storage differ from every rank's changes")
    if cache.stats.written_back == 0:
        raise AssertionError(f"rank {rank}: no dirty line was ever evicted; the test is too easy")


def nccl_rule(ds, rank, world, out):
    """The exchange on device-mode tensors under NCCL's ordering rule (tests/test_nccl_rule.py), its rows checked."""
    import pytest
    from test_nccl_rule import UPDATED, device_shared_cache, exchanges_under_the_rule

    expected = torch.from_numpy(ds.read_features_direct(np.arange(ds.num_nodes)))
    with pytest.MonkeyPatch.context() as monkeypatch, \
            device_shared_cache(ds, monkeypatch, ModuloOwner(world)) as (shared, rec):
        for k, (ids, rows) in enumerate(exchanges_under_the_rule(shared, rec, rank)):
            if k == 2:  # after every rank added 1 to the rows of UPDATED
                expected[UPDATED] += world
            if not torch.equal(rows, expected[ids]):
                raise AssertionError(f"rank {rank}: lookup {k}: the rows of {ids.tolist()} differ from the file's")


def main():
    scenario, path, out = sys.argv[1:4]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    if scenario == "protocol":
        protocol(path, rank, world, out)
        dist.barrier()
        dist.destroy_process_group()
        return
    ds = open_dataset(path)
    scenarios = {"correctness": correctness, "hit_ratios": hit_ratios, "killed": killed, "write_back": write_back,
                 "reference": reference, "announce_misuse": announce_misuse,
                 "owner_gone_before_reader_maps": owner_gone_before_reader_maps,
                 "shm_matches_collective": shm_matches_collective, "exchange_choice": exchange_choice, "nccl_rule": nccl_rule}
    scenarios[scenario](ds, rank, world, out)
    if scenario != "killed":
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
