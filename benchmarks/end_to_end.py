"""End to end: training time per stage with features from SSD, four ways, side by side.

On a generated graph whose feature file is larger than the cache, the same
trainer (same sampler, model, batches and loader thread) runs the same
iterations with only the feature path changed:

  hybrid         this loader with the hybrid cache (io_uring misses)
  rr             the same with round-robin eviction (the M-GIDS baseline)
  farthest       the same with the farthest policy (the default without PVP)
  hybrid-no-read-ahead  hybrid without reading the next batches' misses ahead (cache.read_ahead=0; the
                 other cached methods read 2 batches ahead, auto's choice where misses come from a disk)
  hybrid+pvp     the hybrid cache with the victim-buffer prefetcher (cache.pvp=true:
                 policy hybrid_pvp_room, reinstall on; --pvp-queue-capacity lines per queue,
                 or --pvp-queue-bytes for all queues)
  farthest+pvp   the same with the default policy (farthest): PVP's defaults, to compare with farthest
  hybrid-same-bytes, farthest-same-bytes  that policy's cache given the +pvp run's cache and queue
                 bytes together: PVP judged against a plain cache of the same memory
  hybrid-in-memory  the hybrid cache over the in-memory table: the cache's own cost,
                 with the storage taken out of the way (misses cost a memory copy)
  farthest-pinned  the default cache on the GPU over the table in page-locked host memory
                 (cache.backend=pinned: misses gathered by the GPU over UVA, no disk): the project's
                 own overhead against ``device``, with the VM's disk out of the way (needs a GPU)
  memmap         a plain ``np.memmap`` gather, page cache evicted before the run
                 (what a plain out-of-core PyG user writes)
  memmap-bound   the same, page cache evicted before every batch: the regime
                 of a feature file far larger than RAM, where the page cache
                 cannot hold what the run touches (eviction time excluded)
  memmap-random-bound  the same with madvise(MADV_RANDOM), which a careful
                 user adds to stop read-around
  memory         the whole feature file in RAM (the ceiling)
  device         the whole feature file in the GPU's memory (the ceiling of a GPU run; needs a GPU)

Here RAM (24 GiB) holds the whole feature file, so the plain memmap's page
cache warms up during the run and becomes an unbounded cache; the bound
variants show the regime this project is for. Times are compared per
iteration, since the bound variants run fewer iterations.

Every method starts cold (page cache evicted, fresh cache). Repeats rotate
the method order; figures are medians. Ratios print last.

``--step-beside-loader STEPS`` also times each method's training step alone
and beside its loader: the same steps on the same STEPS batches (features
already on the training device), once with no loader running and once while
the loader's thread produces the next batches, ``--step-runs`` times each;
it prints both medians and their ratio (how much the loader slows the step).

    python benchmarks/end_to_end.py                   # ~20 min on 2 cores
    python benchmarks/end_to_end.py --quick           # a smoke run
    python benchmarks/end_to_end.py --quick --methods hybrid,memory --step-beside-loader 10
"""
from __future__ import annotations

import argparse
import io
import json
import mmap
import os
import statistics
import sys
import time

import numpy as np
import torch

from lsm_gnn.config import load_config
from lsm_gnn.storage.base import CountingStorage
from lsm_gnn.storage.probe import evict_page_cache
from lsm_gnn.testing.benchmarking import feature_paths, machine_info, reusable_dataset, write_json
from lsm_gnn.training.trainer import STAGES, Trainer

METHODS = ("hybrid", "rr", "farthest", "hybrid-no-read-ahead", "hybrid+pvp", "farthest+pvp", "hybrid-same-bytes",
           "farthest-same-bytes", "hybrid-in-memory", "farthest-pinned", "memmap", "memmap-bound",
           "memmap-random-bound", "memory", "device")
BOUND = ("memmap-bound", "memmap-random-bound")  # seconds per batch: they run --bound-iterations only
GPU_ONLY = ("farthest-pinned",)  # refused without CUDA: left out of the default methods there


