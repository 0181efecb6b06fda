"""The CPU cache's per-batch work on mixed batches, and the memory its read-ahead adds.

Two measurements over a power-law trace (about 40% hits with a 10% cache), one process each:

- ``lookup``: milliseconds per :meth:`SoftwareCache.lookup` (median after a warm-up) and of its native
  assignment (hits, victims, installs: ``CacheState.assign``), with the rows in the page cache (mmap
  backend) so the figure is the cache's own work, not the disk's.
- ``read-ahead``: the same lookups with read-ahead on (``--read-ahead-bytes``), through io_uring: ms per
  lookup and how much the process's resident memory grew over the run.

Compare two builds by running this from each checkout in turn (``PYTHONPATH=<checkout>``), interleaved:

    python benchmarks/lookup_cpu.py --json OUT.json
    python benchmarks/lookup_cpu.py --dim 1024 --num-nodes 100000 --batch 8000 --read-ahead-bytes 4M
"""
from __future__ import annotations

import argparse
import os
import resource
import time

import numpy as np
import torch

from lsm_gnn import open_dataset, open_storage
from lsm_gnn.cache import SoftwareCache
from lsm_gnn.cache.window import replay
from lsm_gnn.testing import power_law_trace, write_tiny_dataset
from lsm_gnn.testing.benchmarking import write_json


def resident_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def run(dataset, trace, backend: str, capacity: float, warmup: int, **cache_options) -> dict:
    """Looks up every batch of ``trace`` in a cache of ``capacity`` of the nodes; times after ``warmup``."""
    with open_storage(dataset, backend=backend) as storage:
        cache = SoftwareCache(storage, capacity=max(1, int(capacity * dataset.num_nodes)) * storage.row_bytes,
                              **cache_options)
        assign_seconds = []
        assign = cache.state.assign

        def timed_assign(*args, **kwargs):
            start = time.perf_counter()
            try:
                return assign(*args, **kwargs)
            finally:
                assign_seconds.append(time.perf_counter() - start)

        cache.state.assign = timed_assign
        before = resident_mib()
        lookups = []
        for ids, future in replay(trace, cache.policy.window, num_nodes=dataset.num_nodes):
            start = time.perf_counter()
            cache.lookup(ids, future=future)
            lookups.append(time.perf_counter() - start)
        grown = resident_mib() - before
        cache.settle()
        return {"ms_per_lookup": 1e3 * float(np.median(lookups[warmup:])),
                "assign_ms": 1e3 * float(np.median(assign_seconds[warmup:])),
                "hit_ratio": cache.stats.hit_ratio, "resident_growth_mib": grown,
                "read_ahead": None if cache.read_ahead is None else vars(cache.read_ahead.stats)}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-nodes", type=int, default=300_000)
    p.add_argument("--dim", type=int, default=64, help="float32 features per row")
    p.add_argument("--batch", type=int, default=30_000, help="ids per batch (with repeats)")
    p.add_argument("--lookups", type=int, default=300)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--capacity", type=float, default=0.10, help="cached share of the nodes")
    p.add_argument("--read-ahead-bytes", default="64M")
    p.add_argument("--threads", type=int, default=1, help="torch's and the cache's threads")
    p.add_argument("--data-dir", default=os.environ.get("LSM_GNN_BENCH_DATA", "/tmp/lsm-gnn-bench"))
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.warmup >= args.lookups:
        p.error(f"--warmup ({args.warmup}) must be below --lookups ({args.lookups})")
    torch.set_num_threads(args.threads)
    path = os.path.join(args.data_dir, f"lookup-cpu-{args.num_nodes}-f{args.dim}")
    if not os.path.exists(os.path.join(path, "meta.json")):
        write_tiny_dataset(path, num_nodes=args.num_nodes, dim=args.dim)
    dataset = open_dataset(path)
    trace = power_law_trace(0, args.lookups, args.batch, args.num_nodes, skew=0.9)
    results = {"lookup": run(dataset, trace, "mmap", args.capacity, args.warmup, read_ahead=0,
                             num_threads=args.threads),
               "read-ahead": run(dataset, trace, "io_uring", args.capacity, args.warmup, read_ahead=2,
                                 read_ahead_bytes=args.read_ahead_bytes, num_threads=args.threads)}
    results["max_resident_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for name in ("lookup", "read-ahead"):
        r = results[name]
        print(f"{name:10s} {r['ms_per_lookup']:7.2f} ms/lookup  assign {r['assign_ms']:6.2f} ms  "
              f"hit {r['hit_ratio']:.3f}  resident +{r['resident_growth_mib']:.1f} MiB")
    if args.json:
        write_json(args.json, {"args": vars(args), **results})
    return results


if __name__ == "__main__":
    main()
