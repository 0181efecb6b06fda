"""Hit ratio of every cache policy on a recorded GNN sampling trace, beside Belady's MIN
(set-associative at the cache's sets and ways, and fully associative at as many lines),
LRU, CLOCK, S3-FIFO and SIEVE (libCacheSim; GraphBolt's CPU cache policies) on the same trace. The gap from a policy to the fully
associative bound splits into what the 32 ways cost (FA MIN - SA MIN) and what the policy
costs (SA MIN - policy).

Setup (the paper's, scaled by node count): a power-law graph, GAT-style
sampling (fanouts 5,2,2,2) of shuffled training seeds, a window of 256
future batches scanned every 4 iterations, 32-way caches holding 0.4%,
0.75% and 1.5% of the nodes (the paper's 4/8/16 GB over IGB-Full). Hit
ratios count distinct ids per batch, after a warm-up.

Two runs (``--batch-size``): the paper's 2048 seeds, and ``--batch-size
scaled``: seeds scaled so one iteration touches the same fraction of the
graph as 2048 seeds do on IGB-Full's 269M nodes.

    python benchmarks/cache_policies.py                        # paper batch
    python benchmarks/cache_policies.py --batch-size scaled    # scaled batch
    python benchmarks/cache_policies.py --quick                # seconds, for CI

A policy may carry PolicyConfig options after '@': ``farthest@bypass=0`` is
farthest without Belady's bypass, ``farthest@assign_next_use=0@threshold=56``
the farthest policy as it was before it read next uses at assign time.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from types import SimpleNamespace

import numpy as np
import torch

from lsm_gnn.cache import POLICIES, PolicyConfig, SoftwareCache, belady_min, belady_set_associative, replay
from lsm_gnn.data.synthetic import DEFAULT_RMAT as RMAT
from lsm_gnn.sampling import OneTypeSampler
from lsm_gnn.storage.base import FeatureStorage, StorageStats
from lsm_gnn.testing.benchmarking import reusable_dataset, write_json

IGB_FULL_NODES = 269_346_174
PAPER_BATCH = 2048
PEERS = ("libcachesim:lru", "libcachesim:clock", "libcachesim:s3fifo", "libcachesim:sieve")
BOUNDS = ("belady_sa", "belady")  # set-associative at the cache's geometry, fully associative at as many lines


class NullStorage(FeatureStorage):
    """Rows of zeros: the policy benchmark measures hit ratios, not bytes."""

    backend = "null"

    def __init__(self, num_rows: int):
        super().__init__(num_rows, 1, "float32")

    def _read(self, ids, out):
        out.zero_()

    def stats(self):
        return StorageStats(backend=self.backend)

    def reset_stats(self):
        pass


def load_or_generate(path: str, num_nodes: int, avg_degree: float, seed: int, rmat: tuple = RMAT):
    from lsm_gnn.data.synthetic import generate_synthetic

    ds = reusable_dataset(path, num_nodes=num_nodes, generator={"avg_degree": avg_degree, "seed": seed,
                                                                "rmat": list(rmat)})
    if ds is not None:
        return ds
    print(f"generating {num_nodes:,}-node R-MAT graph at {path} ...", file=sys.stderr)
    return generate_synthetic(path, num_nodes=num_nodes, avg_degree=avg_degree, feature_dim=1, seed=seed,
                              rmat=rmat, overwrite=True, progress=True)


def parse_rmat(text: str) -> tuple:
    """R-MAT's four quadrant probabilities, ``A,B,C,D``: the larger A, the more skewed the degrees."""
    try:
        rmat = tuple(float(x) for x in text.split(","))
    except ValueError:
        rmat = ()
    if len(rmat) != 4 or min(rmat) < 0 or abs(sum(rmat) - 1) > 1e-6:
        raise argparse.ArgumentTypeError(f"{text!r}: give four probabilities A,B,C,D summing to 1, "
                                         f"e.g. {','.join(f'{x:g}' for x in RMAT)} (the default)")
    return rmat


def record_trace(ds, fanouts, batch_size: int, iterations: int, seed: int) -> list[torch.Tensor]:
    """Input nodes of `iterations` mini-batches of shuffled training seeds (epochs reshuffle)."""
    sampler = OneTypeSampler(ds, fanouts, seed=seed)
    train = np.asarray(ds.split("train"))
    rng = np.random.default_rng(seed)
    trace, order, cursor = [], rng.permutation(train), 0
    for it in range(iterations):
        if cursor + batch_size > order.size:
            order, cursor = rng.permutation(train), 0
        seeds = order[cursor:cursor + batch_size]
        cursor += batch_size
        trace.append(sampler.input_nodes(seeds, it))
    return trace