class MemmapStorage(CountingStorage):
    """``np.memmap`` fancy indexing, as a user's out-of-core loader does it.

    ``evict_each_batch`` drops the file from the page cache before every read
    and keeps the time that took apart (``evict_seconds``), so it can be left
    out of the comparison.
    """

    backend = "np.memmap"

    def __init__(self, dataset, evict_each_batch: bool = False, random_advice: bool = False):
        layout = dataset.features
        super().__init__(dataset.num_nodes, layout.dim, layout.dtype)
        self.path = dataset.feature_path
        self.row_bytes_on_disk = layout.row_bytes
        self._mm = np.memmap(self.path, dtype=np.uint8, mode="r", shape=(dataset.num_nodes, layout.row_stride))
        if random_advice:
            self._mm._mmap.madvise(mmap.MADV_RANDOM)
        self.evict_each_batch = evict_each_batch
        self.evict_seconds = 0.0

    def _read(self, ids: torch.Tensor, out: torch.Tensor) -> None:
        if self.evict_each_batch:
            t = time.perf_counter()
            self._mm._mmap.madvise(mmap.MADV_DONTNEED)  # our mapping would otherwise keep the pages
            evict_page_cache(self.path)
            self.evict_seconds += time.perf_counter() - t
        start = time.perf_counter()
        rows = self._mm[ids.numpy()][:, :self.row_bytes_on_disk]
        out.copy_(torch.from_numpy(np.ascontiguousarray(rows)).view(self.dtype))
        self._count(ids.numel(), time.perf_counter() - start)


def ensure_graph(path: str, num_nodes: int, dim: int):
    from lsm_gnn.data.synthetic import generate_synthetic

    ds = reusable_dataset(path, num_nodes=num_nodes, feature_dim=dim)
    if ds is not None:
        return ds
    print(f"generating {num_nodes:,} nodes x {dim} features at {path} ...", file=sys.stderr)
    return generate_synthetic(path, num_nodes=num_nodes, avg_degree=10, feature_dim=dim, num_classes=8, seed=0,
                              overwrite=True)


def trainer_for(args, ds, method: str, iterations: int) -> tuple[Trainer, MemmapStorage | None]:
    """The trainer of ``method`` for ``iterations`` iterations, every method's from the same settings (and the
    memmap storage it was given, for the memmap methods)."""
    overrides = [f"dataset={ds.path}", f"model.kind={args.model}", f"model.hidden={args.hidden}",
                 f"sampler.fanouts={args.fanouts}", f"sampler.batch_size={args.batch_size}",
                 f"cache.capacity={args.capacity}", f"cache.window={args.window}",
                 f"train.max_iterations={iterations}", "train.eval_splits=[]", "log.progress=false",
                 "train.lr=0.003", f"sampler.num_threads={args.loader_threads}"]
    features = None
    if method in ("hybrid", "rr", "farthest"):
        overrides += ["cache.features=cache", f"cache.policy={method}", f"cache.backend={args.backend}"]
    elif method == "hybrid-no-read-ahead":
        overrides += ["cache.features=cache", "cache.policy=hybrid", f"cache.backend={args.backend}",
                      "cache.read_ahead=0"]
    elif method in ("hybrid+pvp", "farthest+pvp"):
        policy = "hybrid_pvp_room" if method == "hybrid+pvp" else "farthest"
        overrides += ["cache.features=cache", f"cache.policy={policy}", f"cache.backend={args.backend}",
                      "cache.pvp=true"]
        overrides += [f"cache.pvp_queue_bytes={args.pvp_queue_bytes}"] if args.pvp_queue_bytes else \
            [f"cache.pvp_queue_capacity={args.pvp_queue_capacity}"]
    elif method in ("hybrid-same-bytes", "farthest-same-bytes"):
        cache_bytes, queue_bytes = pvp_memory(args, ds)
        overrides += ["cache.features=cache", f"cache.policy={method.split('-')[0]}", f"cache.backend={args.backend}",
                      f"cache.capacity={cache_bytes + queue_bytes}"]
    elif method == "hybrid-in-memory":
        overrides += ["cache.features=cache", "cache.policy=hybrid", "cache.backend=memory"]
    elif method == "farthest-pinned":
        overrides += ["cache.features=cache", "cache.policy=farthest", "cache.backend=pinned"]
    elif method == "memory":
        overrides += ["cache.features=memory"]
    elif method == "device":
        overrides += ["cache.features=device"]
    else:
        features = MemmapStorage(ds, evict_each_batch=method in BOUND, random_advice=method == "memmap-random-bound")
    for path in feature_paths(ds):
        evict_page_cache(path)
    return Trainer(load_config(None, overrides), out=io.StringIO(), features=features), features


