"""At the paper's dataset shape: an IGB-medium-shaped graph trained for a measured slice of an epoch under a memory
cap of at most a quarter of its feature file, with the planner's prediction of that slice and of the whole epoch
beside the measurement.

    # the graph: 10M nodes, about 120M edges, 1,024 float32 features (38 GiB), 19 classes; its generation timed
    # phase by phase, with its peak memory
    python benchmarks/generate_scale.py --num-nodes 1e7 --out /data/igbm \\
        --json docs/results/paper/igb_medium_generate.json -- --feature-dim 1024 --avg-degree 12.4 --classes 19
    python -m benchmarks.paper.igb_medium --data /data/igbm --cap 9G --out docs/results/paper
    python -m benchmarks.paper.igb_medium --quick --out /tmp/igbm    # a tiny graph: the code path, not the numbers
    # the whole epoch measured beside its prediction (about 70 minutes here: its plan 19, the epoch 47):
    # one plan, the epoch's
    python -m benchmarks.paper.igb_medium --data /data/igbm --cap 9G --whole-epoch --timeout 5400 \
        --out docs/results/paper/igb_medium_epoch

The run is the paper's configuration for IGB-medium (``configs/default.yaml``: the paper's fanouts, batch and
policy, with the 4 GB of cache per GPU the paper gives IGB-medium; GraphSAGE instead of its GAT, see ``RUN``), features read from the SSD through the cache with
``data.verify=sampled`` (the run checks what it reads against the dataset's block checksums), in a child process
whose memory cgroup counts the page cache. Before it, ``lsm_gnn.planner.make_plan`` (what ``lsm-gnn plan`` runs)
predicts the slice (``--iterations``) and, from the same calibration, the whole epoch. Writes
``igb_medium.json``, the run's own log (``igb_medium_run.log``) and its metrics of every iteration
(``igb_medium_metrics.jsonl``) into ``--out``.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import time

from lsm_gnn.utils.units import format_bytes, parse_bytes

RESULT = "IGB_MEDIUM_RESULT "  # the child's JSON line starts with this
#: the run: the paper's sampler, batch and policy (configs/default.yaml) and its cache for IGB-medium (4 GB per GPU);
#: GraphSAGE where the paper trains GAT-512: on 2 CPU cores a GAT-512 step of this batch takes about 4 s (the
#: planner's calibration), which would hide the reads this run is about behind training
RUN = ["model.kind=sage", "model.hidden=256", "cache.capacity=4G", "cache.backend=io_uring", "data.verify=sampled", "train.eval_splits=[]",
       "log.progress=false", "checkpoint.dir="]
QUICK = ["model.hidden=32", "model.heads=2", "sampler.batch_size=64", "cache.capacity=25%", "cache.window=8"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.paper.igb_medium", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="the generated IGB-medium-shaped dataset (see above)")
    p.add_argument("--out", required=True, help="directory for igb_medium.json and the run's log")
    p.add_argument("--cap", default="8G", help="the run's memory cap, page cache included: at most a quarter of "
                                                "the feature file (default 8G)")
    p.add_argument("--iterations", type=int, default=100, help="the measured slice of the epoch")
    p.add_argument("--whole-epoch", action="store_true",
                   help="measure the whole epoch instead of a slice (--iterations is ignored); one plan, the epoch's")
    p.add_argument("--epoch-iterations", type=int, default=None,
                   help="how many of the epoch's iterations the epoch's plan models (default: the planner's rule, "
                        "at least one whole epoch)")
    p.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "..", "..", "configs",
                                                    "default.yaml"))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override (repeatable)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds before the measured run is killed")
    p.add_argument("--quick", action="store_true", help="a tiny generated graph: checks the code path")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.quick and not args.data and not args.child:
        p.error("--data: give the generated IGB-medium-shaped dataset (the module's help says how to make it), "
                "or --quick")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        p.error(f"--out {args.out} is a file; give a directory (it is made if missing)")
    if args.quick:
        args.iterations = min(args.iterations, 20)
    return args


def overrides(args, iterations: int | None) -> list[str]:
    limit = [] if iterations is None else [f"train.max_iterations={iterations}"]
    return [f"dataset={args.data}", *RUN, *(QUICK if args.quick else []), *limit, f"log.dir={args.log_dir}",
            *args.set]


def quick_dataset(out_dir: str) -> str:
    """A 20,000-node graph of 64 float32 columns under ``out_dir`` (made once)."""
    from lsm_gnn.data.synthetic import generate_synthetic
    from lsm_gnn.testing.benchmarking import reusable_dataset

    path = os.path.join(out_dir, "igb-medium-quick")
    if reusable_dataset(path, num_nodes=20_000, feature_dim=64) is None:
        generate_synthetic(path, num_nodes=20_000, avg_degree=12.4, feature_dim=64, num_classes=19, seed=0)
    return path


def run_child(spec: dict) -> None:
    """The measured slice, in this process (the parent put it in the cgroup): the run's log to stdout, then one
    JSON line of its figures."""
    from lsm_gnn.config import load_config
    from lsm_gnn.training.trainer import Trainer

    cfg = load_config(spec["config"], spec["overrides"])
    started = time.perf_counter()
    result = Trainer(cfg, out=sys.stdout).fit()
    last = result["history"][-1]
    n = result["iterations"]
    figures = {"iterations": n, "wall_s": result["wall_s"], "ms_per_iteration": 1e3 * result["wall_s"] / n,
               "stages_ms": {k: 1e3 * v / n for k, v in result["stages_s"].items()},
               "hit_ratio": last["hit_ratio"], "bytes_read": last["bytes_read"], "loss": last["loss"],
               "process_s": time.perf_counter() - started}
    print(RESULT + json.dumps(figures), flush=True)


def plan(cfg, iterations: int | None, calibration: str, recalibrate: bool) -> dict:
    from lsm_gnn.planner import make_plan, one_type_view

    out = one_type_view(make_plan(cfg, sizes=[cfg.cache.capacity], policies=[cfg.cache.policy], pvp=[cfg.cache.pvp],
                                  iterations=iterations, calibration_file=calibration, recalibrate=recalibrate,
                                  log=lambda m: print(f"  {m}", file=sys.stderr)))
    row = out["rows"][0]
    if "error" in row:
        raise SystemExit(f"the planner says the run cannot start: {row['error']}")
    return {"ms_per_iteration": row["ms_per_iteration"], "steady_ms": row["steady_ms"],
            "stages_ms": row["stages_ms"], "hit_ratio": row["hit_ratio"], "bytes_read": row["bytes_read"],
            "bound": row["bound"], "modelled_iterations": out["run"]["iterations"],
            "run_iterations": out["run"]["run_iterations"], "calibration": out["calibration"]}


def measure(args, cfg_overrides: list[str], cap: int) -> dict:
    """The slice as a child process in a fresh memory cgroup of ``cap`` bytes, every dataset file dropped from
    the page cache first (a cold start); the run's log goes to ``igb_medium_run.log``, its metrics of every
    iteration to ``igb_medium_metrics.jsonl``."""
    from benchmarks.out_of_core import evict_dataset
    from lsm_gnn.utils.memcap import MemoryCap

    evict_dataset(args.data)
    shutil.rmtree(args.log_dir, ignore_errors=True)  # this module's own log directory: a fresh metrics.jsonl
    spec = json.dumps({"config": args.config, "overrides": cfg_overrides})
    cmd = [sys.executable, "-m", "benchmarks.paper.igb_medium", "--out", args.out, "--child", spec]
    with MemoryCap(cap) as cgroup:
        run = cgroup.run(cmd, timeout=args.timeout)
    log_path = os.path.join(args.out, "igb_medium_run.log")
    with open(log_path, "w") as f:
        f.write(run.stdout + ("\n--- stderr ---\n" + run.stderr if run.stderr.strip() else ""))
    metrics = os.path.join(args.log_dir, "metrics.jsonl")
    if os.path.exists(metrics):  # every iteration's loss, hit ratio, bytes and stages
        shutil.copyfile(metrics, os.path.join(args.out, "igb_medium_metrics.jsonl"))
    line = next((ln for ln in reversed(run.stdout.splitlines()) if ln.startswith(RESULT)), None)
    if run.returncode != 0 or line is None:
        why = "killed for memory" if run.oom_killed else f"timed out after {args.timeout:g} s" if run.timed_out \
            else f"exit status {run.returncode}"
        raise SystemExit(f"the measured run failed ({why}); its log: {log_path}\n{run.stderr[-2000:]}")
    return {**json.loads(line[len(RESULT):]), "cap_bytes": cap, "peak_bytes": run.peak_bytes,
            "oom_killed": run.oom_killed, "log": os.path.basename(log_path)}


def error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


def duration(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min" if seconds >= 60 \
        else f"{seconds:.1f} s"


def report(r: dict) -> str:
    s, e, m = r["predicted_slice"], r["predicted_epoch"], r["measured"]
    per_epoch = e["run_iterations"]
    lines = [f"dataset: {r['dataset']['num_nodes']:,} nodes, {r['dataset']['num_edges']:,} edges, "
             f"{format_bytes(r['dataset']['feature_bytes'])} of features; cap {format_bytes(m['cap_bytes'])} "
             f"({m['cap_bytes'] / r['dataset']['feature_bytes']:.1%} of the feature file), peak "
             f"{format_bytes(m['peak_bytes'])}",
             "| | ms/iteration | hit ratio | read/iteration | bound |", "|---|---|---|---|---|"]
    what = "the whole epoch" if r.get("whole_epoch") else "the slice"
    lines += [f"| planner, {what} ({s['modelled_iterations']:,} iterations) | {s['ms_per_iteration']:.0f} | "
              f"{s['hit_ratio']:.3f} | {format_bytes(s['bytes_read'] / s['modelled_iterations'])} | {s['bound']} |",
              f"| measured, {what} ({m['iterations']:,} iterations) | {m['ms_per_iteration']:.0f} | "
              f"{m['hit_ratio']:.3f} | {format_bytes(m['bytes_read'] / m['iterations'])} | - |"]
    if not r.get("whole_epoch"):
        lines.append(f"| planner, the whole epoch ({per_epoch:,} iterations, {e['modelled_iterations']:,} modelled) | "
                     f"{e['ms_per_iteration']:.0f} | {e['hit_ratio']:.3f} | "
                     f"{format_bytes(e['bytes_read'] / e['modelled_iterations'])} | {e['bound']} |")
    lines.append(f"{what}: the planner's ms/iteration {error(s['ms_per_iteration'], m['ms_per_iteration']):+.1%} off "
                 f"the measurement ({duration(m['wall_s'])} measured); the whole epoch predicted at "
                 f"{duration(e['ms_per_iteration'] * per_epoch / 1e3)}")
    return "\n".join(lines)


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    # the run's log directory and the plan's calibration: scratch, removed at the end (the figures keep what counts)
    args.work = os.path.join(args.out, "igb_medium-work")
    args.log_dir = os.path.join(args.work, "logs")
    if args.child:
        run_child(json.loads(args.child))
        return None
    from lsm_gnn.config import load_config
    from lsm_gnn.data import open_dataset
    from lsm_gnn.testing.benchmarking import feature_paths, machine_info, write_json

    os.makedirs(args.out, exist_ok=True)
    if args.quick:
        args.data = quick_dataset(args.out)
    dataset = open_dataset(args.data, check="fast")
    feature_bytes = sum(os.path.getsize(path) for path in feature_paths(dataset))
    cap = parse_bytes(args.cap)
    if not args.quick and cap > feature_bytes // 4:
        raise SystemExit(f"--cap {args.cap}: more than a quarter of the feature file ({format_bytes(feature_bytes)}"
                         f"); give at most {format_bytes(feature_bytes // 4)}")
    slice_iterations = None if args.whole_epoch else args.iterations
    slice_overrides = overrides(args, slice_iterations)
    cfg_slice = load_config(args.config, slice_overrides)
    calibration = os.path.join(args.work, "calibration.json")
    print(f"planning the {'whole epoch' if args.whole_epoch else f'slice ({args.iterations} iterations)'}",
          file=sys.stderr)
    t0 = time.perf_counter()
    predicted_slice = {**plan(cfg_slice, slice_iterations, calibration, recalibrate=True),
                       "plan_seconds": time.perf_counter() - t0}
    print(f"measuring the {'whole epoch' if args.whole_epoch else 'slice'} under a cap of {format_bytes(cap)}",
          file=sys.stderr)
    load_before = os.getloadavg()[0]
    measured = {**measure(args, slice_overrides, cap), "loadavg_before": load_before,
                "loadavg_after": os.getloadavg()[0]}
    if args.whole_epoch:  # the slice was the epoch: its plan is the epoch's
        predicted_epoch = predicted_slice
    else:  # the whole epoch last: the longest part (its trace samples every batch), the measurement kept first
        print("planning the whole epoch (the same calibration)", file=sys.stderr)
        t0 = time.perf_counter()
        cfg_epoch = load_config(args.config, overrides(args, None))
        predicted_epoch = {**plan(cfg_epoch, args.epoch_iterations, calibration, recalibrate=False),
                           "plan_seconds": time.perf_counter() - t0}
    result = {"dataset": {"path": os.path.abspath(args.data), "num_nodes": dataset.num_nodes,
                          "num_edges": dataset.num_edges, "feature_bytes": feature_bytes},
              "overrides": slice_overrides, "config": os.path.relpath(args.config),
              "predicted_slice": predicted_slice, "predicted_epoch": predicted_epoch, "measured": measured,
              "slice_error": error(predicted_slice["ms_per_iteration"], measured["ms_per_iteration"]),
              "whole_epoch": args.whole_epoch, "quick": args.quick, "machine": machine_info()}
    write_json(os.path.join(args.out, "igb_medium.json"), result)
    shutil.rmtree(args.work, ignore_errors=True)
    print(report(result))
    return result


if __name__ == "__main__":
    main()
