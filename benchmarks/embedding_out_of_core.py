"""Node embeddings out of core: a table several times a memory cap, trained through the write-back cache.

A user-item graph whose nodes carry no features trains ``model.node_embedding`` (link prediction, BPR),
two ways, with the same seed, batches and iterations (the losses prove it):

  disk     the table on disk behind a cache of ``--capacity`` of its rows, inside a memory cgroup of
           ``--cap`` (page cache included; :class:`lsm_gnn.utils.memcap.MemoryCap`) that the table exceeds
           several times over
  memory   the table held in memory: a cache of every row (``capacity=100%``), nothing written back before
           the end, uncapped (a cgroup as large as RAM, only to measure its peak)

Each run makes its own table (in its own directory, before training) and starts cold (the dataset's files
dropped from the page cache). Reported per method: ms per iteration by stage (``embedding`` reads the rows,
``write-back`` is the part of it that writes dirty victims, ``update`` is the optimizer step), the table's
bytes read and written per iteration, the cgroup's peak, the table's final bytes (a digest: both methods
must end with the same table) and recall@20 on every ``--eval-stride``-th test user. Figures are medians
over ``--repeats``, the order rotated; ratios disk/memory are taken within each repeat.

    python benchmarks/embedding_out_of_core.py            # a 2.9 GiB table under a 1 GiB cap, ~20 min on 2 cores
    python benchmarks/embedding_out_of_core.py --quick    # a smoke run: seconds
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import statistics
import sys
import tempfile

from lsm_gnn.testing.benchmarking import load_script, machine_info, write_json
from lsm_gnn.utils.units import parse_bytes

METHODS = ("disk", "memory")
RESULT = "EMBEDDING_OOC_RESULT "  # the child's JSON line starts with this
HERE = os.path.dirname(os.path.abspath(__file__))
STAGES = ("sample", "wait", "train", "embedding", "write-back", "update")


def _harness():
    """benchmarks/out_of_core.py: dropping files from the page cache, RAM size, reading a child's result."""
    return load_script(os.path.join(HERE, "out_of_core.py"))


def overrides_for(args, method: str, run_dir: str) -> list[str]:
    capacity = "100%" if method == "memory" else args.capacity
    return [f"dataset={args.data}", "train.task=link", "model.kind=sage", f"model.hidden={args.dim}",
            f"sampler.fanouts={args.fanouts}", f"sampler.batch_size={args.batch_size}",
            f"train.max_iterations={args.iterations}", "train.eval_splits=[]", "log.progress=false",
            f"model.node_embedding.dim={args.dim}", "model.node_embedding.features=false",
            "model.node_embedding.lr=0.05", f"model.node_embedding.capacity={capacity}",
            f"checkpoint.dir={run_dir}", "cache.backend=io_uring", *args.set]


def table_digest(path: str) -> str:
    digest = hashlib.sha256()
    with open(os.path.join(path, "table.bin"), "rb") as fh:
        while block := fh.read(16 << 20):
            digest.update(block)
    return digest.hexdigest()[:16]