def run_once(args, ds, method: str) -> dict:
    trainer, features = trainer_for(args, ds, method, args.bound_iterations if method in BOUND else args.iterations)
    result = trainer.fit()
    last = result["history"][-1]
    evict_s = features.evict_seconds if isinstance(features, MemmapStorage) else 0.0
    # Eviction ran inside gather (in the loader thread); leave it out of the stall it caused, at most.
    wall = result["wall_s"] - min(evict_s, result["stages_s"]["wait"])
    # The pipeline's bound from the run's own counters (the trainer's epoch summaries): storage busy time or
    # the training step, whichever is larger; the efficiency is that over the measured time.
    bound_s = sum(epoch["bound_s"] for epoch in result["history"])
    return {"method": method, "iterations": result["iterations"], "wall_s": wall, "evict_s": evict_s,
            "bound_s": bound_s, "pipeline_efficiency": bound_s / wall if wall > 0 else None,
            "stages_s": result["stages_s"], "hit_ratio": last["hit_ratio"], "bytes_read": last["bytes_read"],
            "pvp_hits": last.get("pvp_hits"), "loss": last["loss"]}


def step_beside_loader(args, ds, method: str) -> dict:
    """The training step timed alone and while the loader's thread produces the next batches, on the same
    batches: ``--step-beside-loader`` batches of ``method``'s loader, gathered once and moved to the training
    device, then trained on ``--step-runs`` times with no loader running and as often with the loader running an
    epoch beside them (each step followed by taking one of its batches, as training does, so it works as far
    ahead as its queue lets it). Each step is timed to the end of its device work on the training stream; the
    loader's own stream is not waited for. Runs alternate; figures are medians over the runs of each run's
    median step."""
    from itertools import islice

    from lsm_gnn.comm.distributed import batch_to

    steps = args.step_beside_loader
    trainer, _ = trainer_for(args, ds, method, steps)
    try:
        feed = trainer.loader.iterate()
        batches = [batch_to(batch, trainer.device) for batch in islice(feed, steps)]
        feed.close()
        if len(batches) < steps:
            raise SystemExit(f"--step-beside-loader {steps}: the loader's epoch has {len(batches)} batches")
        trainer.model.train()
        on_cuda = trainer.device is not None and torch.device(trainer.device).type == "cuda"

        def median_step(produced=None) -> float:
            times = []
            for batch in batches:
                start = time.perf_counter()
                trainer._step(batch)  # the trainer's own step, as its "train" stage times it
                if on_cuda:
                    torch.cuda.current_stream(trainer.device).synchronize()  # its optimizer step too
                times.append(time.perf_counter() - start)
                if produced is not None:
                    next(produced)
            return statistics.median(times)

        alone, beside = [], []
        for _ in range(args.step_runs):
            alone.append(median_step())
            produced = endless(trainer.loader)
            next(produced)  # the loader's thread is running
            beside.append(median_step(produced))
            produced.close()
    finally:
        trainer.close()
    alone_ms, beside_ms = 1e3 * statistics.median(alone), 1e3 * statistics.median(beside)
    paired = [b / a for a, b in zip(alone, beside)]  # each pair ran back to back: steadier when the load drifts
    return {"steps": steps, "runs": args.step_runs, "step_alone_ms": alone_ms, "step_beside_loader_ms": beside_ms,
            "ratio": beside_ms / alone_ms, "alone_ms_per_run": [1e3 * t for t in alone],
            "beside_ms_per_run": [1e3 * t for t in beside], "ratio_per_run": paired,
            "paired_ratio": statistics.median(paired)}


