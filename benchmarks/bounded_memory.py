"""Bounded memory: a training process's memory against the size of its graph, with the cache fixed.

The same training run (hybrid cache of a fixed ``--capacity`` in bytes, the
batches of benchmarks/out_of_core.py) on generated graphs of growing size
(``--sizes``, 1 KiB feature rows), each run a child process in a fresh
memory cgroup as large as RAM (no cap: its peak is measured, not forced).
Reported per size: the peak of the process's anonymous memory (heap and
tensors: what the kernel can never drop, sampled every 50 ms), its peak
resident set (VmHWM: also the mapped file pages), the cgroup's peak (the
page cache it filled included) and, from those, the bytes per node that
grow with the graph (a least-squares slope over the sizes). A second part
trains several epochs on the smallest graph and notes the anonymous memory
after each: what grows from epoch to epoch is a leak.

    python benchmarks/bounded_memory.py            # 0.5M..4M nodes and 4 epochs: ~6 min on 2 cores
    python benchmarks/bounded_memory.py --quick    # a smoke run
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from lsm_gnn.testing.benchmarking import load_script, machine_info, write_json

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 2**20


def out_of_core():
    return load_script(os.path.join(HERE, "out_of_core.py"))


def child_args(args, data: str, num_nodes: int, iterations: int, extra: list[str]) -> argparse.Namespace:
    """benchmarks/out_of_core.py's settings for one run of its hybrid method on ``data``."""
    base = out_of_core().parse_args(["--data", data, "--num-nodes", str(num_nodes), "--capacity", args.capacity,
                                     "--iterations", str(iterations), "--batch-size", str(args.batch_size)])
    base.set = extra
    base.timeout = args.timeout
    return base


def run(args, data: str, num_nodes: int, iterations: int, extra=()) -> dict:
    ooc = out_of_core()
    ds = load_script(os.path.join(HERE, "end_to_end.py")).ensure_graph(data, num_nodes, 256)
    result = ooc.run_method(child_args(args, data, num_nodes, iterations, list(extra)), "hybrid", ooc.ram_bytes())
    result["num_nodes"] = ds.num_nodes
    result["feature_file_bytes"] = ds.features.file_bytes
    if result["failed"]:
        raise RuntimeError(f"the run on {data} failed: {result['stderr_tail'][-2000:]}")
    return result


def slope_bytes_per_node(nodes, values) -> float:
    """Least-squares slope of ``values`` over ``nodes``."""
    return float(np.polyfit(np.asarray(nodes, dtype=np.float64), np.asarray(values, dtype=np.float64), 1)[0])


def sweep(args) -> dict:
    rows = []
    for n in args.sizes:
        r = run(args, os.path.join(args.data_root, f"synth-{n}"), n, args.iterations)
        row = {"num_nodes": n, "feature_file_bytes": r["feature_file_bytes"],
               "peak_rss_anon": r["process_peak"]["rss_anon"], "peak_rss": r["process_peak"]["rss_hwm"],
               "cgroup_peak": r["peak_bytes"], "cgroup_stat_at_end": r["cgroup_stat_at_end"],
               "hit_ratio": r["hit_ratio"], "features": r["features"]}
        rows.append(row)
        print(f"{n:>10,} nodes  file {row['feature_file_bytes'] / MiB:7.0f} MiB  anon peak "
              f"{row['peak_rss_anon'] / MiB:6.0f} MiB  rss peak {row['peak_rss'] / MiB:6.0f} MiB  cgroup peak "
              f"{row['cgroup_peak'] / MiB:6.0f} MiB", file=sys.stderr)
    nodes = [r["num_nodes"] for r in rows]
    slopes = {key: slope_bytes_per_node(nodes, [r[key] for r in rows]) if len(rows) > 1 else None
              for key in ("peak_rss_anon", "peak_rss", "cgroup_peak")}
    return {"rows": rows, "bytes_per_node": slopes}


def epochs(args) -> dict:
    n = args.sizes[0]
    extra = [f"train.epochs={args.epochs}", "train.max_iterations=0", "train.eval_splits=[val]",
             f"sampler.batch_size={args.epoch_batch_size}"]
    r = run(args, os.path.join(args.data_root, f"synth-{n}"), n, 0, extra)
    anon = [m["rss_anon"] for m in r["epoch_memory"]]
    for k, a in enumerate(anon):
        print(f"after epoch {k}: anon {a / MiB:7.1f} MiB", file=sys.stderr)
    return {"num_nodes": n, "epochs": args.epochs, "batch_size": args.epoch_batch_size,
            "iterations": r["iterations"], "anon_after_epoch": anon,
            "growth_per_epoch_after_first": (anon[-1] - anon[0]) / (len(anon) - 1) if len(anon) > 1 else None}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-root", default="/tmp/lsm-gnn-bench", help="where the graphs synth-<nodes> are (reused)")
    p.add_argument("--sizes", default="500000,1000000,2000000,4000000", help="node counts, comma-separated")
    p.add_argument("--capacity", default="128M", help="the fixed cache size, in bytes")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--epochs", type=int, default=4, help="epochs of the leak check, on the smallest graph")
    p.add_argument("--epoch-batch-size", type=int, default=4096, help="a short epoch for the leak check")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--json", default="docs/results/bounded_memory.json")
    p.add_argument("--quick", action="store_true", help="two small graphs, two epochs")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.capacity, args.iterations, args.epochs, args.epoch_batch_size = "20000,40000", "8M", 5, 2, 256
    args.sizes = [int(float(s)) for s in args.sizes.split(",") if s]
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    result = {"settings": vars(args), "machine": {**machine_info(), "load_before": os.getloadavg()},
              "sweep": sweep(args), "epochs": epochs(args)}
    result["machine"]["load_after"] = os.getloadavg()
    if args.json:
        write_json(args.json, result)
    per_node = result["sweep"]["bytes_per_node"]
    print("bytes per node that grow with the graph: " +
          ", ".join(f"{k} {v:.1f}" for k, v in per_node.items() if v is not None))
    print(f"anon growth per epoch after the first: {result['epochs']['growth_per_epoch_after_first']}")
    return result


if __name__ == "__main__":
    main()
