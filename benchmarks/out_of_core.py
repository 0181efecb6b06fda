"""Out of core, for real: training under memory caps a fraction of the feature file, feature paths side by side.

A memory cgroup (:class:`lsm_gnn.utils.memcap.MemoryCap`, cgroup v1 or v2) that
counts the page cache caps each run at one of ``--caps`` (default 1, 1.5, 2,
3, 4 and 6 GiB) while the feature file is 4.3 GiB by default, so the curve
runs from where neither the page cache nor RAM can hide the SSD up to where
the whole file fits in the page cache beside the process. The same trainer
runs the same batches (same seed, fanouts, batch size and iterations; the
losses prove it) with only the feature path changed:

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
so every method starts cold. In each repeat the caps run in ascending order
and the methods at each cap in an order rotated by the repeat; the ceiling
runs once per repeat, with the smallest cap's methods. Figures are medians;
ratios are taken within each repeat (methods ran back to back) and their
median reported. Under a tight cap a memmap batch takes seconds, so the
memmap gather trains the first of the same batches for ``--memmap-seconds``
at most. The report ends with the cap from which memmap is at least as fast
as hybrid; ``--plot PATH`` draws time per iteration against the cap (needs
matplotlib: ``pip install matplotlib``), ``--from-json`` redraws a saved run.

    python benchmarks/out_of_core.py             # 4.3 GiB of features under 6 caps, 1 to 6 GiB, 3 repeats
    python benchmarks/out_of_core.py --caps 1G   # one cap (--cap 1G is the same)
    python benchmarks/out_of_core.py --quick     # a smoke run: 40 MB of features under caps of 512 and 768 MiB
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

from lsm_gnn.testing.benchmarking import load_script, machine_info, write_json
from lsm_gnn.utils.units import format_bytes, parse_bytes

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
    """The memmap gather runs the first ``--memmap-iterations`` of the same batches (under a tight cap each takes
    seconds), and stops earlier once ``--memmap-seconds`` have passed."""
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
    from lsm_gnn.training.trainer import Trainer
    from lsm_gnn.utils.memcap import PeakMemory, own_cgroup_stat, process_memory

    class RecordingTrainer(Trainer):
        """Notes the process's memory after every epoch (what grows across epochs is a leak) and stops, after at
        least one iteration, once ``budget_s`` seconds of fit have passed (0: no budget)."""

        def __init__(self, *args, budget_s: float = 0.0, **kwargs):
            self.epoch_memory: list[dict] = []
            self.budget_s, self.fit_started = budget_s, None
            super().__init__(*args, **kwargs)

        def fit(self) -> dict:
            self.fit_started = time.perf_counter()
            return super().fit()

        def _limit_reached(self) -> bool:
            over = (self.budget_s > 0 and self.fit_started is not None and self.iterations_done > 0
                    and time.perf_counter() - self.fit_started >= self.budget_s)
            return over or super()._limit_reached()

        def _end_epoch(self, complete: bool) -> None:
            super()._end_epoch(complete)
            self.epoch_memory.append(process_memory())

    with PeakMemory() as peak:
        features = None
        if method == "memmap":
            features = _end_to_end().MemmapStorage(open_dataset(args.data, check="shape"))
        trainer = RecordingTrainer(load_config(None, overrides_for(args, method)), out=io.StringIO(),
                                   features=features, budget_s=args.memmap_seconds if method == "memmap" else 0)
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


def run_method(args, method: str, limit: int) -> dict:
    """One run of ``method`` as a child in a fresh cgroup limited to ``limit`` bytes. Returns the child's figures
    with the cgroup's peak and OOM kill, or the failure."""
    from lsm_gnn.utils.memcap import MemoryCap

    evict_dataset(args.data)
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


def schedule(methods: list[str], caps: list[int], repeats: int) -> list[tuple[int, int | None, str]]:
    """``(repeat, cap, method)`` in run order: in each repeat the caps ascending and the capped methods at each
    cap rotated by the repeat, so that no method always runs first; the uncapped ceiling (cap None) runs once per
    repeat, in the smallest cap's rotation (so one cap runs exactly as before there were several)."""
    capped = [m for m in methods if m != CEILING]
    order = []
    for rep in range(repeats):
        for k, cap in enumerate(caps):
            here = methods if k == 0 else capped
            shift = rep % len(here) if here else 0
            order += [(rep, None if m == CEILING else cap, m) for m in here[shift:] + here[:shift]]
    return order


