"""The communication layer: a shared cache over ranks vs private (isolated) caches.

For 2 and 4 ranks (CPU processes over gloo) and three per-rank cache sizes,
every rank iterates the same sampled mini-batches through (a) a shared
cache of C per rank, (b) isolated caches of C per rank (the M-GIDS
baseline) and (c) isolated caches of N x C per rank (the paper's Figure 9
question: does sharing match a private cache N times larger?). Reported:
global hit ratio (over every rank's distinct requests), bytes read from
storage by all ranks, the exchange's share of the gather time (the paper:
under 5%) with its breakdown (each collective, the owner's lookup, packing,
the window; a bare all_to_all of the rows' bytes for the transport alone),
and aggregate gather throughput (input rows per second of gather time, all
ranks). ``--merged`` adds one cache of N x C fed the union of the ranks'
batches: the bound for any ownership. Commands and figures (4-byte and
4 KiB rows): docs/benchmarks/distributed.md, "Communication layer".

    python benchmarks/comm_layer.py                    # ~20 min on 2 cores
    python benchmarks/comm_layer.py --quick

``--exchanges shm,collective --repeats 3`` runs the shared cache once per
way its rows travel (shared memory, the rows collective), interleaved within
each repeat, and reports each one's medians.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import time

from lsm_gnn.testing.benchmarking import write_json

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def worker(args) -> None:
    """One rank: iterate the loader, write counters to OUT/rank<r>.json."""
    from datetime import timedelta

    import numpy as np
    import torch
    import torch.distributed as dist

    from lsm_gnn import open_dataset, open_storage
    from lsm_gnn.cache import SoftwareCache
    from lsm_gnn.comm import SharedCache, make_owner
    from lsm_gnn.config import cache_capacity_bytes
    from lsm_gnn.loader import NodeLoader
    from lsm_gnn.sampling import sampled_access_counts

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = open_dataset(args.data, check="shape")
    # --buffered: misses read through the page cache (the file fits in RAM), so a lookup's time is CPU work
    # and timing runs do not swing with the disk's latency
    storage = open_storage(ds, "io_uring", direct=not args.buffered)
    capacity = cache_capacity_bytes(args.capacity, ds.num_nodes, storage.row_bytes)
    cache = SoftwareCache(storage, capacity, policy=args.policy, window=args.window,
                          static_scores=ds.score("reverse_pagerank"), oversubscribe=True)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    owner = make_owner(args.owner, ds, world,
                       access_counts=lambda: sampled_access_counts(ds, fanouts, args.batch_size))
    features = SharedCache(cache, owner, exchange=args.exchange) if args.mode == "shared" else cache
    loader = NodeLoader(ds, features, fanouts, args.batch_size,
                        window=args.window, rank=rank, world_size=world, seed=0)
    hits = requests = 0
    gather = exchange = 0.0
    dist.barrier()
    start = time.perf_counter()
    # Every rank's loader thread stops after the same gather: none waits in a collective the other never joins.
    for batch in loader.iterate(args.iterations if args.iterations < len(loader) else None):
        hits += int(batch.hit_mask.sum())
        requests += batch.hit_mask.numel()
        gather += batch.timings["gather"]
        exchange += batch.timings.get("exchange", 0.0)
        if batch.iteration + 1 >= args.iterations:
            break
    wall = time.perf_counter() - start
    loader.close()
    result = {"rank": rank, "hits": hits, "requests": requests, "gather_s": gather, "exchange_s": exchange,
              "wall_s": wall, "bytes_read": storage.stats().bytes_read, "iterations": batch.iteration + 1,
              "row_bytes": storage.row_bytes, "loadavg": os.getloadavg()}
    if args.mode == "shared":  # where the exchange's time goes: each collective, and the owner's lookup
        result["exchange"] = vars(features.stats)  # as_dict() where it exists; this also reads an older layer
        result["exchange"] = {k: v for k, v in result["exchange"].items() if isinstance(v, (int, float, dict))}
        result["rows_through"] = getattr(features, "exchange", "collective")
        result["bare_rows_all_to_all_s"] = bare_all_to_all(features, storage.row_bytes)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as fh:
        json.dump(result, fh)
    dist.barrier()
    dist.destroy_process_group()
    del np


def bare_all_to_all(shared, row_bytes: int, repeats: int = 9) -> float:
    """Median seconds of one all_to_all_single moving, between every pair of ranks, the bytes an iteration's
    rows collective moved on average: what the transport alone costs (ranks aligned by a barrier first)."""
    import torch
    import torch.distributed as dist

    s = shared.stats
    per_peer = torch.tensor([int(s.remote_requested / s.iterations / max(1, shared.world_size - 1)) * row_bytes])
    dist.all_reduce(per_peer, op=dist.ReduceOp.MAX, group=shared.group)  # every rank sends the same: the larger
    per_peer = int(per_peer)
    counts = [0 if r == shared.rank else per_peer for r in range(shared.world_size)]
    send = torch.zeros(sum(counts), dtype=torch.uint8)
    recv = torch.empty_like(send)
    times = []
    for _ in range(repeats):
        dist.barrier(group=shared.group)
        start = time.perf_counter()
        dist.all_to_all_single(recv, send, counts, counts, group=shared.group)
        times.append(time.perf_counter() - start)
    return sorted(times)[repeats // 2]


def run(args, world: int, mode: str, capacity: str, out: str, exchange: str = "auto") -> dict:
    os.makedirs(out, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = [sys.executable, __file__, "--worker", "--data", args.data, "--out", out, "--mode", mode,
               "--capacity", capacity, "--policy", args.policy, "--window", str(args.window), "--owner", args.owner,
               "--fanouts", args.fanouts, "--batch-size", str(args.batch_size), "--iterations", str(args.iterations),
               "--exchange", exchange,
               *(["--buffered"] if args.buffered else [])]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=3600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a rank failed ({world} ranks, {mode}, {capacity}):\n" + "\n".join(logs)[-4000:])
    ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(world)]
    gather = sum(r["gather_s"] for r in ranks)
    detail = {"ranks": ranks}
    if mode == "shared" and "collective_seconds" in ranks[0]["exchange"]:  # shares of all ranks' gather time
        kinds = sorted({k for r in ranks for k in r["exchange"]["collective_seconds"]})
        detail["share_of_gather"] = {f"{k} collective": sum(r["exchange"]["collective_seconds"][k] for r in ranks)
                                     / gather for k in kinds}
        detail["share_of_gather"]["serve (owner's lookup)"] = sum(r["exchange"]["serve_seconds"]
                                                                  for r in ranks) / gather
        for k in sorted({k for r in ranks for k in r["exchange"]["local_seconds"]}):
            detail["share_of_gather"][k] = sum(r["exchange"]["local_seconds"][k] for r in ranks) / gather
        accounted = sum(v for k, v in detail["share_of_gather"].items() if not k.startswith("serve"))
        detail["share_of_gather"]["other"] = sum(r["exchange"]["exchange_seconds"] for r in ranks) / gather - accounted
        detail["bare_rows_all_to_all_ms"] = 1000 * max(r["bare_rows_all_to_all_s"] for r in ranks)
        detail["rows_collective_ms"] = 1000 * max(r["exchange"]["collective_seconds"]["rows"] / r["iterations"]
                                                  for r in ranks)
        exchange = ranks[0]["exchange"]
        detail["collectives_per_iteration"] = exchange["collectives"] / exchange["iterations"]
        detail["lookups"] = exchange["iterations"]
        detail["rows_through"] = ranks[0]["rows_through"]
        # lookups whose request outgrew the agreed chunk (a third collective): 0 in a layer without chunks
        detail["spills"] = sum(n for k, n in exchange.get("collective_calls", {}).items()
                               if k.endswith("spill") and not k.startswith("update"))
    return {**detail, "loadavg_at_end": ranks[0]["loadavg"],
            "ms_per_gather": 1000 * gather / sum(r["iterations"] for r in ranks),
            "world": world, "mode": mode, "capacity_per_rank": capacity,
            "hit_ratio": sum(r["hits"] for r in ranks) / sum(r["requests"] for r in ranks),
            "bytes_read": sum(r["bytes_read"] for r in ranks),
            "exchange_share_of_gather": sum(r["exchange_s"] for r in ranks) / gather if gather else 0.0,
            "rows_per_gather_s": sum(r["requests"] for r in ranks) / max(r["gather_s"] for r in ranks),
            "wall_s": max(r["wall_s"] for r in ranks)}


def rank_batches(ds, fanouts: list[int], batch_size: int, world: int, iterations: int) -> list[list]:
    """The distinct input nodes of the first ``iterations`` batches of epoch 0 on each of ``world`` ranks, as
    the workers' loaders sample them (``[rank][iteration]``, sorted int64 arrays)."""
    import numpy as np

    from lsm_gnn import open_storage
    from lsm_gnn.loader import NodeLoader

    per_rank = []
    for rank in range(world):
        loader = NodeLoader(ds, open_storage(ds, "memory"), fanouts, batch_size, rank=rank, world_size=world, seed=0)
        plans = loader._epoch_plans(0)[:iterations]
        per_rank.append([np.unique(loader.sampler.input_nodes({loader.seed_type: loader._plan_nodes(p)}, k)
                                   [loader.seed_type].numpy()) for k, p in enumerate(plans)])
    return per_rank


