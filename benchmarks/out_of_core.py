"""Out of core, for real: training under a memory cap a fraction of the feature file, feature paths side by side.

A memory cgroup (:class:`lsm_gnn.memcap.MemoryCap`, cgroup v1 or v2) that
counts the page cache caps each run at ``--cap`` (default 1 GiB) while the
feature file is several times larger (4 GiB by default), so neither the page
cache nor RAM can hide the SSD. The same trainer runs the same batches (same
seed, fanouts, batch size and iterations; the losses prove it) with only the
feature path changed:

  hybrid       this project: the hybrid cache over io_uring storage (O_DIRECT)
  hybrid+pvp   the same with the victim-buffer prefetcher (cache.pvp=true)
  storage      the io_uring storage engine with no cache (every row read)
  memmap       a plain ``np.memmap`` gather: memmap the file at its stride,
               fancy-index the rows, ``torch.from_numpy`` (what a PyG user
               writes; the page cache, inside the cap, is its only cache)
  memory       the whole feature file loaded in RAM, no cap: the ceiling

Each run is a child process started inside a fresh cgroup (the uncapped
ceiling's is as large as RAM, only to measure its peak), so the peak is the
method's alone; the parent collects one JSON line from each. Every dataset
file is dropped from the page cache (posix_fadvise DONTNEED) before each run,
so every method starts cold. Repeats rotate the method order; figures are
medians; ratios are taken within each repeat (methods ran back to back) and
their median reported.

    python benchmarks/out_of_core.py             # 4.3 GiB of features under a 1 GiB cap, ~20 min on 2 cores
    python benchmarks/out_of_core.py --quick     # a smoke run: 40 MB of features under a 512 MiB cap
"""
from __future__ import annotations

import argparse
import io
import json
import os
import resource
import statistics
import sys
import time

from lsm_gnn.benchmarking import load_script, machine_info, write_json
from lsm_gnn.units import parse_bytes

METHODS = ("hybrid", "hybrid+pvp", "storage", "memmap", "memory")
CEILING = "memory"  # runs uncapped
OURS = ("hybrid", "hybrid+pvp")
RESULT = "OUT_OF_CORE_RESULT "  # the child's JSON line starts with this
HERE = os.path.dirname(os.path.abspath(__file__))


def _end_to_end():
    """benchmarks/end_to_end.py: its generated graph and its ``np.memmap`` Features adapter."""
    return load_script(os.path.join(HERE, "end_to_end.py"))


# -- the child: one method, one run, inside the cgroup -----------------------------------------------------------

def device_read_bytes() -> int:
    """Bytes this process made the kernel fetch from block devices (/proc/self/io ``read_bytes``): O_DIRECT
    reads and page-cache fills (read-around included) alike."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))


def iterations_of(args, method: str) -> int:
    """The capped memmap gather runs the first ``--memmap-iterations`` of the same batches (seconds each)."""
    return args.memmap_iterations if method == "memmap" and args.memmap_iterations else args.iterations


def overrides_for(args, method: str) -> list[str]:
    """The config of ``method``'s run; everything but the feature path is the same for all methods."""
    common = [f"dataset={args.data}", f"model.kind={args.model}", f"model.hidden={args.hidden}",
              f"sampler.fanouts={args.fanouts}", f"sampler.batch_size={args.batch_size}",
              f"cache.window={args.window}", f"train.max_iterations={iterations_of(args, method)}",
              "train.eval_splits=[]",
              "log.progress=false", "train.lr=0.003", "cache.backend=io_uring"]
    paths = {"hybrid": ["cache.features=cache", f"cache.capacity={args.capacity}", "cache.policy=hybrid"],
             "hybrid+pvp": ["cache.features=cache", f"cache.capacity={args.capacity}", "cache.policy=auto",
                            "cache.pvp=true", f"cache.pvp_queue_capacity={args.pvp_queue_capacity}"],
             "storage": ["cache.features=storage"],
             "memmap": ["cache.features=storage"],  # replaced by the memmap Features below
             "memory": ["cache.features=memory"]}
    return common + paths[method] + list(args.set)  # --set KEY=VALUE last: it wins