def run_child(args, method: str) -> dict:
    """Trains ``method`` in this process (inside the parent's cgroup) and returns its figures."""
    import numpy as np

    from lsm_gnn.config import load_config
    from lsm_gnn.tasks.link_prediction import ranking_sums
    from lsm_gnn.training.trainer import Trainer

    run_dir = tempfile.mkdtemp(prefix=f"emb-{method}-", dir=args.work)
    try:
        trainer = Trainer(load_config(None, overrides_for(args, method, run_dir)), out=io.StringIO())
        result = trainer.fit()
        cfg = trainer.cfg
        # recall@20 on every --eval-stride-th test user (a fixed sample), read through the run's own path
        sums, users = ranking_sums(trainer.module, trainer.dataset, trainer.features, cfg.sampler.fanouts, k=20,
                                   split="test", batch_size=args.batch_size, rank=0, world_size=args.eval_stride,
                                   window=cfg.cache.window, seed=cfg.train.seed + 1)
        (embedding,) = trainer.embeddings.values()
        embedding.close()
        last = result["history"][-1]
        losses = [record["loss"] for record in result["history"]]
        return {"method": method, "iterations": result["iterations"], "wall_s": result["wall_s"],
                "stages_s": result["stages_s"], "loss": last["loss"], "losses": losses,
                "table_bytes_read": last.get("embedding_bytes_read"),
                "table_bytes_written": last.get("embedding_bytes_written"),
                "recall@20": sums["recall"] / users if users else float("nan"), "eval_users": users,
                "table": table_digest(os.path.join(run_dir, "node_embedding")),
                "table_size": os.path.getsize(os.path.join(run_dir, "node_embedding", "table.bin")),
                "embedding": embedding.describe(), "loss_mean": float(np.mean(losses))}
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def run_method(args, method: str) -> dict:
    from lsm_gnn.utils.memcap import MemoryCap

    harness = _harness()
    harness.evict_dataset(args.data)
    limit = harness.ram_bytes() if method == "memory" else args.cap_bytes
    spec = json.dumps(vars(args))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", method, "--child-spec", spec]
    # One malloc arena, large blocks returned on free: what docs/training.md advises under a tight cap. One
    # OpenMP thread per op: with two, link training on this graph is not bit-reproducible from run to run (with
    # or without node embeddings; docs/benchmarks/embeddings.md), and the two methods must be shown to train alike.
    env = dict(os.environ, MALLOC_ARENA_MAX="1", MALLOC_MMAP_THRESHOLD_="1048576", OMP_NUM_THREADS="1")
    with MemoryCap(limit) as cap:
        run = cap.run(cmd, timeout=args.timeout, env=env)
    out = {"method": method, "limit_bytes": limit, "capped": method != "memory", "peak_bytes": run.peak_bytes,
           "oom_killed": run.oom_killed, "returncode": run.returncode}
    line = next((ln for ln in reversed(run.stdout.splitlines()) if ln.startswith(RESULT)), None)
    if run.returncode != 0 or line is None:
        return {**out, "failed": True, "stderr_tail": run.stderr[-3000:]}
    return {**json.loads(line[len(RESULT):]), **out, "failed": False}


def ms(run: dict, stage: str | None = None) -> float:
    seconds = run["wall_s"] if stage is None else run["stages_s"].get(stage, 0.0)
    return 1e3 * seconds / run["iterations"]


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if not r["failed"]]
    out = {}
    for method in METHODS:
        mine = [r for r in ok if r["method"] == method]
        if not mine:
            continue
        out[method] = {"runs": len(mine),
                       "ms_per_iter": statistics.median(ms(r) for r in mine),
                       "stages_ms": {s: statistics.median(ms(r, s) for r in mine) for s in STAGES},
                       "table_read_per_iter": statistics.median(r["table_bytes_read"] / r["iterations"] for r in mine),
                       "table_written_per_iter": statistics.median(r["table_bytes_written"] / r["iterations"]
                                                                   for r in mine),
                       "peak_bytes": max(r["peak_bytes"] for r in mine),
                       "recall@20": mine[0]["recall@20"], "eval_users": mine[0]["eval_users"],
                       "tables": sorted({r["table"] for r in mine}), "table_size": mine[0]["table_size"],
                       "losses": mine[0]["losses"]}
    ratios = []
    for rep in sorted({r["repeat"] for r in ok}):
        pair = {r["method"]: r for r in ok if r["repeat"] == rep}
        if len(pair) == 2:
            ratios.append(ms(pair["disk"]) / ms(pair["memory"]))
    out["disk_over_memory"] = statistics.median(ratios) if ratios else None
    out["same_training"] = len({json.dumps(r["losses"]) for r in ok}) == 1 and len({r["table"] for r in ok}) == 1
    out["same_recall"] = len({r["recall@20"] for r in ok}) == 1
    return out