def merged_hit_ratio(args, world: int, capacity: str) -> float:
    """One cache of ``capacity`` per rank x ``world`` serving the union of every rank's batch each iteration
    (in one process, same batches, policy and window): what a shared cache of that size could reach with any
    ownership, set mapping or window, since its slices together hold that many lines."""
    import numpy as np

    from lsm_gnn import open_dataset, open_storage
    from lsm_gnn.cache import SoftwareCache, replay
    from lsm_gnn.config import cache_capacity_bytes

    ds = open_dataset(args.data, check="shape")
    fanouts = [int(f) for f in args.fanouts.split(",")]
    # batches past the last measured iteration fill its window, as the workers' loaders sample them
    per_rank = rank_batches(ds, fanouts, args.batch_size, world, args.iterations + args.window)
    union = [np.unique(np.concatenate(batches)) for batches in zip(*per_rank)]
    storage = open_storage(ds, "memory")
    cache = SoftwareCache(storage, world * cache_capacity_bytes(capacity, ds.num_nodes, storage.row_bytes),
                          policy=args.policy, window=args.window, static_scores=ds.score("reverse_pagerank"),
                          oversubscribe=True)
    hits = total = 0
    for k, (ids, window) in enumerate(replay(union, args.window, ds.num_nodes)):
        if k == args.iterations:
            break
        _, hit = cache.lookup(ids, future=window)
        hit_ids = np.asarray(ids)[hit.numpy()]
        for batches in per_rank:
            hits += int(np.isin(batches[k], hit_ids, assume_unique=True).sum())
            total += batches[k].size
    return hits / total


