"""The window index at scale: its memory per node, and the speed of push, pop and the window scan.

The index (``csrc/cache/window_index.h``) keeps a few bytes for every node of the graph, so at 10^8
nodes its size matters as much as the cache's. This builds one for ``--num-nodes`` nodes and reports
the bytes it allocated (its own count) and the resident memory it added (RSS before and after, the
arrays are written when made so every page is counted), then slides a window of ``--window`` batches
of ``--batch`` power-law ids over ``--steps`` iterations and reports the median time of one push, one
pop and one window scan (``_C.cache_scan`` of ``--lines`` cache lines holding random nodes). All in
one process; the scan runs on one thread so the figure does not depend on the machine's other load.

    python benchmarks/window_index.py                      # 10^7 nodes, ~1 min
    python benchmarks/window_index.py --quick
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from lsm_gnn import _C
from lsm_gnn.cache import WindowBuffer
from lsm_gnn.kernels.layout import INVALID_TAG
from lsm_gnn.testing.benchmarking import machine_info, write_json


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def power_law_batch(rng: np.random.Generator, num_nodes: int, size: int) -> torch.Tensor:
    """Ids skewed towards a few hot nodes (rank ~ u^3), the hot ones scattered over the id space."""
    rank = (num_nodes * rng.random(size) ** 3).astype(np.int64)
    return torch.from_numpy((rank * 2_654_435_761) % num_nodes)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-nodes", type=int, default=10_000_000)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--batch", type=int, default=200_000)
    parser.add_argument("--lines", type=int, default=1 << 20)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.num_nodes, args.window, args.batch, args.lines, args.steps = 100_000, 4, 2000, 4096, 6
    rng = np.random.default_rng(0)
    batches = [power_law_batch(rng, args.num_nodes, args.batch) for _ in range(args.window + args.steps)]
    tags = torch.from_numpy(rng.integers(0, args.num_nodes, args.lines))
    tags[: args.lines // 10] = INVALID_TAG
    records = torch.zeros(args.lines, dtype=torch.int64)
    flags = torch.zeros(args.lines, dtype=torch.uint8)

    before = rss_bytes()
    window = WindowBuffer(args.window + 1, args.num_nodes)
    made = rss_bytes()
    allocated_empty = window.index.allocated_bytes
    for batch in batches[: args.window]:
        window.push(batch)
    filled = rss_bytes()
    times = {"push": [], "pop": [], "scan": []}

    def timed(name, fn):
        start = time.perf_counter()
        fn()
        times[name].append(time.perf_counter() - start)

    for batch in batches[args.window:]:
        timed("pop", window.pop)
        timed("push", lambda: window.push(batch))
        first = window.first_occurrence("cpu")
        timed("scan", lambda: _C.cache_scan(tags, records, flags, *first, args.window, 1))
    result = {
        "num_nodes": args.num_nodes, "window": args.window, "batch": args.batch, "lines": args.lines,
        "steps": args.steps,
        "allocated_bytes_empty": allocated_empty,
        "allocated_bytes_per_node": allocated_empty / args.num_nodes,
        "allocated_bytes_full": window.index.allocated_bytes,
        "rss_added_bytes": made - before,
        "rss_added_bytes_per_node": (made - before) / args.num_nodes,
        "rss_full_window_added_bytes": filled - before,  # with the window's own batch tensors
        "median_ms": {name: 1e3 * statistics.median(samples) for name, samples in times.items()},
        "machine": machine_info(),
    }
    print(f"window index over {args.num_nodes:,} nodes: {allocated_empty / 2**20:.1f} MiB allocated "
          f"({result['allocated_bytes_per_node']:.2f} B/node), RSS +{result['rss_added_bytes'] / 2**20:.1f} MiB "
          f"({result['rss_added_bytes_per_node']:.2f} B/node); full window of {args.window} x {args.batch:,} ids: "
          f"{result['allocated_bytes_full'] / 2**20:.1f} MiB allocated, RSS +{(filled - before) / 2**20:.1f} MiB")
    print("median ms: " + ", ".join(f"{k} {v:.3f}" for k, v in result["median_ms"].items())
          + f"  (scan of {args.lines:,} lines, 1 thread)")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
