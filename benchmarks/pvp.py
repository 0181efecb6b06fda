"""Combined hit ratio and storage reads with and without the victim-buffer prefetcher (PVP),
for every cache policy, on the recorded sampling trace of benchmarks/cache_policies.py.

Setup (the paper's, scaled by node count, as in cache_policies.py): a 2M-node
R-MAT graph, GAT-style sampling (fanouts 5,2,2,2) of shuffled training
seeds, a window of 256 future batches scanned every 4 iterations, 32-way
caches of 0.4%, 0.75% and 1.5% of the nodes. Victim queues are scaled like
the paper's: 16K lines per queue against about 140K distinct nodes per
iteration on IGB-Full (16K: the paper, section 5; 140K: an estimate), so a queue holds 11.7% of one
iteration's distinct nodes (``--queue-capacity scaled``; or a number of
lines). Each policy runs without PVP (``off``), with the paper's PVP
(``bypass``: PVP-served ids skip the cache) and with ``reinstall``
(PVP-served ids are installed in the cache as misses read from the queue,
so the cache evolves exactly as without PVP).

    python benchmarks/pvp.py --batch-size scaled     # the paper's regime (cache holds many batches)
    python benchmarks/pvp.py                         # 2048 seeds (cache smaller than one batch)
    python benchmarks/pvp.py --quick                 # seconds, for CI

``--same-bytes 0.25,0.5,1`` judges PVP fairly instead: for each cache size C
and each share q, PVP (``--pvp-policy``, default ``hybrid_pvp_room``) with
reinstall and victim queues of q x C bytes in all (rows and 16 B of metadata
a line, as ``pvp_queue_bytes`` sizes them) against the plain cache
(``--plain-policy``, default ``hybrid``) without PVP, given the cache's C
bytes and the same (1 + q) x C bytes as cache lines: does the memory pay
more as queues or as cache?

    python benchmarks/pvp.py --batch-size scaled --iterations 3000 --same-bytes 0.1,0.25,0.5,1
    python benchmarks/pvp.py --batch-size scaled --iterations 3000 --same-bytes 0.25 --pvp-policy farthest \
        --plain-policy farthest                      # today's defaults, with and without PVP
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from lsm_gnn.cache import SoftwareCache, belady_min, replay
from lsm_gnn.cache.pvp import queue_capacity_for, queue_memory_bytes
from lsm_gnn.testing.benchmarking import load_script, write_json

HERE = os.path.dirname(os.path.abspath(__file__))
PAPER_QUEUE_CAPACITY = 16384
PAPER_NODES_PER_BATCH = 140_000  # distinct nodes of one 2048-seed batch on IGB-Full (an estimate)
FEATURE_ROW_BYTES = 4096         # bytes read are reported for the paper's 1024 float32 features
POLICIES = ("rr", "static", "dynamic", "hybrid", "hybrid_far", "hybrid_pvp", "hybrid_pvp_room", "farthest")
MODES = ("off", "bypass", "reinstall")


def _cache_policies():
    return load_script(os.path.join(HERE, "cache_policies.py"))


def scaled_queue_capacity(nodes_per_batch: float) -> int:
    """Lines per victim queue holding the share of a batch that the paper's 16K lines hold of IGB-Full's."""
    return max(1, round(PAPER_QUEUE_CAPACITY * nodes_per_batch / PAPER_NODES_PER_BATCH))


class Replay:
    """One cache over ``trace``, a lookup per :meth:`step`, so that several caches can replay it in lockstep
    (their lookups then share the machine's drifts in load). :meth:`result`: the counters after ``warmup``
    lookups and ``measured_seconds``, the time of those lookups alone. ``storage``: where misses are read
    (default: rows of zeros, for hit ratios only; a storage of ``FEATURE_ROW_BYTES`` rows on disk times real
    reads, with no read-ahead, so every miss is read inside its lookup)."""

    def __init__(self, trace, num_nodes, policy, mode, num_sets, window, period, warmup, static, capacity,
                 storage=None):
        if storage is None:
            storage = _cache_policies().NullStorage(num_nodes)
        elif storage.row_bytes != FEATURE_ROW_BYTES or storage.num_rows != num_nodes:
            raise ValueError(f"a storage of {num_nodes:,} rows of {FEATURE_ROW_BYTES} bytes is needed, got "
                             f"{storage.num_rows:,} of {storage.row_bytes}")
        self.storage, self.warmup = storage, warmup
        self.cache = SoftwareCache(storage, num_sets=num_sets, ways=32, policy=policy, window=window, period=period,
                                   static_scores=static, oversubscribe=True, pvp=mode != "off",
                                   pvp_queue_capacity=capacity, pvp_reinstall=mode == "reinstall", read_ahead=0)
        self.end = len(trace) - window  # the last window of batches only feeds the window: the bound counts none
        self._batches = enumerate(replay(trace, window, num_nodes=num_nodes))
        self._base = self._pvp_base = self._storage_base = None
        self.start, self.measured_seconds = time.perf_counter(), 0.0

    def step(self) -> bool:
        """One lookup; False once the measured batches are done."""
        t, (current, future) = next(self._batches)
        cache = self.cache
        if t == self.warmup:
            self._base = dict(vars(cache.stats))
            self._pvp_base = dict(vars(cache.pvp.stats)) if cache.pvp is not None else None
            self._storage_base = self.storage.stats()
        if t == self.end:
            return False
        start = time.perf_counter()
        cache.lookup(current, future)
        if t >= self.warmup:
            self.measured_seconds += time.perf_counter() - start
        return True

    def result(self) -> dict:
        cache = self.cache
        s = {k: v - self._base[k] for k, v in vars(cache.stats).items()}
        out = {"combined_hit_ratio": (s["hits"] + s["pvp_hits"]) / s["unique"],
               "cache_hit_ratio": s["hits"] / s["unique"], "pvp_hit_ratio": s["pvp_hits"] / s["unique"],
               "requests": s["unique"], "hits": s["hits"], "pvp_hits": s["pvp_hits"], "rows_read": s["misses"],
               "bytes_read": s["misses"] * FEATURE_ROW_BYTES, "evictions": s["evictions"],
               "lookups": s["iterations"], "seconds": time.perf_counter() - self.start,
               "measured_seconds": self.measured_seconds, "cache_lines": cache.num_lines}
        if self.storage.from_disk:  # what the disk served (alignment and coalescing included), and its time
            now, base = self.storage.stats(), self._storage_base
            out.update(disk_bytes_read=now.bytes_read - base.bytes_read,
                       read_seconds=now.total_seconds - base.total_seconds)
        if self._pvp_base is not None:
            v = {k: val - self._pvp_base[k] for k, val in vars(cache.pvp.stats).items()}
            out.update(enqueued=v["enqueued"], dropped_no_reuse=v["dropped_no_reuse"], dropped_full=v["dropped_full"],
                       unused=v["unused"], bytes_saved=v["hits"] * FEATURE_ROW_BYTES,
                       victim_buffer_lines=cache.pvp.num_queues * cache.pvp.capacity)
        cache.settle()
        return out


def run(*args, **kwargs) -> dict:
    """:class:`Replay` (its arguments) to the end: its result."""
    one = Replay(*args, **kwargs)
    while one.step():
        pass
    return one.result()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cp = _cache_policies()
    cp.add_trace_arguments(parser, POLICIES)
    parser.add_argument("--modes", default=",".join(MODES), help="off (no PVP), bypass (the paper's), reinstall")
    parser.add_argument("--queue-capacity", default="scaled",
                        help="lines per victim queue, or 'scaled' (16K x nodes per batch / 140K)")
    parser.add_argument("--same-bytes", default=None,
                        help="queue shares of the cache's bytes (e.g. 0.25,0.5,1): PVP against a plain cache given "
                             "the same memory")
    parser.add_argument("--pvp-policy", default="hybrid_pvp_room", help="--same-bytes: the policy with PVP")
    parser.add_argument("--plain-policy", default="hybrid", help="--same-bytes: the policy without PVP")
    args = parser.parse_args(argv)
    if args.same_bytes:
        return same_bytes(args, cp, [float(q) for q in args.same_bytes.split(",")])
    setup = cp.record_setup_trace(args)
    num_nodes, trace, measured_end, per_iter = setup.num_nodes, setup.trace, setup.measured_end, setup.nodes_per_batch
    policies, modes = args.policies.split(","), args.modes.split(",")
    capacity = scaled_queue_capacity(per_iter) if args.queue_capacity == "scaled" else int(args.queue_capacity)
    print(f"{capacity} lines per victim queue ({capacity / per_iter:.1%} of a batch)", file=sys.stderr)
    results = {"config": {"num_nodes": num_nodes, "num_edges": setup.dataset.num_edges, "fanouts": setup.fanouts,
                          "batch_size": setup.batch, "iterations": setup.iterations, "warmup": args.warmup,
                          "window": args.window, "period": args.period, "ways": 32, "nodes_per_batch": per_iter,
                          "queue_capacity": capacity, "feature_row_bytes": FEATURE_ROW_BYTES},
               "sizes": {}}
    for frac in (float(s) for s in args.sizes.split(",")):
        num_sets = max(1, int(frac * num_nodes) // 32)
        row = {"lines": num_sets * 32}
        for policy in policies:
            row[policy] = {}
            for mode in modes:
                if mode == "off" and policy == "hybrid_pvp_room" and "hybrid" in policies:
                    row[policy][mode] = dict(row["hybrid"]["off"], same_as="hybrid")  # identical without PVP
                    continue
                r = run(trace[:measured_end + args.window], num_nodes, policy, mode, num_sets, args.window,
                        args.period, args.warmup, setup.static, capacity)
                row[policy][mode] = r
                print(f"size {frac:.2%} {policy:<16} {mode:<9} combined {r['combined_hit_ratio']:.4f} "
                      f"(cache {r['cache_hit_ratio']:.4f} + pvp {r['pvp_hit_ratio']:.4f}) {r['seconds']:.0f} s",
                      file=sys.stderr)
        hits, requests = belady_min(trace[:measured_end], row["lines"], num_nodes, count_from=args.warmup)
        row["belady"] = {"hit_ratio": hits / requests}
        results["sizes"][f"{frac:g}"] = row
    print_table(results, policies, modes)
    if args.json:
        write_json(args.json, results)
    if args.plot:
        plot(results, policies, modes, args.plot)
    return results


def same_bytes(args, cp, shares: list[float]) -> dict:
    """PVP with queues of q x the cache's bytes against plain hybrid with (1 + q) x the cache's bytes."""
    setup = cp.record_setup_trace(args)
    n, trace = setup.num_nodes, setup.trace[:setup.measured_end + args.window]
    row, queues = FEATURE_ROW_BYTES, args.window + 1
    results = {"config": {"num_nodes": n, "batch_size": setup.batch, "iterations": setup.iterations,
                          "warmup": args.warmup, "window": args.window, "nodes_per_batch": setup.nodes_per_batch,
                          "feature_row_bytes": row, "shares": shares}, "sizes": {}}
    pvp_policy, plain_policy = args.pvp_policy, args.plain_policy
    results["config"].update(pvp_policy=pvp_policy, plain_policy=plain_policy)
    print(f"\nsame bytes: PVP ({pvp_policy}, reinstall, queues of q x the cache) against {plain_policy} with "
          f"(1 + q) x the cache; {setup.batch} seeds/batch, {n:,} nodes, window {args.window}")
    print(f"{'cache':>8}{'q':>6}{'queue lines':>12}{'plain C':>10}{'PVP C+qC':>10}{'plain (1+q)C':>15}"
          f"{'PVP - same':>12}")
    for frac in (float(x) for x in args.sizes.split(",")):
        num_sets = max(1, int(frac * n) // 32)
        cache_bytes = num_sets * 32 * row
        plain = run(trace, n, plain_policy, "off", num_sets, args.window, args.period, args.warmup, setup.static, 1)
        cells = {"cache_bytes": cache_bytes, "plain": plain, "shares": {}}
        for q in shares:
            lines = queue_capacity_for(int(q * cache_bytes), queues, row, cache_bytes)
            pvp = run(trace, n, pvp_policy, "reinstall", num_sets, args.window, args.period, args.warmup,
                      setup.static, lines)
            queue_bytes = queue_memory_bytes(queues, lines, row)
            bigger_sets = max(1, (cache_bytes + queue_bytes) // (32 * row))
            same = run(trace, n, plain_policy, "off", bigger_sets, args.window, args.period, args.warmup,
                       setup.static, 1)
            cells["shares"][f"{q:g}"] = {"queue_lines": lines, "queue_bytes": queue_bytes, "pvp": pvp,
                                         "same_bytes": same, "same_bytes_lines": bigger_sets * 32}
            print(f"{frac:>8.2%}{q:>6g}{lines:>12,}{plain['combined_hit_ratio']:>10.4f}"
                  f"{pvp['combined_hit_ratio']:>10.4f}{same['combined_hit_ratio']:>15.4f}"
                  f"{pvp['combined_hit_ratio'] - same['combined_hit_ratio']:>+12.4f}", flush=True)
        results["sizes"][f"{frac:g}"] = cells
    if args.json:
        write_json(args.json, results)
    return results


def print_table(results: dict, policies, modes) -> None:
    cfg = results["config"]
    sizes = list(results["sizes"])
    print(f"\ncombined hit ratio (cache + PVP), {cfg['batch_size']} seeds/batch, {cfg['num_nodes']:,} nodes, "
          f"window {cfg['window']}, {cfg['queue_capacity']} lines per victim queue, {cfg['iterations']} iterations")
    print(f"{'policy':<17}{'mode':<10}" + "".join(f"{float(s):>10.2%}" for s in sizes)
          + "   (PVP hit ratio; GB read per 1000 iterations at 4 KiB rows)")
    for policy in policies:
        for mode in modes:
            cells = [results["sizes"][s][policy][mode] for s in sizes]
            # Measured lookups: the iterations the Belady bound counts (as in cache_policies.py).
            extra = " ".join(f"{c['pvp_hit_ratio']:.3f}/"
                             f"{c['bytes_read'] / c.get('lookups', cfg['iterations']) / 1e6:.2f}"
                             for c in cells)
            print(f"{policy:<17}{mode:<10}" + "".join(f"{c['combined_hit_ratio']:>10.4f}" for c in cells)
                  + "   " + extra)
    print(f"{'belady (cache only)':<27}" + "".join(f"{results['sizes'][s]['belady']['hit_ratio']:>10.4f}"
                                                   for s in sizes))


def plot(results: dict, policies, modes, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(results["sizes"])
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.2 * len(sizes), 4), sharey=True)
    axes = np.atleast_1d(axes)
    width = 0.8 / len(modes)
    for ax, s in zip(axes, sizes):
        row = results["sizes"][s]
        for k, mode in enumerate(modes):
            x = [i + k * width for i in range(len(policies))]
            ax.bar(x, [row[p][mode]["cache_hit_ratio"] for p in policies], width,
                   label=f"{mode}: cache" if s == sizes[0] else None, color=f"C{k}")
            if mode != "off":
                ax.bar(x, [row[p][mode]["pvp_hit_ratio"] for p in policies], width,
                       bottom=[row[p][mode]["cache_hit_ratio"] for p in policies], color=f"C{k}", alpha=0.45,
                       hatch="//", label=f"{mode}: PVP" if s == sizes[0] else None)
        ax.axhline(row["belady"]["hit_ratio"], color="black", lw=1, ls="--",
                   label="Belady (cache only)" if s == sizes[0] else None)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(policies))])
        ax.set_xticklabels(policies, rotation=35, ha="right", fontsize=8)
        ax.set_title(f"cache {float(s):.2%} of nodes")
    axes[0].set_ylabel("hit ratio (solid: cache, hatched: PVP)")
    cfg = results["config"]
    fig.suptitle(f"PVP: {cfg['num_nodes']:,} nodes, batch {cfg['batch_size']}, window {cfg['window']}, "
                 f"{cfg['queue_capacity']} lines per queue", fontsize=10)
    fig.legend(loc="lower center", ncol=len(modes) * 2 + 1, fontsize=7)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