def policy_config(spec: str, window: int, period: int) -> PolicyConfig:
    """A policy name with PolicyConfig options after '@' (``farthest@bypass=0@threshold=56``)."""
    name, *options = spec.split("@")
    kwargs = {"window": window, "period": period}
    for option in options:
        key, _, value = option.partition("=")
        if key in ("assign_next_use", "bypass"):
            kwargs[key] = value.lower() in ("1", "true", "yes")
        elif key in ("threshold", "window", "period"):
            kwargs[key] = int(value)
        else:
            raise ValueError(f"unknown policy option {key!r} in {spec!r}; use assign_next_use, bypass, threshold, "
                             "window or period")
    return PolicyConfig(name, **kwargs)


def run_policy(trace, num_nodes, policy, num_sets, window, period, warmup, static, end=None):
    """Hit ratio of ``policy`` over iterations [warmup, end) of ``trace`` (default: all but the last
    ``window`` batches, which only feed the window), the iterations the Belady bounds count."""
    end = len(trace) - window if end is None else end
    # Caches of 0.4-1.5% of a 2M-node graph are smaller than one 2048-seed batch: allow it.
    cache = SoftwareCache(NullStorage(num_nodes), num_sets=num_sets, ways=32,
                          policy=policy_config(policy, window, period), static_scores=static, oversubscribe=True)
    hits0 = unique0 = bypassed0 = 0
    start = time.perf_counter()
    for t, (current, future) in enumerate(replay(trace, window, num_nodes=num_nodes)):
        if t == warmup:
            hits0, unique0, bypassed0 = cache.stats.hits, cache.stats.unique, cache.stats.bypassed
        if t == end:
            break
        cache.lookup(current, future)
    hits, unique = cache.stats.hits - hits0, cache.stats.unique - unique0
    return {"hit_ratio": hits / unique, "hits": hits, "requests": unique, "evicted_in_use": cache.stats.evicted_in_use,
            "bypassed": cache.stats.bypassed - bypassed0, "seconds": time.perf_counter() - start}