def endless(loader):
    """The loader's batches, epoch after epoch (its thread stops when this is closed)."""
    while True:
        yield from loader.iterate()


def step_table(measured: dict) -> str:
    lines = [f"{'method':<20}{'step alone ms':>15}{'beside loader ms':>18}{'ratio':>7}{'paired':>8}"]
    for method, m in measured.items():
        lines.append(f"{method:<20}{m['step_alone_ms']:>15.2f}{m['step_beside_loader_ms']:>18.2f}{m['ratio']:>7.2f}"
                     f"{m['paired_ratio']:>8.2f}")
    return "\n".join(lines + ["(the same training steps on the same batches, features already on the training "
                              "device: with no loader running, and while the loader's thread produces the next "
                              "batches; medians of the runs; ratio: beside over alone; paired: the median of each "
                              "run's own ratio, alone and beside back to back)"])


def pvp_memory(args, ds) -> tuple[int, int]:
    """(cache bytes, all victim queues' bytes) of the +pvp runs, as the cache sizes them."""
    from lsm_gnn.cache.pvp import queue_capacity_for, queue_memory_bytes
    from lsm_gnn.cache.geometry import cache_geometry
    from lsm_gnn.config import cache_capacity_bytes

    row_bytes = ds.features.row_bytes
    num_sets, ways = cache_geometry(cache_capacity_bytes(args.capacity, ds.num_nodes, row_bytes), row_bytes, 32,
                                    ds.num_nodes)
    cache_bytes = num_sets * ways * row_bytes
    queues = args.window + 1
    lines = queue_capacity_for(args.pvp_queue_bytes, queues, row_bytes, cache_bytes) if args.pvp_queue_bytes \
        else args.pvp_queue_capacity
    return cache_bytes, queue_memory_bytes(queues, lines, row_bytes)


def summarize(runs: list[dict]) -> dict:
    out = {}
    for method in METHODS:
        mine = [r for r in runs if r["method"] == method]
        if not mine:
            continue
        n = mine[0]["iterations"]
        out[method] = {
            "wall_s": statistics.median(r["wall_s"] for r in mine),
            "ms_per_iter_wall": 1e3 * statistics.median(r["wall_s"] for r in mine) / n,
            "ms_per_iter": {k: 1e3 * statistics.median(r["stages_s"][k] for r in mine) / n for k in STAGES},
            "hit_ratio": None if mine[0]["hit_ratio"] is None else statistics.median(r["hit_ratio"] for r in mine),
            "pipeline_efficiency": statistics.median(r["pipeline_efficiency"] for r in mine),
            "bytes_read": statistics.median(r["bytes_read"] for r in mine),
            "pvp_hits": None if mine[0]["pvp_hits"] is None else statistics.median(r["pvp_hits"] for r in mine),
            "repeats": len(mine), "iterations": n,
        }
    return out


def table(summary: dict) -> str:
    lines = [f"{'method':<20}{'iters':>6}{'wall s':>8}{'ms/it':>8}" + "".join(f"{k:>9}" for k in STAGES) +
             f"{'hit':>7}{'read MiB':>10}{'bound':>7}"]
    for method, s in summary.items():
        hit = "-" if s["hit_ratio"] is None else f"{s['hit_ratio']:.3f}"
        lines.append(f"{method:<20}{s['iterations']:>6}{s['wall_s']:>8.2f}{s['ms_per_iter_wall']:>8.1f}" +
                     "".join(f"{s['ms_per_iter'][k]:>9.1f}" for k in STAGES) +
                     f"{hit:>7}{s['bytes_read'] / 2**20:>10.1f}{s['pipeline_efficiency']:>7.2f}")
    lines.append("(stage columns are ms per iteration; sample and gather overlap train, wait is the stall; bound: the "
                 "pipeline's efficiency, max(storage busy, train) over the measured time)")
    return "\n".join(lines)


