"""PVP's CPU cost per lookup: sampled batches replayed through ``SoftwareCache.lookup`` over the in-memory
table, with and without the victim buffer, on one thread.

With the storage in memory a miss costs a copy, so the difference between the runs is the victim buffer's
own work (enqueue, fill, bookkeeping), not saved reads. The batches are those of ``end_to_end.py``'s
setup (GraphSAGE fanouts 10,5, batch 256 seeds from the training split, window 32) on its generated graph.
Each mode is one line: ``off:<policy>`` or ``pvp:<policy>`` (queues of ``--pvp-queue-bytes``). Rounds
alternate the modes; the figure is the median over rounds of each round's median ms per lookup (the
first ``--skip`` lookups, the cache filling, left out).

    python benchmarks/end_to_end.py --methods memory --iterations 5 --repeats 1   # generates the graph once
    python benchmarks/pvp_cost.py --modes off:farthest,pvp:farthest,pvp:hybrid_pvp_room --rounds 3
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch

from lsm_gnn.cache.software_cache import SoftwareCache
from lsm_gnn.cache.window import WindowBuffer
from lsm_gnn.data import open_dataset
from lsm_gnn.sampling import OneTypeSampler
from lsm_gnn.storage import open_storage
from lsm_gnn.testing.benchmarking import machine_info, write_json


def sample_batches(ds, count: int, fanouts, batch_size: int, seed: int = 0) -> list[torch.Tensor]:
    sampler = OneTypeSampler(ds, fanouts, seed=seed)
    rng = np.random.default_rng(seed)
    train = np.asarray(ds.split("train"))
    return [sampler.input_nodes(torch.from_numpy(rng.choice(train, batch_size, replace=False)), i)
            for i in range(count)]


def replay(storage, scores, batches, mode: str, args) -> dict:
    """One run of ``len(batches) - window - 1`` lookups in ``mode``; per-lookup seconds and the counters."""
    kind, _, policy = mode.partition(":")
    if kind not in ("off", "pvp") or not policy:
        raise SystemExit(f"a mode is off:<policy> or pvp:<policy>, got {mode!r}")
    pvp = kind == "pvp"
    cache = SoftwareCache(storage, capacity=int(args.capacity * storage.num_rows) * storage.row_bytes,
                          policy=policy, window=args.window, static_scores=scores, pvp=pvp,
                          pvp_queue_bytes=args.pvp_queue_bytes if pvp else None, num_threads=1)
    window = WindowBuffer(args.window, storage.num_rows)
    for batch in batches[1:args.window + 1]:
        window.push(batch)
    seconds = []
    for i in range(len(batches) - args.window - 1):
        start = time.perf_counter()
        cache.lookup(batches[i], future=window)
        seconds.append(time.perf_counter() - start)
        window.pop()
        window.push(batches[i + args.window + 1])
        cache.prefetch()  # what the loader does after each batch
    s = cache.stats
    return {"ms_median": 1e3 * statistics.median(seconds[args.skip:]),
            "ms_mean": 1e3 * statistics.mean(seconds[args.skip:]), "hit_ratio": s.hit_ratio,
            "combined_hit_ratio": s.combined_hit_ratio, "pvp_hits": s.pvp_hits, "misses": s.misses,
            "pvp": cache.pvp.stats.as_dict() if cache.pvp is not None else None}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="/tmp/lsm-gnn-bench/e2e", help="a graph end_to_end.py generated")
    p.add_argument("--modes", default="off:farthest,pvp:farthest")
    p.add_argument("--capacity", type=float, default=0.1, help="cache size, a share of the nodes")
    p.add_argument("--pvp-queue-bytes", default="25%")
    p.add_argument("--lookups", type=int, default=300)
    p.add_argument("--skip", type=int, default=60, help="first lookups left out (the cache filling)")
    p.add_argument("--window", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=256, help="seeds per batch")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    ds = open_dataset(args.data)
    storage = open_storage(ds, "memory")
    scores = ds.score("reverse_pagerank")
    batches = sample_batches(ds, args.lookups + args.window + 1, [10, 5], args.batch_size)
    modes = args.modes.split(",")
    runs = {mode: [] for mode in modes}
    for r in range(args.rounds):
        for mode in modes:
            result = replay(storage, scores, batches, mode, args)
            runs[mode].append(result)
            print(f"round {r} {mode:<24} {result['ms_median']:.3f} ms/lookup (median), hit {result['hit_ratio']:.3f}, "
                  f"pvp hits {result['pvp_hits']}, misses {result['misses']}", file=sys.stderr, flush=True)
    summary = {mode: {"ms_per_lookup": statistics.median(x["ms_median"] for x in rs), **{
        k: rs[0][k] for k in ("hit_ratio", "combined_hit_ratio", "pvp_hits", "misses", "pvp")}}
        for mode, rs in runs.items()}
    for mode, s in summary.items():
        print(f"{mode:<24} {s['ms_per_lookup']:.3f} ms per lookup   combined hit {s['combined_hit_ratio']:.3f}   "
              f"pvp hits {s['pvp_hits']:,}   misses {s['misses']:,}")
    result = {"config": vars(args), "machine": machine_info(), "runs": runs, "summary": summary}
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
