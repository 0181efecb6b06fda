"""Cache lookup throughput: all-hit and all-miss batches, beside the memory copy limit.

Hits are compared with the bandwidth of a plain memcpy of the same bytes
(torch ``copy_`` of one contiguous buffer into another) and with a bare
gather (``index_select`` of the same rows with no cache logic): the hit path
cannot beat memcpy, and the gap to the gather is the cost of the cache's
bookkeeping. Misses are measured over the in-memory storage (the cost of the
cache itself) and over io_uring (the real miss path). Medians of
``--repeats`` runs, all in one process so the ratios share one machine state.

    python benchmarks/cache_throughput.py
    python benchmarks/cache_throughput.py --quick
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

from lsm_gnn.testing.benchmarking import median_seconds, reusable_dataset, write_json
from lsm_gnn import open_storage
from lsm_gnn.cache import SoftwareCache
from lsm_gnn.data import DatasetWriter
from lsm_gnn.utils.ids import unique_ids


def make_dataset(path: str, num_nodes: int, dim: int):
    ds = reusable_dataset(path, num_nodes=num_nodes, feature_dim=dim)
    if ds is not None:
        return ds
    print(f"writing {num_nodes:,} rows of {dim * 4} B to {path} ...", file=sys.stderr)
    with DatasetWriter(path, num_nodes=num_nodes, feature_dim=dim, overwrite=True) as w:
        chunk = max(1, (64 << 20) // (dim * 4))
        for start in range(0, num_nodes, chunk):
            rows = np.arange(start, min(start + chunk, num_nodes), dtype=np.float32)[:, None] + \
                np.zeros((1, dim), np.float32)
            w.write_features(rows)
        w.write_csr(np.zeros(num_nodes + 1, np.int64), np.zeros(0, np.int64))
        return w.commit()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--row-bytes", type=int, default=4096)
    parser.add_argument("--num-nodes", type=int, default=400_000)
    parser.add_argument("--cache-rows", type=int, default=131072)
    parser.add_argument("--batch", type=int, default=65536)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--policy", default="hybrid")
    parser.add_argument("--data-dir", default=os.environ.get("LSM_GNN_BENCH_DATA", "/work/bench-data"))
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.num_nodes, args.cache_rows, args.batch, args.repeats = 8192, 2048, 1024, 2
    dim = args.row_bytes // 4
    os.makedirs(args.data_dir, exist_ok=True)
    ds = make_dataset(os.path.join(args.data_dir, f"throughput-{args.num_nodes}-{args.row_bytes}B"), args.num_nodes,
                      dim)
    gen = torch.Generator().manual_seed(0)
    batch_bytes = args.batch * args.row_bytes
    results = {"config": vars(args).copy(), "threads": torch.get_num_threads()}

    # Physical limit: one contiguous copy of the same number of bytes.
    src = torch.randn(args.batch, dim)
    dst = torch.empty_like(src)
    results["memcpy_gbps"] = batch_bytes / median_seconds(lambda: dst.copy_(src), args.repeats) / 1e9

    memory = open_storage(ds, "memory")
    cache = SoftwareCache(memory, capacity=args.cache_rows * args.row_bytes, policy=args.policy)
    hot = torch.randperm(args.num_nodes, generator=gen)[:args.batch]
    cache.lookup(hot)  # fill
    order = hot[torch.randperm(hot.numel(), generator=gen)]
    check, hit = cache.lookup(order)
    if not torch.equal(check[:, 0], order.float()):  # row i holds the value i in every column
        raise AssertionError("cache returned wrong rows")
    if not bool(hit.all()):  # hashing can overflow a set; report instead of hiding it
        print(f"note: {int((~hit).sum())} of {hit.numel()} hot ids are not resident", file=sys.stderr)
    hit_before = cache.stats.hits
    rows_out = torch.empty(args.batch, dim)  # reused, like the memcpy destination
    hit_seconds = median_seconds(lambda: cache.lookup(order, out=rows_out), args.repeats)
    results["hit_fraction_timed"] = (cache.stats.hits - hit_before) / ((args.repeats + 1) * args.batch)
    results["hit_lookups_per_s"] = args.batch / hit_seconds
    results["hit_gbps"] = batch_bytes / hit_seconds / 1e9

    table = memory._rows
    out = torch.empty(args.batch, dim)
    results["gather_gbps"] = batch_bytes / median_seconds(lambda: torch.index_select(table, 0, order, out=out),
                                                 args.repeats) / 1e9

    # The lookup's metadata per id, timed alone on the same all-hit batch: deduplication, then the
    # native assign (tags compared in each id's set, hits marked); the rest of a lookup moves rows.
    unique, _ = unique_ids(order)
    dedup_s = median_seconds(lambda: unique_ids(order), args.repeats)
    assign_s = median_seconds(lambda: cache.state.assign(unique, cache.node_static, cache.policy, cache.iteration,
                                                         cache.scan_base), args.repeats)
    results["metadata_ns_per_id"] = {"dedup": dedup_s / args.batch * 1e9, "assign": assign_s / args.batch * 1e9,
                                     "lookup_minus_bare_gather": (hit_seconds - batch_bytes / results["gather_gbps"]
                                                                  / 1e9) / args.batch * 1e9}

    def miss_run(storage):
        c = SoftwareCache(storage, capacity=args.cache_rows * args.row_bytes, policy=args.policy)
        perm = torch.randperm(args.num_nodes, generator=gen)
        batches = iter(perm.split(args.batch))

        def once():
            ids = next(batches, None)
            if ids is None or ids.numel() < args.batch:
                raise RuntimeError("not enough distinct nodes for all-miss batches; raise --num-nodes")
            c.lookup(ids, out=rows_out)
        seconds = median_seconds(once, args.repeats)
        assert c.stats.hits == 0
        return seconds

    results["miss_memory_lookups_per_s"] = args.batch / miss_run(memory)
    results["miss_memory_gbps"] = results["miss_memory_lookups_per_s"] * args.row_bytes / 1e9
    with open_storage(ds, "io_uring") as ssd:
        results["miss_io_uring_lookups_per_s"] = args.batch / miss_run(ssd)
    results["miss_io_uring_gbps"] = results["miss_io_uring_lookups_per_s"] * args.row_bytes / 1e9
    results["hit_over_memcpy"] = results["hit_gbps"] / results["memcpy_gbps"]
    results["hit_over_gather"] = results["hit_gbps"] / results["gather_gbps"]

    print(f"\ncache throughput, {args.row_bytes} B rows, batch {args.batch}, cache {args.cache_rows} rows, "
          f"{results['threads']} threads, median of {args.repeats}")
    print(f"{'path':<26}{'lookups/s':>14}{'GB/s':>9}{'x memcpy':>10}")
    print(f"{'memcpy (limit)':<26}{'':>14}{results['memcpy_gbps']:>9.2f}{1.0:>10.2f}")
    print(f"{'bare gather':<26}{'':>14}{results['gather_gbps']:>9.2f}"
          f"{results['gather_gbps'] / results['memcpy_gbps']:>10.2f}")
    for name, key in (("all hit", "hit"), ("all miss (memory)", "miss_memory"), ("all miss (io_uring)", "miss_io_uring")):
        gbps = results[f"{key}_gbps"]
        print(f"{name:<26}{results[f'{key}_lookups_per_s']:>14,.0f}{gbps:>9.2f}{gbps / results['memcpy_gbps']:>10.2f}")
    meta = results["metadata_ns_per_id"]
    print(f"lookup metadata per id (all hit): dedup {meta['dedup']:.1f} ns, assign {meta['assign']:.1f} ns; "
          f"lookup minus bare gather {meta['lookup_minus_bare_gather']:.1f} ns")
    if args.json:
        write_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
