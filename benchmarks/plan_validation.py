"""The planner against measured runs: predicted vs measured ms per iteration, hit ratio and bytes read.

For each configuration (cache size, policy, row size, fanouts, PVP) the
planner (``lsm_gnn.planner.make_plan``, as ``lsm-gnn plan`` runs it) predicts
one run; then the trainer runs exactly that config (features from SSD through
the cache, page cache evicted first) ``--repeats`` times, and the medians
are set beside the prediction. Calibrations are shared between
configurations through one file, as repeated plans share them.

The load average is recorded before and after every measured run: this
machine's cores are shared, and timings move with the load.

    python benchmarks/plan_validation.py            # ~10 min on 2 cores
    python benchmarks/plan_validation.py --quick    # a smoke run
"""
from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time

from lsm_gnn.config import load_config
from lsm_gnn.planner import make_plan, one_type_view
from lsm_gnn.storage.probe import evict_page_cache
from lsm_gnn.testing.benchmarking import feature_paths, load_script, machine_info, write_json
from lsm_gnn.training.trainer import STAGES, Trainer

# name, feature dim (float32), fanouts, batch size, capacity, policy, pvp
CONFIGS = (
    ("1k-hybrid-5%", 256, "[10,5]", 256, "5%", "hybrid", False),
    ("1k-hybrid-20%", 256, "[10,5]", 256, "20%", "hybrid", False),
    ("1k-hybrid-50%", 256, "[10,5]", 256, "50%", "hybrid", False),
    ("1k-rr-20%", 256, "[10,5]", 256, "20%", "rr", False),
    ("1k-static-20%", 256, "[10,5]", 256, "20%", "static", False),
    ("1k-hybrid+pvp-20%", 256, "[10,5]", 256, "20%", "auto", True),
    ("1k-f15,10-hybrid-20%", 256, "[15,10]", 256, "20%", "hybrid", False),
    ("4k-hybrid-10%", 1024, "[10,5]", 256, "10%", "hybrid", False),
    ("4k-rr-30%", 1024, "[10,5]", 256, "30%", "rr", False),
    ("128B-hybrid-10%", 32, "[10,5]", 512, "10%", "hybrid", False),
)


def ensure_graph(root: str, num_nodes: int, dim: int):
    end_to_end = load_script(os.path.join(os.path.dirname(os.path.abspath(__file__)), "end_to_end.py"))
    return end_to_end.ensure_graph(os.path.join(root, f"g{num_nodes}-d{dim}"), num_nodes, dim)


def run_config(args, ds, fanouts: str, batch: int, capacity: str, policy: str, pvp: bool):
    return load_config(None, [f"dataset={ds.path}", f"model.kind={args.model}", f"model.hidden={args.hidden}",
                              f"sampler.fanouts={fanouts}", f"sampler.batch_size={batch}",
                              f"cache.capacity={capacity}", f"cache.policy={policy}", f"cache.pvp={str(pvp).lower()}",
                              f"cache.window={args.window}", f"cache.pvp_queue_capacity={args.pvp_queue_capacity}",
                              f"train.max_iterations={args.iterations}", "train.eval_splits=[]",
                              "log.progress=false", "train.lr=0.003", "cache.backend=io_uring",
                              # Read-ahead off, in the plan and the run alike: with it a run's bytes read are not
                              # the plan's per lookup (docs/planner.md), and this validation checks them exactly.
                              "cache.read_ahead=0"])


def measure(cfg, ds) -> dict:
    """One real run of ``cfg``, cold: the trainer's wall time, stages, hit ratio and bytes read."""
    for path in feature_paths(ds):
        evict_page_cache(path)
    load_before = os.getloadavg()[0]
    result = Trainer(cfg, out=io.StringIO()).fit()
    if len(result["history"]) != 1:  # one epoch summary holds the run's hit ratio and bytes
        raise RuntimeError("a validation run must stay within one epoch; lower --iterations")
    last = result["history"][0]
    n = result["iterations"]
    return {"ms_per_iteration": 1e3 * result["wall_s"] / n, "stages_ms": {k: 1e3 * v / n for k, v in
                                                                           result["stages_s"].items()},
            "hit_ratio": last["hit_ratio"], "bytes_read": last["bytes_read"], "iterations": n,
            "loadavg_before": load_before, "loadavg_after": os.getloadavg()[0]}


def median_of(runs: list[dict]) -> dict:
    return {"ms_per_iteration": statistics.median(r["ms_per_iteration"] for r in runs),
            "stages_ms": {k: statistics.median(r["stages_ms"][k] for r in runs) for k in STAGES},
            "hit_ratio": statistics.median(r["hit_ratio"] for r in runs),
            "bytes_read": statistics.median(r["bytes_read"] for r in runs),
            "loadavg": statistics.median(r["loadavg_before"] for r in runs), "repeats": len(runs)}


def relative_error(predicted: float, measured: float) -> float | None:
    return None if not measured else (predicted - measured) / measured