def ratios(summary: dict) -> dict:
    """Time per iteration of ``b`` over that of ``a``: how many times faster ``a`` is."""
    def r(a, b):
        if a not in summary or b not in summary:
            return None
        return summary[b]["ms_per_iter_wall"] / summary[a]["ms_per_iter_wall"]

    memory = r("memory", "hybrid")
    return {"hybrid_speedup_vs_memmap": r("hybrid", "memmap"),
            "hybrid_speedup_vs_memmap_bound": r("hybrid", "memmap-bound"),
            "hybrid_speedup_vs_memmap_random_bound": r("hybrid", "memmap-random-bound"),
            "hybrid_speedup_vs_rr": r("hybrid", "rr"),
            "pvp_speedup_vs_hybrid": r("hybrid+pvp", "hybrid"),
            "pvp_speedup_vs_same_bytes": r("hybrid+pvp", "hybrid-same-bytes"),
            "hybrid_in_memory_slowdown_vs_memory": r("memory", "hybrid-in-memory"),
            "hybrid_slowdown_vs_memory": memory,
            "hybrid_slowdown_vs_device": r("device", "hybrid"),
            "farthest_slowdown_vs_device": r("device", "farthest")}


def per_repeat_ratios(runs: list[dict], slower: str, faster: str) -> list[float]:
    """``slower``'s wall time over ``faster``'s in each repeat where both ran (back to back)."""
    by_repeat: dict = {}
    for r in runs:
        by_repeat.setdefault(r["repeat"], {})[r["method"]] = r["wall_s"]
    return [walls[slower] / walls[faster] for _, walls in sorted(by_repeat.items())
            if slower in walls and faster in walls]


PAIRS = {  # name: (numerator, denominator) of wall time per iteration, within one repeat
    "pvp_speedup_vs_hybrid": ("hybrid", "hybrid+pvp"),
    "farthest_speedup_vs_hybrid": ("hybrid", "farthest"),
    "pvp_speedup_vs_same_bytes": ("hybrid-same-bytes", "hybrid+pvp"),
    "farthest_pvp_speedup_vs_farthest": ("farthest", "farthest+pvp"),
    "farthest_pvp_speedup_vs_same_bytes": ("farthest-same-bytes", "farthest+pvp"),
    "hybrid_slowdown_vs_memory": ("hybrid", "memory"),
    "hybrid_in_memory_slowdown_vs_memory": ("hybrid-in-memory", "memory"),
    "hybrid_slowdown_vs_device": ("hybrid", "device"),
    "read_ahead_speedup": ("hybrid-no-read-ahead", "hybrid"),
    "farthest_slowdown_vs_device": ("farthest", "device"),
    "farthest_pinned_slowdown_vs_device": ("farthest-pinned", "device"),  # issue 43's target: within 1.3x
}


def paired_ratios(runs: list[dict]) -> dict:
    """Ratios of two methods' wall times per repeat (they ran back to back) and their medians: steadier
    than a ratio of medians when the machine's load drifts between repeats."""
    out = {}
    for name, (slower, faster) in PAIRS.items():
        per_repeat = per_repeat_ratios(runs, slower, faster)
        if per_repeat:
            out[f"{name}_per_repeat"] = per_repeat
            out[f"{name}_median"] = statistics.median(per_repeat)
    return out


