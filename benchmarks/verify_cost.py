"""What checking the data costs a training run: ``data.verify=off``, ``sampled`` (the default) and
``checksums``, side by side on the demo job.

Each run is the README's main job (``configs/demo.yaml``: GraphSAGE, fanouts 10,5, batches of 512, a hybrid
cache of 10% of the nodes, features read from the file) on the demo graph (200k nodes, 128 float32 features:
a 98 MiB feature file), stopped after ``--iterations`` with no evaluation, checkpoint or log, as a fresh
``lsm-gnn train`` process. The modes run in a rotated order in each repeat; figures are medians of the
repeats. ``ms/it`` is the run's wall time over its iterations (the trainer's ``wall_s``), which includes a
final wait for the checks still queued; ``verify read`` is what the check read beside the run.

    python benchmarks/verify_cost.py            # ~5 minutes on 2 cores
    python benchmarks/verify_cost.py --quick    # a smoke run
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from lsm_gnn.testing.benchmarking import machine_info, reusable_dataset, write_json  # noqa: E402

MODES = ("off", "sampled", "checksums")


def dataset(path: str, num_nodes: int) -> str:
    ds = reusable_dataset(path, num_nodes=num_nodes, feature_dim=128)
    if ds is None or "block_checksums" not in ds.meta:  # one written before block checksums cannot be sampled
        subprocess.run([sys.executable, "-m", "lsm_gnn", "prepare", "synthetic", "--out", path, "--num-nodes",
                        str(num_nodes), "--avg-degree", "10", "--feature-dim", "128", "--overwrite"],
                       cwd=ROOT, check=True, env=dict(os.environ, PYTHONPATH=ROOT))
    return path


def run(data: str, mode: str, iterations: int, out_dir: str, extra: tuple = ()) -> dict:
    out = os.path.join(out_dir, f"{mode}.json")
    if os.path.exists(out):
        os.remove(out)
    subprocess.run([sys.executable, "-m", "lsm_gnn", "train", os.path.join(ROOT, "configs", "demo.yaml"),
                    f"dataset={data}", f"data.verify={mode}", f"train.max_iterations={iterations}",
                    "train.eval_splits=[]", "checkpoint.dir=", "log.dir=", "log.progress=false", *extra, "--json", out],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=ROOT))
    with open(out) as fh:
        result = json.load(fh)
    verify = result.get("data_verify", {})
    return {"ms_per_it": 1000 * result["wall_s"] / result["iterations"], "iterations": result["iterations"],
            "verify_bytes": verify.get("bytes_read", 0), "blocks_checked": verify.get("blocks_checked", 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default=os.path.join(ROOT, "data", "demo"))
    parser.add_argument("--iterations", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a smoke run: a small graph, few iterations")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "verify_cost.json"))
    args = parser.parse_args()
    num_nodes = 200_000
    if args.quick:
        args.dataset, num_nodes, args.iterations, args.repeats = (
            os.path.join(tempfile.gettempdir(), "lsm-gnn-verify-quick"), 20_000, 10, 1)
        args.out = os.path.join(tempfile.gettempdir(), "verify_cost_quick.json")
    data = dataset(args.dataset, num_nodes)
    extra = ("cache.capacity=40%",) if args.quick else ()  # the small graph's batches need a larger share
    runs = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as out_dir:
        for repeat in range(args.repeats):
            order = MODES[repeat % len(MODES):] + MODES[:repeat % len(MODES)]
            for mode in order:
                runs[mode].append(run(data, mode, args.iterations, out_dir, extra))
                print(f"repeat {repeat} {mode:9s} {runs[mode][-1]['ms_per_it']:7.1f} ms/it", flush=True)
    medians = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()}
    off = medians["off"]["ms_per_it"]
    print(f"\n{'data.verify':12s} {'ms/it':>8s} {'vs off':>7s} {'verify read':>12s} {'blocks':>7s}")
    for mode, m in medians.items():
        print(f"{mode:12s} {m['ms_per_it']:8.1f} {m['ms_per_it'] / off:6.3f}x {m['verify_bytes'] / 2**20:9.1f} MiB "
              f"{m['blocks_checked']:7.0f}")
    write_json(args.out, {"machine": machine_info(), "iterations": args.iterations, "repeats": args.repeats,
                          "dataset": data, "runs": runs, "medians": medians})
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