def run_peers(trace, lines: int, warmup: int, work_dir: str) -> dict:
    """LRU / CLOCK / S3-FIFO / SIEVE from libCacheSim (GraphBolt's CPU cache policies) on the same trace (each
    batch's distinct ids, ascending)."""
    try:
        import libcachesim as lcs
    except ImportError:
        print("libcachesim is not installed (pip install libcachesim): peers skipped", file=sys.stderr)
        return {}
    record = np.dtype([("time", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")])
    path = os.path.join(work_dir, "trace.oracleGeneral")
    warm_requests = 0
    with open(path, "wb") as f:
        for t, batch in enumerate(trace):
            ids = np.unique(batch.numpy())
            rows = np.zeros(ids.size, record)
            rows["time"], rows["id"], rows["size"], rows["next"] = t, ids, 1, -1
            rows.tofile(f)
            if t < warmup:
                warm_requests += ids.size
    classes = {"libcachesim:lru": lcs.LRU, "libcachesim:clock": lcs.Clock, "libcachesim:s3fifo": lcs.S3FIFO,
               "libcachesim:sieve": lcs.Sieve}
    out = {}
    for name, cls in classes.items():
        # Miss counts of the warm-up prefix and of the whole trace; the difference is the measured part.
        reader = lcs.TraceReader(path, lcs.TraceType.ORACLE_GENERAL_TRACE)
        total_ratio, _ = cls(cache_size=lines).process_trace(reader)
        reader = lcs.TraceReader(path, lcs.TraceType.ORACLE_GENERAL_TRACE)
        warm_ratio, _ = cls(cache_size=lines).process_trace(reader, max_req=warm_requests) if warm_requests else (0, 0)
        total_requests = os.path.getsize(path) // record.itemsize
        misses = total_ratio * total_requests - warm_ratio * warm_requests
        measured = total_requests - warm_requests
        out[name] = {"hit_ratio": 1.0 - misses / measured, "requests": measured}
    os.remove(path)
    return out


def add_trace_arguments(parser: argparse.ArgumentParser, policies) -> None:
    """The trace setup's options, shared with benchmarks/pvp.py."""
    parser.add_argument("--num-nodes", type=float, default=2e6)
    parser.add_argument("--avg-degree", type=float, default=15)
    parser.add_argument("--fanouts", default="5,2,2,2")
    parser.add_argument("--batch-size", default=str(PAPER_BATCH), help="seeds per batch, or 'scaled'")
    parser.add_argument("--iterations", type=int, default=None,
                        help="measured iterations (default 1000; 20000 for the scaled batch)")
    parser.add_argument("--warmup", type=int, default=256)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--period", type=int, default=4)
    parser.add_argument("--sizes", default="0.004,0.0075,0.015", help="cache sizes as fractions of the nodes")
    parser.add_argument("--policies", default=",".join(policies))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rmat", type=parse_rmat, default=RMAT,
                        help="the generated graph's R-MAT probabilities A,B,C,D (default %(default)s; less skew: "
                             "a smaller A)")
    parser.add_argument("--data-dir", default=os.environ.get("LSM_GNN_BENCH_DATA", "/work/bench-data"))
    parser.add_argument("--json", default=None)
    parser.add_argument("--plot", default=None, help="write a PNG bar chart here (needs matplotlib)")
    parser.add_argument("--quick", action="store_true", help="tiny run (seconds) to check the script works")


def scaled_batch(num_nodes: int) -> int:
    """Seeds per batch that touch the share of ``num_nodes`` that the paper's 2048 touch of IGB-Full."""
    return max(1, round(PAPER_BATCH * num_nodes / IGB_FULL_NODES))


def record_setup_trace(args) -> SimpleNamespace:
    """The graph and the recorded trace the options name: warm-up, measured iterations, and a
    trailing window of batches that only feeds the window of the measured ones."""
    if args.quick:
        args.num_nodes, args.window, args.warmup, args.sizes = 20000, 16, 8, "0.02,0.05"
        args.iterations = args.iterations or 40
        if args.batch_size != "scaled":
            args.batch_size = "64"
    num_nodes = int(args.num_nodes)
    batch = scaled_batch(num_nodes) if args.batch_size == "scaled" else int(args.batch_size)
    iterations = args.iterations or (20000 if args.batch_size == "scaled" else 1000)
    fanouts = [int(k) for k in args.fanouts.split(",")]
    os.makedirs(args.data_dir, exist_ok=True)
    skew = "" if args.rmat == RMAT else "-rmat" + "_".join(f"{x:g}" for x in args.rmat)
    ds = load_or_generate(os.path.join(args.data_dir, f"rmat-{num_nodes}-d{args.avg_degree:g}-s{args.seed}{skew}"),
                          num_nodes, args.avg_degree, args.seed, args.rmat)
    total_iterations = args.warmup + iterations + args.window
    t0 = time.perf_counter()
    trace = record_trace(ds, fanouts, batch, total_iterations, args.seed)
    measured_end = args.warmup + iterations
    per_iter = float(np.mean([b.numel() for b in trace[:measured_end]]))
    print(f"trace: {total_iterations} batches of {batch} seeds, {per_iter:,.0f} distinct nodes per batch "
          f"({per_iter / num_nodes:.3%} of the graph), sampled in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return SimpleNamespace(num_nodes=num_nodes, batch=batch, iterations=iterations, fanouts=fanouts, dataset=ds,
                           static=np.asarray(ds.score("reverse_pagerank")), trace=trace, measured_end=measured_end,
                           nodes_per_batch=per_iter)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_trace_arguments(parser, POLICIES)
    args = parser.parse_args(argv)
    setup = record_setup_trace(args)
    num_nodes, trace, measured_trace_end = setup.num_nodes, setup.trace, setup.measured_end
    policies = args.policies.split(",")

    results = {"config": {"num_nodes": num_nodes, "num_edges": setup.dataset.num_edges, "fanouts": setup.fanouts,
                          "batch_size": setup.batch, "iterations": setup.iterations, "warmup": args.warmup,
                          "window": args.window, "period": args.period, "ways": 32, "rmat": list(args.rmat),
                          "nodes_per_batch": setup.nodes_per_batch},
               "sizes": {}}
    with tempfile.TemporaryDirectory() as work_dir:
        for frac in (float(s) for s in args.sizes.split(",")):
            num_sets = max(1, int(frac * num_nodes) // 32)
            lines = num_sets * 32
            row = {"lines": lines}
            cut = trace[:measured_trace_end + args.window]
            for policy in policies:
                row[policy] = run_policy(cut, num_nodes, policy, num_sets, args.window, args.period, args.warmup,
                                         setup.static, end=measured_trace_end)
                print(f"size {frac:.2%} {policy:<11} hit ratio {row[policy]['hit_ratio']:.4f} "
                      f"({row[policy]['seconds']:.0f} s)", file=sys.stderr)
            measured = trace[:measured_trace_end]
            for name, (hits, requests) in (
                    ("belady_sa", belady_set_associative(measured, num_sets, 32, num_nodes, count_from=args.warmup)),
                    ("belady", belady_min(measured, lines, num_nodes, count_from=args.warmup))):
                row[name] = {"hit_ratio": hits / requests, "hits": hits, "requests": requests}
            row.update(run_peers(measured, lines, args.warmup, work_dir))
            results["sizes"][f"{frac:g}"] = row

    names = policies + [p for p in BOUNDS + PEERS if p in next(iter(results["sizes"].values()))]
    print_table(results, names, setup, args)
    if args.json:
        write_json(args.json, results)
    if args.plot:
        plot(results, names, args.plot)
    return results


def print_table(results: dict, names: list[str], setup, args) -> None:
    """Hit ratios, each as a fraction of the set-associative bound, and the gap split per size."""
    print(f"\nhit ratio, {setup.batch} seeds/batch, fanouts {args.fanouts}, {setup.num_nodes:,} nodes, "
          f"window {args.window}, {setup.iterations} iterations after {args.warmup} warm-up")
    rows = [results["sizes"][s] for s in results["sizes"]]
    print(f"{'policy':<20}" + "".join(f"{float(s):>10.2%}" for s in results["sizes"]) + "   (of SA Belady)")
    for name in names:
        cells = [row[name]["hit_ratio"] for row in rows]
        of_sa = "" if name in BOUNDS + PEERS else "   " + " ".join(
            f"{c / row['belady_sa']['hit_ratio']:.3f}" for c, row in zip(cells, rows))
        print(f"{name:<20}" + "".join(f"{c:>10.4f}" for c in cells) + of_sa)
    # Our policies only: libCacheSim's caches are fully associative, so the SA bound does not apply to them.
    best = [max((row[p]["hit_ratio"], p) for p in names if p not in BOUNDS + PEERS) for row in rows]
    print(f"{'32 ways cost':<20}" + "".join(f"{row['belady']['hit_ratio'] - row['belady_sa']['hit_ratio']:>10.4f}"
                                            for row in rows) + "   (FA MIN - SA MIN)")
    print(f"{'best policy costs':<20}" + "".join(f"{row['belady_sa']['hit_ratio'] - b[0]:>10.4f}"
                                                 for row, b in zip(rows, best))
          + "   (SA MIN - " + ", ".join(dict.fromkeys(b[1] for b in best)) + ")")


def plot(results: dict, names: list[str], path: str, *, published: dict | None = None, xlabels=None,
         title: str | None = None) -> None:
    """Grouped bars of each policy's hit ratio per size; ``published``: {name: a value per size, or None} drawn
    as black diamonds on those bars (a paper's figures)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(results["sizes"])
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(11, 4.5))
    palette = plt.get_cmap("tab20").colors  # more names than the default cycle's ten colours
    marks = []
    for k, name in enumerate(names):
        xs = [i + k * width for i in range(len(sizes))]
        ax.bar(xs, [results["sizes"][s][name]["hit_ratio"] for s in sizes], width, label=name,
               color={"belady": "black", "belady_sa": "dimgray"}.get(name, palette[k % len(palette)]))
        marks += [(x, value) for x, value in zip(xs, (published or {}).get(name, ())) if value is not None]
    if marks:
        ax.scatter(*zip(*marks), marker="D", color="black", zorder=3, label="paper (published)")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(sizes))])
    ax.set_xticklabels(xlabels or [f"{float(s):.2%} of nodes" for s in sizes])
    ax.set_ylabel("hit ratio")
    cfg = results["config"]
    ax.set_title(title or f"{cfg['num_nodes']:,} nodes, batch {cfg['batch_size']}, fanouts {cfg['fanouts']}, "
                          f"window {cfg['window']}")
    ax.legend(ncol=5, fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)

if __name__ == "__main__":
    main()