def add_batch_args(p: argparse.ArgumentParser) -> None:
    """The model and the batches (benchmarks/out_of_core.py trains the same ones)."""
    p.add_argument("--model", default="sage")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--fanouts", default="[10,5]")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--window", type=int, default=32)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="/tmp/lsm-gnn-bench/e2e", help="generated graph directory (reused)")
    p.add_argument("--num-nodes", type=int, default=500_000)
    p.add_argument("--feature-dim", type=int, default=256, help="float32 features: 1 KiB rows by default")
    p.add_argument("--capacity", default="10%", help="cache capacity (bytes or share of nodes)")
    add_batch_args(p)
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--bound-iterations", type=int, default=10, help="iterations of the memmap-*-bound methods")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=0,
                   help="iterations of one untimed run of each method first (on a GPU, Triton compiles its kernels "
                        "at their first launches)")
    p.add_argument("--pvp-queue-capacity", type=int, default=512,
                   help="lines per victim queue of the +pvp methods (default: ~13%% of the ~4,000 distinct nodes of a "
                        "default batch, near the paper's 16K of 140K)")
    p.add_argument("--pvp-queue-bytes", default=None,
                   help="all victim queues' bytes for the +pvp methods (e.g. 16M, or 25%% of the cache); overrides "
                        "--pvp-queue-capacity")
    p.add_argument("--loader-threads", type=int, default=0,
                   help="threads of the sampler's and the cache's native ops on the loader thread (0: all cores)")
    p.add_argument("--step-beside-loader", type=int, default=0, metavar="STEPS",
                   help="also time the training step alone and beside the loader's thread, per method, over STEPS "
                        "of its batches (0: not)")
    p.add_argument("--step-runs", type=int, default=3, help="runs of each for --step-beside-loader")
    p.add_argument("--methods", default=",".join(m for m in METHODS if torch.cuda.is_available() or m not in GPU_ONLY))
    p.add_argument("--json", default="docs/results/end_to_end.json")
    p.add_argument("--quick", action="store_true", help="small graph, few iterations, one repeat")
    p.add_argument("--backend", default="io_uring", help="storage backend of the cached methods' misses ('auto': "
                   "io_uring where the kernel allows it, else pread)")
    args = p.parse_args(argv)
    if args.quick:
        args.num_nodes, args.iterations, args.repeats, args.capacity = 20_000, 10, 1, "40%"
        args.bound_iterations = 3
        args.data = args.data + "-quick"
    if args.warmup < 0:
        p.error(f"--warmup is a number of iterations >= 0 (0: none), got {args.warmup}")
    if args.step_beside_loader < 0 or args.step_runs < 1:
        p.error(f"--step-beside-loader is a number of steps >= 0 (0: none) and --step-runs >= 1, got "
                f"{args.step_beside_loader} and {args.step_runs}")
    args.methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in args.methods if m not in METHODS]
    if bad:
        p.error(f"unknown methods {bad}; valid: {', '.join(METHODS)}")
    return args


def run_rotated(args, ds, methods, repeats: int) -> list[dict]:
    """Every method ``repeats`` times, the order rotated per repeat so that no method always runs first."""
    runs = []
    for rep in range(repeats):
        for method in methods[rep % len(methods):] + methods[:rep % len(methods)]:
            r = run_once(args, ds, method)
            r["repeat"] = rep
            runs.append(r)
            print(f"repeat {rep} {method:<13} wall {r['wall_s']:.2f}s  hit "
                  f"{'-' if r['hit_ratio'] is None else format(r['hit_ratio'], '.3f')}", file=sys.stderr)
    return runs


def main(argv=None) -> dict:
    args = parse_args(argv)
    ds = ensure_graph(args.data, args.num_nodes, args.feature_dim)
    if args.warmup > 0:
        for method in args.methods:
            run_once(argparse.Namespace(**{**vars(args), "iterations": args.warmup}), ds, method)
            print(f"warm-up {method:<13} {args.warmup} iterations (not counted)", file=sys.stderr)
    runs = run_rotated(args, ds, args.methods, args.repeats)
    summary = summarize(runs)
    result = {"settings": {k: v for k, v in vars(args).items() if k != "json"},
              "dataset": {"path": ds.path, "num_nodes": ds.num_nodes, "feature_file_bytes": ds.features.file_bytes},
              "machine": machine_info(),
              "runs": runs, "summary": summary, "ratios": ratios(summary),
              "paired_ratios": paired_ratios(runs)}
    if args.step_beside_loader:
        result["step_beside_loader"] = {method: step_beside_loader(args, ds, method) for method in args.methods
                                        if method not in BOUND}
    if args.json:
        write_json(args.json, result)
    print(table(summary))
    print(json.dumps(result["ratios"], indent=2))
    print("per-repeat ratios (methods of one repeat run back to back):", json.dumps(result["paired_ratios"]))
    if args.step_beside_loader:
        print(step_table(result["step_beside_loader"]))
    return result


if __name__ == "__main__":
    main()