def run_child(args, method: str) -> dict:
    """Trains ``method`` in this process and returns its figures (the parent measures the cgroup's peak)."""
    from lsm_gnn.config import load_config
    from lsm_gnn.data import open_dataset
    from lsm_gnn.memcap import PeakMemory, own_cgroup_stat, process_memory
    from lsm_gnn.trainer import Trainer

    class RecordingTrainer(Trainer):
        """Notes the process's memory after every epoch: what grows across epochs is a leak."""

        def __init__(self, *args, **kwargs):
            self.epoch_memory: list[dict] = []
            super().__init__(*args, **kwargs)

        def _end_epoch(self, complete: bool) -> None:
            super()._end_epoch(complete)
            self.epoch_memory.append(process_memory())

    with PeakMemory() as peak:
        features = None
        if method == "memmap":
            features = _end_to_end().MemmapStorage(open_dataset(args.data, check="shape"))
        trainer = RecordingTrainer(load_config(None, overrides_for(args, method)), out=io.StringIO(),
                                   features=features)
        read_before = device_read_bytes()
        result = trainer.fit()
        device_read = device_read_bytes() - read_before
        cgroup = own_cgroup_stat() or {}
    last = result["history"][-1]
    storage = getattr(trainer.features.only, "storage", trainer.features.only)  # what a cache reads its misses from
    reads = storage.stats() if hasattr(storage, "stats") else None
    return {"method": method, "iterations": result["iterations"], "wall_s": result["wall_s"],
            "stages_s": result["stages_s"], "hit_ratio": last["hit_ratio"],
            "feature_bytes_read": last["bytes_read"], "device_bytes_read": device_read,
            "pvp_hits": last.get("pvp_hits"), "loss": last["loss"],
            "features": trainer.features.describe(), "process_peak": peak.peak,
            "epoch_memory": trainer.epoch_memory,
            "storage_read_s": None if reads is None else reads.total_seconds,  # the gather's time in storage
            "storage_requests": None if reads is None else reads.requests,
            "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "cgroup_stat_at_end": {k: cgroup[k] for k in ("rss", "cache", "mapped_file", "anon", "file",
                                                          "file_mapped") if k in cgroup}}


# -- the parent: datasets, cgroups, repeats ----------------------------------------------------------------------

def evict_dataset(path: str) -> None:
    """Drops every file of the dataset from the page cache, so the next run starts cold (and pays for what it
    touches inside its own cgroup: a page already cached stays charged to whoever read it first)."""
    from lsm_gnn.storage.probe import evict_page_cache

    for root, _, files in os.walk(path):
        for name in files:
            evict_page_cache(os.path.join(root, name))


def ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def run_method(args, method: str, limit: int | None = None) -> dict:
    """One run of ``method`` as a child in a fresh cgroup limited to ``limit`` bytes (default: ``args.cap``, or
    for the ceiling as large as RAM). Returns the child's figures with the cgroup's peak and OOM kill, or the
    failure."""
    from lsm_gnn.memcap import MemoryCap

    evict_dataset(args.data)
    if limit is None:
        limit = ram_bytes() if method == CEILING else args.cap_bytes
    spec = json.dumps({k: v for k, v in vars(args).items() if k != "methods"})
    cmd = [sys.executable, os.path.abspath(__file__), "--child", method, "--child-spec", spec]
    with MemoryCap(limit) as cap:
        run = cap.run(cmd, timeout=args.timeout)
    out = {"method": method, "capped": limit < ram_bytes(), "limit_bytes": limit, "peak_bytes": run.peak_bytes,
           "oom_killed": run.oom_killed, "returncode": run.returncode, "timed_out": run.timed_out}
    line = next((ln for ln in reversed(run.stdout.splitlines()) if ln.startswith(RESULT)), None)
    if run.returncode != 0 or line is None:
        why = f"killed after --timeout {args.timeout:g} s\n" if run.timed_out else ""
        return {**out, "failed": True, "stderr_tail": why + run.stderr[-3000:]}
    return {**json.loads(line[len(RESULT):]), **out, "failed": False}


