"""One rank of the multi-process PVP test (run by tests/test_pvp.py): a SharedCache over
victim-buffered slices returns the file's bytes for every policy.

    python tests/pvp_worker.py DATASET OUT_DIR   (RANK, WORLD_SIZE, MASTER_* in the environment)
"""
import json
import os
import sys
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from lsm_gnn import open_dataset, open_storage
from lsm_gnn.cache import POLICIES, SoftwareCache
from lsm_gnn.comm import ModuloOwner, SharedCache
from lsm_gnn.loader import NodeLoader


def main():
    path, out = sys.argv[1:3]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = open_dataset(path)
    expected = torch.from_numpy(ds.read_features_direct(np.arange(ds.num_nodes)))
    static = np.diff(np.asarray(ds.indptr)).astype(np.float64)
    results = {}
    for policy in POLICIES:
        cache = SoftwareCache(open_storage(ds, "memory"), num_sets=4, ways=32, policy=policy, window=8, period=2,
                              static_scores=static, oversubscribe=True, pvp=True, pvp_queue_capacity=16)
        shared = SharedCache(cache, ModuloOwner(world), timeout_s=60)
        loader = NodeLoader(ds, shared, [4, 3], 64, window=8, rank=rank, world_size=world, seed=0)
        for batch in loader:
            if not torch.equal(batch.x, expected[batch.input_nodes]):
                raise AssertionError(f"rank {rank}, {policy}: batch {batch.iteration} differs from the feature file")
        v = cache.pvp.stats
        assert v.prefetched > 0  # the loader asked the shared cache, which asked this rank's slice
        assert v.enqueued == v.hits + v.unused + cache.pvp.pending, v
        results[policy] = {"pvp_hits": v.hits, "unused": v.unused, "misses": cache.stats.misses}
    with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
        json.dump(results, fh)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
