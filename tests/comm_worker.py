"""One rank of a multi-process test of the communication layer (run by tests/test_comm.py).

    python tests/comm_worker.py SCENARIO DATASET OUT_DIR   (RANK, WORLD_SIZE, MASTER_* in the environment)
"""
import json
import os
import sys
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from lsm_gnn import open_dataset, open_storage
from lsm_gnn.cache import SoftwareCache
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
    loader = make_loader(ds, shared, rank, world)
    for _ in range(2):
        for batch in loader:
            if not torch.equal(batch.x, expected[batch.input_nodes]):
                raise AssertionError(f"rank {rank}: batch {batch.iteration} differs from the feature file")
            requested.append(np.unique(batch.input_nodes.numpy()))
            served.append(shared.last_served)
            assert "exchange" in batch.timings
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
    try:
        for batch in make_loader(ds, shared, rank, world):
            if rank == 1 and batch.iteration == 2:
                os._exit(3)  # dies without a word, as a crashed process does
    except ExchangeError as exc:
        with open(os.path.join(out, f"rank{rank}.txt"), "w") as fh:
            fh.write(str(exc))
        return
    raise AssertionError(f"rank {rank} finished the epoch although rank 1 died")


def main():
    scenario, path, out = sys.argv[1:4]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = open_dataset(path)
    {"correctness": correctness, "hit_ratios": hit_ratios, "killed": killed}[scenario](ds, rank, world, out)
    if scenario != "killed":
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