def table(results: list[dict]) -> str:
    lines = [f"{'config':<22}{'hit pred':>9}{'meas':>7}{'MiB pred':>10}{'meas':>8}{'ms pred':>9}{'meas':>8}"
             f"{'error':>8}{'bound':>7}{'load':>6}"]
    for r in results:
        p, m = r["predicted"], r["measured"]
        lines.append(f"{r['name']:<22}{p['hit_ratio']:>9.3f}{m['hit_ratio']:>7.3f}{p['bytes_read'] / 2**20:>10.1f}"
                     f"{m['bytes_read'] / 2**20:>8.1f}{p['ms_per_iteration']:>9.1f}{m['ms_per_iteration']:>8.1f}"
                     f"{r['error']['ms_per_iteration']:>+8.1%}{p['bound']:>7}{m['loadavg']:>6.2f}")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="/tmp/lsm-gnn-bench/plan", help="directory of the generated graphs (reused)")
    p.add_argument("--num-nodes", type=int, default=100_000)
    p.add_argument("--model", default="sage")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--window", type=int, default=32)
    p.add_argument("--pvp-queue-capacity", type=int, default=512)
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--configs", default="", help="comma-separated names (default: all)")
    p.add_argument("--calibration", default=None, help="calibration file (default: one under --data)")
    p.add_argument("--reuse-calibration", action="store_true",
                   help="calibrate once and reuse it (default: calibrate again before every measured run)")
    p.add_argument("--json", default="docs/results/plan_validation.json")
    p.add_argument("--quick", action="store_true", help="small graph, few iterations, one repeat")
    args = p.parse_args(argv)
    if args.quick:
        args.num_nodes, args.iterations, args.repeats, args.window = 20_000, 10, 1, 8
        args.data = args.data + "-quick"
    names = [c[0] for c in CONFIGS]
    args.configs = [c for c in args.configs.split(",") if c] or names
    bad = [c for c in args.configs if c not in names]
    if bad:
        p.error(f"unknown configs {bad}; valid: {', '.join(names)}")
    args.calibration = args.calibration or os.path.join(args.data, "plan-calibration.json")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    results = []
    for name, dim, fanouts, batch, capacity, policy, pvp in (c for c in CONFIGS if c[0] in args.configs):
        ds = ensure_graph(args.data, args.num_nodes, dim)
        batch = batch // 8 if args.quick else batch  # the small graph's caches must hold a batch
        cfg = run_config(args, ds, fanouts, batch, capacity, policy, pvp)
        plans, runs = [], []
        for _ in range(args.repeats):  # calibrated right before each run: both see the same load
            t0 = time.perf_counter()
            plan = one_type_view(make_plan(cfg, sizes=[capacity], policies=[policy], pvp=[pvp],
                                           iterations=args.iterations, calibration_file=args.calibration,
                                           recalibrate=not args.reuse_calibration, log=lambda m: None))
            row = plan["rows"][0]
            if "error" in row:
                raise RuntimeError(f"{name}: the planner says the run cannot start: {row['error']}")
            plans.append({**row, "plan_seconds": time.perf_counter() - t0, "calibration": plan["calibration"]})
            runs.append(measure(cfg, ds))
        measured = median_of(runs)
        row = plans[0]
        predicted = {"ms_per_iteration": statistics.median(p["ms_per_iteration"] for p in plans),
                     "steady_ms": statistics.median(p["steady_ms"] for p in plans),
                     "stages_ms": {k: statistics.median(p["stages_ms"][k] for p in plans) for k in row["stages_ms"]},
                     "hit_ratio": row["hit_ratio"], "bytes_read": row["bytes_read"],
                     "bound": row["bound"], "plan_seconds": statistics.median(p["plan_seconds"] for p in plans)}
        result = {"name": name, "settings": {"feature_dim": dim, "row_bytes": ds.features.row_bytes,
                                             "fanouts": fanouts, "batch_size": batch, "capacity": capacity,
                                             "policy": row["policy"], "pvp": pvp},
                  "predicted": predicted, "measured": measured, "plans": plans, "runs": runs,
                  "error": {k: relative_error(predicted[k], measured[k])
                            for k in ("ms_per_iteration", "hit_ratio", "bytes_read")}}
        results.append(result)
        print(f"{name}: predicted {predicted['ms_per_iteration']:.1f} ms/it, measured "
              f"{measured['ms_per_iteration']:.1f} ({result['error']['ms_per_iteration']:+.1%}), hit "
              f"{predicted['hit_ratio']:.3f} vs {measured['hit_ratio']:.3f}, load {measured['loadavg']:.2f}",
              file=sys.stderr)
    errors = [abs(r["error"]["ms_per_iteration"]) for r in results]
    summary = {"configs": len(results), "median_abs_error_ms": statistics.median(errors),
               "max_abs_error_ms": max(errors), "within_20pct": sum(e <= 0.2 for e in errors)}
    out = {"settings": {k: v for k, v in vars(args).items() if k != "json"}, "machine": machine_info(),
           "results": results, "summary": summary}
    if args.json:
        write_json(args.json, out)
    print(table(results))
    print(f"|error| of ms/iteration: median {summary['median_abs_error_ms']:.1%}, max {summary['max_abs_error_ms']:.1%}"
          f", {summary['within_20pct']}/{summary['configs']} within 20%")
    return out


if __name__ == "__main__":
    main()