def run_rotated(args) -> list[dict]:
    """Every method ``args.repeats`` times, the order rotated per repeat so that no method always runs first."""
    runs, methods = [], args.methods
    for rep in range(args.repeats):
        for method in methods[rep % len(methods):] + methods[:rep % len(methods)]:
            r = run_method(args, method)
            r["repeat"] = rep
            runs.append(r)
            if r["failed"]:
                print(f"repeat {rep} {method:<11} FAILED (rc {r['returncode']}, oom kill {r['oom_killed']}): "
                      f"{r['stderr_tail'][-400:]}", file=sys.stderr)
            else:
                print(f"repeat {rep} {method:<11} {1e3 * r['wall_s'] / r['iterations']:8.1f} ms/it  peak "
                      f"{r['peak_bytes'] / 2**20:7.0f} MiB  hit "
                      f"{'-' if r['hit_ratio'] is None else format(r['hit_ratio'], '.3f')}", file=sys.stderr)
    return runs


# -- summary -----------------------------------------------------------------------------------------------------

STAGES = ("sample", "gather", "wait", "train")  # one rank: no "exchange"


def ms_per_iter(run: dict) -> float:
    return 1e3 * run["wall_s"] / run["iterations"]


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(runs: list[dict], methods) -> dict:
    out = {}
    for method in methods:
        mine = [r for r in runs if r["method"] == method]
        done = [r for r in mine if not r["failed"]]
        row = {"repeats": len(mine), "failed": len(mine) - len(done), "oom_kills": sum(r["oom_killed"] for r in mine),
               "capped": mine[0]["capped"] if mine else None,
               "peak_bytes_max": max((r["peak_bytes"] for r in mine), default=None)}
        if done:
            n = done[0]["iterations"]
            row.update(
                iterations=n, ms_per_iter=_median(ms_per_iter(r) for r in done),
                stages_ms_per_iter={k: 1e3 * _median(r["stages_s"][k] for r in done) / n for k in STAGES},
                hit_ratio=_median(r["hit_ratio"] for r in done),
                feature_bytes_read=_median(r["feature_bytes_read"] for r in done),
                device_bytes_read=_median(r["device_bytes_read"] for r in done),
                peak_bytes=_median(r["peak_bytes"] for r in done),
                peak_rss_anon=_median(r["process_peak"].get("rss_anon") for r in done),
                storage_read_ms_per_iter=_median(r["storage_read_s"] and 1e3 * r["storage_read_s"] / n for r in done),
                losses=sorted({round(r["loss"], 6) for r in done}), features=done[0]["features"])
        out[method] = row
    return out


def paired_ratios(runs: list[dict], slower: str, faster: str) -> dict | None:
    """``slower``'s time per iteration over ``faster``'s in each repeat where both ran (back to back)."""
    by_repeat: dict = {}
    for r in runs:
        if not r["failed"]:
            by_repeat.setdefault(r["repeat"], {})[r["method"]] = ms_per_iter(r)
    per_repeat = [t[slower] / t[faster] for _, t in sorted(by_repeat.items()) if slower in t and faster in t]
    return {"per_repeat": per_repeat, "median": statistics.median(per_repeat)} if per_repeat else None


def ratios(runs: list[dict]) -> dict:
    """How many times faster each of ours is than the capped memmap gather and the storage engine alone, and
    how many times slower than the uncapped in-memory ceiling (time per iteration, paired per repeat)."""
    out = {}
    for ours in OURS:
        out[f"{ours}_speedup_vs_memmap"] = paired_ratios(runs, "memmap", ours)
        out[f"{ours}_speedup_vs_storage"] = paired_ratios(runs, "storage", ours)
        out[f"{ours}_slowdown_vs_memory"] = paired_ratios(runs, ours, "memory")
    return out


def table(summary: dict) -> str:
    lines = [f"{'method':<12}{'cap':>5}{'ms/it':>8}" + "".join(f"{k:>8}" for k in STAGES) +
             f"{'reads':>8}{'hit':>7}{'feat MiB':>10}{'disk MiB':>10}{'peak MiB':>10}{'anon MiB':>10}{'OOM':>5}"]
    for method, s in summary.items():
        if "ms_per_iter" not in s:
            lines.append(f"{method:<12} every run failed ({s['oom_kills']} OOM kills)")
            continue
        hit = "-" if s["hit_ratio"] is None else f"{s['hit_ratio']:.3f}"
        reads = "-" if s["storage_read_ms_per_iter"] is None else f"{s['storage_read_ms_per_iter']:.1f}"
        lines.append(f"{method:<12}{'yes' if s['capped'] else 'no':>5}{s['ms_per_iter']:>8.1f}" +
                     "".join(f"{s['stages_ms_per_iter'][k]:>8.1f}" for k in STAGES) +
                     f"{reads:>8}{hit:>7}{s['feature_bytes_read'] / 2**20:>10.0f}"
                     f"{s['device_bytes_read'] / 2**20:>10.0f}"
                     f"{s['peak_bytes'] / 2**20:>10.0f}{s['peak_rss_anon'] / 2**20:>10.0f}{s['oom_kills']:>5}")
    lines.append("(stages are ms per iteration: sample and gather run in the loader thread overlapped with train, "
                 "wait is the stall they caused; reads: ms/it the gather spent in storage reads; feat: the feature "
                 "path's own byte counter; disk: /proc/self/io)")
    return "\n".join(lines)