def shared_medians(rows: list[dict]) -> list[dict]:
    """Per (ranks, capacity, exchange asked) of the shared runs, medians over the repeats: ms per gather, the
    exchange's ms and share of it, and each part of the breakdown in ms per gather; printed one line each."""
    out = []
    shared = [r for r in rows if r["mode"] == "shared"]
    for world, capacity, exchange in sorted({(r["world"], r["capacity_per_rank_base"], r["exchange_asked"])
                                             for r in shared}):
        runs = [r for r in shared if (r["world"], r["capacity_per_rank_base"], r["exchange_asked"]) ==
                (world, capacity, exchange)]
        ms = [r["ms_per_gather"] for r in runs]
        parts = sorted({k for r in runs for k in r.get("share_of_gather", {})})
        row = {"world": world, "capacity_per_rank": capacity, "exchange": exchange, "runs": len(runs),
               "rows_through": runs[0].get("rows_through"), "ms_per_gather": statistics.median(ms),
               "exchange_ms": statistics.median(r["ms_per_gather"] * r["exchange_share_of_gather"] for r in runs),
               "exchange_share": statistics.median(r["exchange_share_of_gather"] for r in runs),
               "hit_ratio": statistics.median(r["hit_ratio"] for r in runs),
               "breakdown_ms": {k: statistics.median(r["ms_per_gather"] * r["share_of_gather"].get(k, 0.0)
                                                     for r in runs) for k in parts},
               "loadavg_1min": [min(r["loadavg_at_end"][0] for r in runs), max(r["loadavg_at_end"][0] for r in runs)]}
        out.append(row)
        print(f"{world} ranks, {capacity}/rank, rows: {row['rows_through']} ({exchange}), medians of {len(runs)}: "
              f"{row['ms_per_gather']:.1f} ms per gather, exchange {row['exchange_ms']:.1f} ms = "
              f"{row['exchange_share']:.1%}; " + ", ".join(f"{k} {v:.1f}" for k, v in row["breakdown_ms"].items()),
              file=sys.stderr)
    return out