def print_summary(summary: dict, args) -> None:
    print(f"\n{args.dim}-value embeddings + adagrad state, table {summary['disk']['table_size'] / 2**30:.2f} GiB; "
          f"disk: a {args.capacity} cache under a {args.cap} cap; memory: every row cached, uncapped")
    print(f"{'method':<8}{'ms/it':>8}" + "".join(f"{s:>11}" for s in STAGES)
          + f"{'read/it':>10}{'written/it':>11}{'peak MiB':>10}{'recall@20':>11}")
    for method in METHODS:
        m = summary.get(method)
        if m is None:
            continue
        print(f"{method:<8}{m['ms_per_iter']:>8.1f}" + "".join(f"{m['stages_ms'][s]:>11.1f}" for s in STAGES)
              + f"{m['table_read_per_iter'] / 2**20:>9.2f}M{m['table_written_per_iter'] / 2**20:>10.2f}M"
              + f"{m['peak_bytes'] / 2**20:>10.0f}{m['recall@20']:>11.4f}")
    print(f"disk / memory (median of per-repeat ratios): {summary['disk_over_memory']:.2f}x; identical losses and "
          f"tables: {summary['same_training']}; identical recall@20: {summary['same_recall']}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="/work/bench-data/emb-ui", help="the user-item dataset (made if missing)")
    p.add_argument("--work", default=None, help="where each run's table goes (default: beside --data)")
    p.add_argument("--num-users", type=float, default=2.9e6)
    p.add_argument("--num-items", type=float, default=2e4)
    p.add_argument("--avg-interactions", type=float, default=3)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--cap", default="1G", help="the disk run's memory cgroup limit")
    p.add_argument("--capacity", default="5%", help="the disk run's embedding cache, a share of the table's rows")
    p.add_argument("--fanouts", default="[5,5]")
    p.add_argument("--batch-size", type=int, default=256, help="training edges per batch")
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--eval-stride", type=int, default=500, help="recall@20 on every N-th test user")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra config overrides")
    p.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "docs", "results",
                                                 "embedding_out_of_core.json"))
    p.add_argument("--quick", action="store_true", help="a smoke run: a small graph, 1 repeat, seconds")
    p.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    p.add_argument("--child-spec", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.num_users, args.num_items, args.dim, args.iterations = 20000, 1000, 16, 20
        args.repeats, args.eval_stride, args.cap, args.capacity, args.batch_size = 1, 50, "2G", "30%", 128
        if args.data == p.get_default("data"):
            args.data = os.path.join(tempfile.gettempdir(), "lsm-gnn-emb-ooc-quick")
    args.work = args.work or os.path.dirname(os.path.abspath(args.data))
    args.cap_bytes = parse_bytes(args.cap)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        child = argparse.Namespace(**json.loads(args.child_spec))
        print(RESULT + json.dumps(run_child(child, args.child)), flush=True)
        return 0
    if not os.path.exists(os.path.join(args.data, "meta.json")):
        from lsm_gnn.data.bipartite import generate_bipartite

        generate_bipartite(args.data, num_users=int(args.num_users), num_items=int(args.num_items),
                           avg_interactions=args.avg_interactions, feature_dim=4, seed=0, progress=not args.quick)
    runs = []
    for rep in range(args.repeats):
        for method in METHODS[rep % 2:] + METHODS[:rep % 2]:
            run = run_method(args, method)
            run["repeat"] = rep
            runs.append(run)
            if run["failed"]:
                print(f"repeat {rep} {method}: FAILED (rc {run['returncode']}, OOM kill {run['oom_killed']}): "
                      f"{run['stderr_tail'][-600:]}", file=sys.stderr)
            else:
                print(f"repeat {rep} {method:<7}{ms(run):8.1f} ms/it  peak {run['peak_bytes'] / 2**20:6.0f} MiB  "
                      f"recall@20 {run['recall@20']:.4f}", file=sys.stderr)
    if not any(not r["failed"] for r in runs):
        return 1
    summary = summarize(runs)
    if all(method in summary for method in METHODS):
        print_summary(summary, args)
    write_json(args.out, {"machine": machine_info(), "args": {k: v for k, v in vars(args).items()},
                          "summary": summary, "runs": runs})
    return 0 if all(not r["failed"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