# -- command line ------------------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="/tmp/lsm-gnn-bench/ooc-4.5m", help="generated graph directory (reused)")
    p.add_argument("--num-nodes", type=int, default=4_500_000, help="4.5M: a 4.3 GiB feature file, 4.3x 1 GiB")
    p.add_argument("--feature-dim", type=int, default=256, help="float32 features: 1 KiB rows by default")
    p.add_argument("--cap", default="1G", help="the memory cgroup's limit (page cache included)")
    p.add_argument("--capacity", default="4%", help="cache capacity (bytes or share of nodes): 4%% of 4.5M nodes is "
                   "176 MiB, what fits beside the process and its topology under 1 GiB")
    _end_to_end().add_batch_args(p)
    p.add_argument("--iterations", type=int, default=400)
    p.add_argument("--memmap-iterations", type=int, default=8,
                   help="iterations of the memmap method, the first of the same batches (0: --iterations); under "
                        "the cap each takes seconds")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--pvp-queue-capacity", type=int, default=512, help="lines per victim queue of hybrid+pvp")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for every method (after the benchmark's own), e.g. train.epochs=3")
    p.add_argument("--timeout", type=float, default=1200, help="seconds one run may take before it is killed")
    p.add_argument("--json", default="docs/results/out_of_core.json")
    p.add_argument("--quick", action="store_true", help="small graph under a small cap, few iterations, one repeat")
    p.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)  # internal: run one method here
    p.add_argument("--child-spec", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return argparse.Namespace(**{**json.loads(args.child_spec), "child": args.child})
    if args.quick:
        args.num_nodes, args.feature_dim, args.cap, args.capacity = 40_000, 256, "512M", "10%"
        args.iterations, args.memmap_iterations, args.repeats = 10, 0, 1
        args.data = args.data.rstrip("/") + "-quick"
    args.cap_bytes = parse_bytes(args.cap)
    args.methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in args.methods if m not in METHODS]
    if bad:
        p.error(f"unknown methods {bad}; valid: {', '.join(METHODS)}")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.child:
        print(RESULT + json.dumps(run_child(args, args.child)), flush=True)
        return {}
    ds = _end_to_end().ensure_graph(args.data, args.num_nodes, args.feature_dim)
    file_bytes = ds.features.file_bytes
    if file_bytes < 4 * args.cap_bytes and not args.quick:
        print(f"note: the feature file ({file_bytes / 2**30:.2f} GiB) is less than 4x the cap "
              f"({args.cap_bytes / 2**30:.2f} GiB)", file=sys.stderr)
    started = time.time()
    runs = run_rotated(args)
    summary = summarize(runs, args.methods)
    result = {"settings": {k: v for k, v in vars(args).items() if k not in ("json", "child", "child_spec")},
              "dataset": {"path": ds.path, "num_nodes": ds.num_nodes, "num_edges": ds.num_edges,
                          "feature_file_bytes": file_bytes, "file_over_cap": file_bytes / args.cap_bytes},
              "machine": {**machine_info(), "load_before": os.getloadavg(), "seconds": time.time() - started},
              "runs": runs, "summary": summary, "ratios": ratios(runs)}
    result["machine"]["load_after"] = os.getloadavg()
    if args.json:
        write_json(args.json, result)
    print(table(summary))
    print(json.dumps({k: v and round(v["median"], 3) for k, v in result["ratios"].items()}, indent=2))
    return result


if __name__ == "__main__":
    main()