def scaled(capacity: str, factor: int) -> str:
    return f"{float(capacity.rstrip('%')) * factor:g}%"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default="/tmp/lsm-gnn-bench/comm")
    p.add_argument("--mode", default="shared")
    p.add_argument("--capacity", default="1.5%")
    p.add_argument("--data", default="/work/bench-data/rmat-2000000-d15-s0")
    p.add_argument("--worlds", default="2,4")
    p.add_argument("--capacities", default="0.4%,0.75%,1.5%", help="cache size per rank, share of the nodes")
    p.add_argument("--policy", default="hybrid")
    p.add_argument("--owner", default="modulo")
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--fanouts", default="5,2,2,2")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--iterations", type=int, default=150)
    p.add_argument("--json", default="docs/results/comm_layer.json")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-big", action="store_true", help="skip the isolated N x C caches (timing runs)")
    p.add_argument("--buffered", action="store_true", help="read misses without O_DIRECT (from the page cache)")
    p.add_argument("--shared-only", action="store_true",
                   help="run the shared cache alone (repeated timing runs of the exchange)")
    p.add_argument("--exchange", default="auto", help=argparse.SUPPRESS)  # a worker's
    p.add_argument("--exchanges", default="auto",
                   help="how the shared cache's rows travel, one run each per repeat: auto, shm, collective")
    p.add_argument("--repeats", type=int, default=1, help="runs of each configuration, interleaved")
    p.add_argument("--merged", action="store_true",
                   help="also replay the ranks' union through one cache of N x C (what any ownership could reach)")
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return {}
    if args.quick:
        from lsm_gnn.testing import write_tiny_dataset

        args.data = os.path.join(args.out, "quick-data")
        if not os.path.exists(args.data):
            ds, _ = write_tiny_dataset(args.data, num_nodes=4000, dim=8, avg_degree=5)
            from lsm_gnn.cli.prepare import recompute_scores

            recompute_scores(ds.path)
        args.worlds, args.capacities, args.iterations, args.window = "2", "10%", 8, 8
        args.fanouts, args.batch_size = "4,3", 32
    rows = []
    exchanges = args.exchanges.split(",")
    for repeat, world, capacity in itertools.product(range(args.repeats), [int(w) for w in args.worlds.split(",")],
                                                     args.capacities.split(",")):
        runs = [("shared", capacity), ("isolated", capacity), ("isolated", scaled(capacity, world))]
        for mode, cap in runs[:1] if args.shared_only else runs[:2] if args.no_big else runs:
            for exchange in exchanges if mode == "shared" else exchanges[:1]:
                r = run(args, world, mode, cap, os.path.join(args.out, f"{world}-{mode}-{cap}"), exchange)
                r.update(capacity_per_rank_base=capacity, repeat=repeat, exchange_asked=exchange)
                rows.append(r)
                through = f" (rows: {r['rows_through']})" if "rows_through" in r else ""
                print(f"{world} ranks {mode:<9} {cap:>6}/rank{through}: hit {r['hit_ratio']:.3f}  read "
                      f"{r['bytes_read'] / 2**20:.1f} MiB  exchange {r['exchange_share_of_gather']:.1%} of gather, "
                      f"{r['ms_per_gather']:.1f} ms per gather, load {r['loadavg_at_end'][0]:.2f}", file=sys.stderr)
                if "share_of_gather" in r:
                    print("   " + ", ".join(f"{k} {v:.1%}" for k, v in r["share_of_gather"].items()) +
                          f"; rows collective {r['rows_collective_ms']:.1f} ms/iteration, a bare all_to_all of "
                          f"its bytes {r['bare_rows_all_to_all_ms']:.1f} ms", file=sys.stderr)
    medians = shared_medians(rows)
    print(f"{'ranks':>5} {'C/rank':>7} {'shared':>8} {'isolated':>9} {'isol. NxC':>10} {'read shared/isol.':>18} "
          f"{'exchange/gather':>16} {'rows/s shared':>14} {'rows/s isol.':>13}")
    table = []
    for world in sorted({r["world"] for r in rows}):
        for capacity in args.capacities.split(","):
            group = [r for r in rows if r["world"] == world and r["capacity_per_rank_base"] == capacity
                     and r["repeat"] == 0 and r["exchange_asked"] == exchanges[0]]
            missing = {"hit_ratio": float("nan"), "bytes_read": float("nan"), "ms_per_gather": float("nan"),
                       "rows_per_gather_s": float("nan")}
            shared, isolated, big = (*group, missing, missing)[:3]
            row = {"world": world, "capacity_per_rank": capacity, "hit_shared": shared["hit_ratio"],
                   "hit_isolated": isolated["hit_ratio"], "hit_isolated_NxC": big["hit_ratio"],
                   "read_ratio_shared_vs_isolated": shared["bytes_read"] / max(isolated["bytes_read"], 1),
                   "exchange_share": shared["exchange_share_of_gather"],
                   "exchange_breakdown": shared.get("share_of_gather"),
                   "ms_per_gather_shared": shared["ms_per_gather"], "ms_per_gather_isolated": isolated["ms_per_gather"],
                   "rows_per_s_shared": shared["rows_per_gather_s"],
                   "rows_per_s_isolated": isolated["rows_per_gather_s"]}
            if args.merged:
                row["hit_merged_NxC"] = merged_hit_ratio(args, world, capacity)
                print(f"{world} ranks, one merged cache of {world} x {capacity}: hit {row['hit_merged_NxC']:.3f}",
                      file=sys.stderr)
            table.append(row)
            print(f"{world:>5} {capacity:>7} {row['hit_shared']:>8.3f} {row['hit_isolated']:>9.3f} "
                  f"{row['hit_isolated_NxC']:>10.3f} {row['read_ratio_shared_vs_isolated']:>18.2f} "
                  f"{row['exchange_share']:>16.1%} {row['rows_per_s_shared']:>14,.0f} "
                  f"{row['rows_per_s_isolated']:>13,.0f}")
    result = {"settings": {k: v for k, v in vars(args).items() if k not in ("worker", "json")}, "runs": rows,
              "table": table, "shared_medians": medians, "cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg()}
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