def run_curve(args) -> list[dict]:
    """Every method at every cap ``args.repeats`` times, in :func:`schedule`'s order; each run tagged with its
    repeat and ``cap_bytes`` (None for the uncapped ceiling)."""
    runs = []
    for rep, cap, method in schedule(args.methods, args.caps_bytes, args.repeats):
        r = run_method(args, method, ram_bytes() if cap is None else cap)
        r.update(repeat=rep, cap_bytes=cap)
        runs.append(r)
        where = f"repeat {rep} cap {'none' if cap is None else format_bytes(cap):>9} {method:<11}"
        if r["failed"]:
            print(f"{where} FAILED (rc {r['returncode']}, oom kill {r['oom_killed']}): {r['stderr_tail'][-400:]}",
                  file=sys.stderr)
        else:
            print(f"{where} {ms_per_iter(r):9.1f} ms/it ({r['iterations']} it)  peak {r['peak_bytes'] / 2**20:7.0f}"
                  f" MiB  hit {'-' if r['hit_ratio'] is None else format(r['hit_ratio'], '.3f')}", file=sys.stderr)
    return runs


# -- summary -----------------------------------------------------------------------------------------------------

STAGES = ("sample", "gather", "wait", "train")  # one rank: no "exchange"


def ms_per_iter(run: dict) -> float:
    return 1e3 * run["wall_s"] / run["iterations"]


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(runs: list[dict], methods) -> dict:
    """Per method: medians over its runs, every time per iteration taken within its run (the memmap gather's
    runs may stop after different numbers of iterations)."""
    out = {}
    for method in methods:
        mine = [r for r in runs if r["method"] == method]
        done = [r for r in mine if not r["failed"]]
        row = {"repeats": len(mine), "failed": len(mine) - len(done), "oom_kills": sum(r["oom_killed"] for r in mine),
               "capped": mine[0]["capped"] if mine else None,
               "peak_bytes_max": max((r["peak_bytes"] for r in mine), default=None)}
        if done:
            row.update(
                iterations=_median(r["iterations"] for r in done), ms_per_iter=_median(ms_per_iter(r) for r in done),
                stages_ms_per_iter={k: _median(1e3 * r["stages_s"][k] / r["iterations"] for r in done)
                                    for k in STAGES},
                hit_ratio=_median(r["hit_ratio"] for r in done),
                feature_bytes_read=_median(r["feature_bytes_read"] for r in done),
                device_bytes_read=_median(r["device_bytes_read"] for r in done),
                peak_bytes=_median(r["peak_bytes"] for r in done),
                peak_rss_anon=_median(r["process_peak"].get("rss_anon") for r in done),
                storage_read_ms_per_iter=_median(r["storage_read_s"] and 1e3 * r["storage_read_s"] / r["iterations"]
                                                 for r in done),
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


def curve(runs: list[dict], caps: list[int], methods, file_bytes: int) -> list[dict]:
    """One record per cap: its runs' summary and ratios (the ceiling's runs, uncapped, belong to every cap)."""
    records = []
    for cap in caps:
        mine = [r for r in runs if r["cap_bytes"] in (cap, None)]
        records.append({"cap": format_bytes(cap), "cap_bytes": cap, "file_over_cap": file_bytes / cap,
                        "summary": summarize(mine, methods), "ratios": ratios(mine)})
    return records


def crossover(records: list[dict], ours: str = "hybrid", peer: str = "memmap") -> dict | None:
    """Where ``peer`` catches up with ``ours`` along the caps: the smallest cap from which on (that cap and every
    larger one) ``peer`` is at least as fast (paired median of peer's time over ours at most 1), and the largest
    cap below it, where ours is faster. None where no cap has both."""
    points = [(rec["cap"], rec["ratios"].get(f"{ours}_speedup_vs_{peer}")) for rec in records]
    points = [(cap, r["median"], spread(r["per_repeat"])) for cap, r in points if r is not None]
    if not points:
        return None
    k = len(points)
    while k > 0 and points[k - 1][1] <= 1:
        k -= 1
    at, behind = (points[k] if k < len(points) else None), (points[k - 1] if k > 0 else None)
    if at is None:
        words = (f"{peer} never catches up with {ours}: at the largest cap, {behind[0]}, {ours} is still "
                 f"{behind[1]:.3g}x faster{behind[2]}")
    elif behind is None:
        words = (f"{peer} is at least as fast as {ours} at every cap: at {at[0]} {ours} runs at {at[1]:.3g}x "
                 f"{peer}'s speed{at[2]}")
    else:
        words = (f"{peer} catches up with {ours} between {behind[0]}, where {ours} is {behind[1]:.3g}x faster"
                 f"{behind[2]}, and {at[0]}, where {ours} runs at {at[1]:.3g}x {peer}'s speed{at[2]}, and stays "
                 "there up to the largest cap")
    return {"ours": ours, "peer": peer, "peer_at_least_as_fast_from": at and at[0],
            "ours_faster_up_to": behind and behind[0], "sentence": words}


def spread(per_repeat: list[float]) -> str:
    """`` (0.68-1.8x per repeat)`` where the repeats differ, else nothing."""
    low, high = min(per_repeat), max(per_repeat)
    return f" ({low:.2g}-{high:.2g}x per repeat)" if len(per_repeat) > 1 and f"{low:.2g}" != f"{high:.2g}" else ""


def table(summary: dict, cap: str = "") -> str:
    lines = [f"{'method':<12}{'cap':>9}{'ms/it':>10}" + "".join(f"{k:>8}" for k in STAGES) +
             f"{'reads':>8}{'hit':>7}{'feat MiB':>10}{'disk MiB':>10}{'peak MiB':>10}{'anon MiB':>10}{'OOM':>5}"]
    for method, s in summary.items():
        if "ms_per_iter" not in s:
            lines.append(f"{method:<12} every run failed ({s['oom_kills']} OOM kills)")
            continue
        hit = "-" if s["hit_ratio"] is None else f"{s['hit_ratio']:.3f}"
        reads = "-" if s["storage_read_ms_per_iter"] is None else f"{s['storage_read_ms_per_iter']:.1f}"
        lines.append(f"{method:<12}{(cap or 'yes') if s['capped'] else 'none':>9}{s['ms_per_iter']:>10.1f}" +
                     "".join(f"{s['stages_ms_per_iter'][k]:>8.1f}" for k in STAGES) +
                     f"{reads:>8}{hit:>7}{s['feature_bytes_read'] / 2**20:>10.0f}"
                     f"{s['device_bytes_read'] / 2**20:>10.0f}"
                     f"{s['peak_bytes'] / 2**20:>10.0f}{s['peak_rss_anon'] / 2**20:>10.0f}{s['oom_kills']:>5}")
    return "\n".join(lines)


STAGE_NOTE = ("(stages are ms per iteration: sample and gather run in the loader thread overlapped with train, wait is "
              "the stall they caused; reads: ms/it the gather spent in storage reads; feat: the feature path's own "
              "byte counter; disk: /proc/self/io)")


def curve_table(records: list[dict], methods) -> str:
    """Time per iteration of every method at every cap, and hybrid's paired ratios to the others."""
    peers = [(f"hybrid_speedup_vs_{m}", f"{m}/hybrid") for m in ("memmap", "storage") if m in methods]
    peers += [("hybrid_slowdown_vs_memory", "hybrid/memory")] if CEILING in methods else []
    peers = peers if "hybrid" in methods else []
    lines = [f"{'cap':>9}{'file/cap':>9}" + "".join(f"{m + ' ms/it':>18}" for m in methods) +
             "".join(f"{label:>16}" for _, label in peers)]
    for rec in records:
        times = [rec["summary"][m].get("ms_per_iter") for m in methods]
        cells = [rec["ratios"].get(key) for key, _ in peers]
        lines.append(f"{rec['cap']:>9}{rec['file_over_cap']:>8.2f}x" +
                     "".join(f"{'failed' if t is None else format(t, '.1f'):>18}" for t in times) +
                     "".join(f"{'-' if c is None else format(c['median'], '.3g') + 'x':>16}" for c in cells))
    return "\n".join(lines)


def repeats(result: dict) -> str:
    n = result["settings"]["repeats"]
    return f"medians of {n} repeats" if n > 1 else "one repeat"


def report(result: dict) -> None:
    """Prints each cap's table, the curve and where memmap catches up."""
    records, methods = result["curve"], result["settings"]["methods"]
    for rec in records:
        print(f"\n-- cap {rec['cap']}: the feature file is {rec['file_over_cap']:.2f}x the cap")
        print(table(rec["summary"], rec["cap"]))
    print(STAGE_NOTE)
    print(f"\n-- the curve: a {format_bytes(result['dataset']['feature_file_bytes'])} feature file, "
          f"{repeats(result)}, ratios paired per repeat")
    print(curve_table(records, methods))
    verdict = crossover(records)  # from the records, so that --from-json reads an older run the same way
    if verdict:
        print(verdict["sentence"])


def plot_curve(result: dict, path: str) -> None:
    """A PNG of time per iteration (log) against the cap, one line per capped method, the uncapped ceiling as a
    level, the feature file's size marked, and hybrid's speedup over memmap written at each cap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    records, methods = result["curve"], result["settings"]["methods"]
    gib = [rec["cap_bytes"] / 2**30 for rec in records]
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for method in (m for m in methods if m != CEILING):
        points = [(x, rec["summary"][method].get("ms_per_iter")) for x, rec in zip(gib, records)]
        points = [(x, t) for x, t in points if t is not None]
        ax.plot([x for x, _ in points], [t for _, t in points], marker="o", color=f"C{METHODS.index(method)}",
                label=method)
    ceiling = records[0]["summary"].get(CEILING, {}).get("ms_per_iter")
    if ceiling is not None:
        ax.axhline(ceiling, color="gray", ls="--", lw=1, label="memory, uncapped (ceiling)")
    file_gib = result["dataset"]["feature_file_bytes"] / 2**30
    ax.axvline(file_gib, color="black", ls=":", lw=1)
    ax.annotate(f"feature file\n{file_gib:.2f} GiB", (file_gib, 0.97), xycoords=("data", "axes fraction"),
                ha="right", va="top", fontsize=8, xytext=(-3, 0), textcoords="offset points")
    for x, rec in zip(gib, records):
        speedup, memmap = rec["ratios"].get("hybrid_speedup_vs_memmap"), rec["summary"].get("memmap", {})
        if speedup is not None and memmap.get("ms_per_iter") is not None:
            ax.annotate(f"{speedup['median']:.3g}x", (x, memmap["ms_per_iter"]), xytext=(4, 4),
                        textcoords="offset points", fontsize=8)
    ax.set_yscale("log")
    ax.margins(x=0.08)  # room for the last cap's label
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xlabel("memory cap, page cache included (GiB)")
    ax.set_ylabel("time per iteration (ms, log scale)")
    ds = result["dataset"]
    ax.set_title(f"{ds['num_nodes']:,} nodes, {repeats(result)} (labels: hybrid's speedup over memmap)", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- command line ------------------------------------------------------------------------------------------------

# The default 4.3 GiB file should fit under 6 GiB with the process beside it: at 3M nodes memmap's peak was the
# 2.86 GiB file plus 0.6 GiB (docs/benchmarks/memory_cap.md, "The curve").
DEFAULT_CAPS = "1G,1.5G,2G,3G,4G,6G"
QUICK_CAPS = "512M,768M"


def parse_caps(text: str) -> list[int]:
    """``--caps``: comma-separated memory limits ("1G,1.5G,4G"), returned in bytes, ascending."""
    parts = [part.strip() for part in str(text).split(",")]
    if not any(parts):
        raise ValueError("--caps is empty: give one or more memory limits, comma-separated, e.g. --caps 1G,2G,4G")
    caps = []
    for part in parts:
        if not part:
            raise ValueError(f"--caps {text!r} has an empty item: separate the limits by single commas, e.g. 1G,2G")
        try:
            cap = parse_bytes(part)
        except ValueError:
            raise ValueError(f"--caps: cannot read {part!r} as a memory limit; use sizes like 512M, 1.5G or 4G") \
                from None
        if cap <= 0:
            raise ValueError(f"--caps: {part!r} is no memory limit; every cap must be above zero, e.g. 512M")
        if cap in caps:
            raise ValueError(f"--caps lists {format_bytes(cap)} twice ({text!r}): give each cap once")
        caps.append(cap)
    return sorted(caps)


def plotting_available() -> str | None:
    """None where matplotlib imports, else why not (for --plot's error)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="/tmp/lsm-gnn-bench/ooc-4.5m", help="generated graph directory (reused)")
    p.add_argument("--num-nodes", type=int, default=4_500_000, help="4.5M: a 4.3 GiB feature file, 4.3x 1 GiB")
    p.add_argument("--feature-dim", type=int, default=256, help="float32 features: 1 KiB rows by default")
    p.add_argument("--caps", "--cap", dest="caps", default=None,
                   help=f"the memory cgroup's limits (page cache included), comma-separated; one value runs one cap "
                        f"(default {DEFAULT_CAPS}; --quick: {QUICK_CAPS})")
    p.add_argument("--capacity", default="4%", help="cache capacity (bytes or share of nodes), the same at every "
                   "cap: 4%% of 4.5M nodes is 176 MiB, what fits beside the process and its topology under 1 GiB")
    _end_to_end().add_batch_args(p)
    p.add_argument("--iterations", type=int, default=400)
    p.add_argument("--memmap-iterations", type=int, default=0,
                   help="iterations of the memmap method, the first of the same batches (0: --iterations)")
    p.add_argument("--memmap-seconds", type=float, default=60,
                   help="the memmap method stops after this many seconds of training, after at least one iteration "
                        "(under a tight cap each takes seconds; 0: no limit)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--pvp-queue-capacity", type=int, default=512, help="lines per victim queue of hybrid+pvp")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for every method (after the benchmark's own), e.g. train.epochs=3")
    p.add_argument("--timeout", type=float, default=1200, help="seconds one run may take before it is killed")
    p.add_argument("--json", default="docs/results/out_of_core.json")
    p.add_argument("--plot", default=None, metavar="PNG", help="draw the curve here (needs matplotlib)")
    p.add_argument("--from-json", default=None, metavar="JSON",
                   help="measure nothing: report (and --plot) the result this file holds, written by a multi-cap run")
    p.add_argument("--quick", action="store_true", help="small graph under two small caps, few iterations, one repeat")
    p.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)  # internal: run one method here
    p.add_argument("--child-spec", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return argparse.Namespace(**{**json.loads(args.child_spec), "child": args.child})
    missing = args.plot and plotting_available()
    if missing:  # before a run of an hour, not after it
        p.error(f"--plot needs matplotlib ({missing}): pip install matplotlib (or pip install -e '.[plot]'), "
                "or leave --plot out and draw later with --from-json RESULT --plot PNG")
    if args.from_json:
        return args
    if args.quick:
        args.num_nodes, args.feature_dim, args.capacity = 40_000, 256, "10%"
        args.iterations, args.memmap_iterations, args.repeats = 10, 0, 1
        args.data = args.data.rstrip("/") + "-quick"
    if args.caps is None:
        args.caps = QUICK_CAPS if args.quick else DEFAULT_CAPS
    try:
        args.caps_bytes = parse_caps(args.caps)
    except ValueError as exc:
        p.error(str(exc))
    args.cap_bytes = args.caps_bytes[0]  # the smallest cap: the headline, whose summary and ratios top the JSON
    args.methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in args.methods if m not in METHODS]
    if bad or not args.methods:
        p.error(f"unknown methods {bad}; valid: {', '.join(METHODS)}" if bad else
                f"--methods is empty; name one or more of {', '.join(METHODS)}")
    return args


def measure(args) -> dict:
    ds = _end_to_end().ensure_graph(args.data, args.num_nodes, args.feature_dim)
    file_bytes = ds.features.file_bytes
    if args.caps_bytes[-1] < file_bytes and not args.quick:
        print(f"note: the largest cap ({format_bytes(args.caps_bytes[-1])}) is smaller than the feature file "
              f"({format_bytes(file_bytes)}), so the curve stops before the file fits in the page cache; add a cap "
              "above the file's size plus the process's own memory (its anon peak in the tables)", file=sys.stderr)
    started = time.time()
    load_before = os.getloadavg()
    runs = run_curve(args)
    records = curve(runs, args.caps_bytes, args.methods, file_bytes)
    return {"settings": {k: v for k, v in vars(args).items() if k not in ("json", "child", "child_spec", "plot")},
            "dataset": {"path": ds.path, "num_nodes": ds.num_nodes, "num_edges": ds.num_edges,
                        "feature_file_bytes": file_bytes, "file_over_cap": file_bytes / args.cap_bytes},
            "machine": {**machine_info(), "load_before": load_before, "load_after": os.getloadavg(),
                        "seconds": time.time() - started},
            "runs": runs, "curve": records, "crossover": crossover(records),
            # the smallest cap's, where a single-cap run kept them
            "summary": records[0]["summary"], "ratios": records[0]["ratios"]}


def load_result(path: str) -> dict:
    with open(path) as f:
        result = json.load(f)
    if "curve" not in result:
        raise SystemExit(f"{path} holds no 'curve': it was written before out_of_core.py measured several caps; "
                         "rerun the benchmark to draw it")
    return result


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.child:
        print(RESULT + json.dumps(run_child(args, args.child)), flush=True)
        return {}
    result = load_result(args.from_json) if args.from_json else measure(args)
    if args.json and not args.from_json:
        write_json(args.json, result)
    report(result)
    if args.plot:
        plot_curve(result, args.plot)
        print(f"plot: {args.plot}")
    return result


if __name__ == "__main__":
    main()
