"""Wall time and memory of ``lsm-gnn prepare synthetic`` at scale, phase by phase.

Runs the generator as a child process (the command a user types), follows
its progress lines to learn the phase (features; edges: generate + bucket;
CSR sort; labels and splits; each score; commit) and samples the child's
``/proc/<pid>/status`` every ``--interval`` seconds: ``RssAnon`` (memory the
process itself needs) and ``RssFile`` (mapped file pages, which the kernel
may drop) per phase. The process's peak resident set comes from
``getrusage`` (what ``/usr/bin/time -v`` reports). Prints a line every
``--report-every`` seconds, so a run left in the background shows where it
is, and writes JSON at the end.

    python benchmarks/generate_scale.py --num-nodes 1e7 --out /work/data-scale/syn1e7
    nohup python benchmarks/generate_scale.py --num-nodes 1e8 --out /work/data-scale/syn1e8 \\
        --json docs/results/generate_scale_1e8.json > gen1e8.log 2>&1 &
    python benchmarks/generate_scale.py --predict docs/results/generate_scale_1e6.json \\
        docs/results/generate_scale_1e7.json --num-nodes 1e8       # a linear extrapolation, no run

Extra ``prepare synthetic`` options go after ``--``, e.g. ``-- --dtype float16``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import time

from lsm_gnn.cli.prepare import parse_count
from lsm_gnn.testing.benchmarking import machine_info, write_json

# A progress line's start -> the phase it opens (tqdm bars by their description, the generator's notes).
PHASES = (("features:", "features"), ("edges:", "edges: generate + bucket"), ("sorting ", "csr: sort + write"),
          ("labels and splits", "labels + splits"), ("computing scores: ", "score"), ("committing", "commit"))
_STATUS_FIELDS = ("VmRSS", "RssAnon", "RssFile")


def phase_of(line: str) -> str | None:
    """The phase a progress line opens, or None for a line inside the current phase."""
    for prefix, phase in PHASES:
        if line.startswith(prefix):
            return f"score: {line[len(prefix):].strip()}" if phase == "score" else phase
    return None


def status_bytes(pid: int) -> dict[str, int] | None:
    """VmRSS, RssAnon and RssFile of a running process, in bytes; None once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return None
    out = {}
    for name in _STATUS_FIELDS:
        match = re.search(rf"^{name}:\s+(\d+) kB", text, re.M)
        out[name] = int(match.group(1)) * 1024 if match else 0
    return out


class PhaseMonitor:
    """Phases of the child (from its stderr) with their start times, and its memory sampled from /proc.

    A phase starts when its progress line reaches this process, a moment after the child began it, so a
    phase's peak may include the first samples of the next one; the series in the result file shows
    where each peak lies.
    """

    def __init__(self, pid: int, start: float):
        self.pid, self.start = pid, start
        self.phases: list[dict] = []
        self.samples: list[tuple[float, int, int, int]] = []  # (time, RssAnon, RssFile, VmRSS)
        self.lock = threading.Lock()
        self.open_phase("start", start)

    def open_phase(self, name: str, now: float) -> None:
        with self.lock:
            if any(p["name"] == name for p in self.phases):
                return  # a progress bar drawn again (phases only move forward)
            self.phases.append({"name": name, "start": now})
            print(f"[{now - self.start:8.1f} s] phase: {name}", flush=True)

    def current(self) -> str:
        with self.lock:
            return self.phases[-1]["name"]

    def sample(self) -> dict[str, int] | None:
        status = status_bytes(self.pid)
        if status is not None:
            self.samples.append((time.perf_counter(), status["RssAnon"], status["RssFile"], status["VmRSS"]))
        return status

    def finish(self, now: float) -> list[dict]:
        with self.lock:
            phases = [dict(p) for p in self.phases]
        for i, phase in enumerate(phases):
            last = i + 1 == len(phases)
            end = now if last else phases[i + 1]["start"]
            mine = [x for x in self.samples if phase["start"] <= x[0] < end]
            phase.update(seconds=end - phase["start"], start=phase["start"] - self.start,
                         peak_rss_anon=max((x[1] for x in mine), default=0),
                         peak_rss_file=max((x[2] for x in mine), default=0),
                         peak_rss=max((x[3] for x in mine), default=0))
        return phases

    def series(self, every: float = 1.0) -> list[list[float]]:
        """(seconds, RssAnon MiB, RssFile MiB) about every ``every`` seconds, for the result file."""
        out, last = [], -every
        for t, anon, file, _ in self.samples:
            if t - last >= every:
                out.append([round(t - self.start, 2), round(anon / 2**20, 1), round(file / 2**20, 1)])
                last = t
        return out


def _follow_stderr(stream, monitor: PhaseMonitor, tail: list[str]) -> None:
    """Reads the child's stderr (tqdm redraws with carriage returns) and opens phases as they start."""
    buffer = ""
    while True:
        data = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
        if not data:
            break
        buffer += data.decode(errors="replace")
        *lines, buffer = re.split(r"[\r\n]", buffer)
        for line in lines:
            line = line.strip()
            if not line:
                continue
            phase = phase_of(line)
            if phase is not None:
                monitor.open_phase(phase, time.perf_counter())
            tail.append(line)
            del tail[:-20]


def disk_estimate(num_nodes: int, extra: list[str]) -> int:
    """Bytes the generation needs at its peak: the feature file, the CSR (int32 ids: 4 bytes an entry, 8 a
    node), the bucket files of the CSR sort (8 bytes an entry, before dedup), labels, splits and scores
    (8 + 8 + 8 bytes a node). Entries: two per generated edge, ``avg_degree`` a node."""
    from lsm_gnn.data.format import feature_file_bytes, row_stride_for

    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--feature-dim", type=parse_count, default=128)
    options.add_argument("--dtype", default="float32")
    options.add_argument("--avg-degree", type=float, default=10.0)
    known, _ = options.parse_known_args(extra)
    row_bytes = known.feature_dim * (2 if known.dtype == "float16" else 4)
    entries = int(num_nodes * known.avg_degree)
    return feature_file_bytes(num_nodes, row_stride_for(row_bytes)) + 12 * entries + 32 * num_nodes


def run_generation(args, extra: list[str]) -> dict:
    out = os.path.abspath(args.out)
    needed = disk_estimate(args.num_nodes, extra)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    free = shutil.disk_usage(parent).free
    print(f"disk: about {needed / 2**30:,.1f} GiB needed at the peak, {free / 2**30:,.1f} GiB free in {parent}",
          flush=True)
    if needed > free and not args.force:
        raise SystemExit(f"{parent} has {free / 2**30:,.1f} GiB free but the generation needs about "
                         f"{needed / 2**30:,.1f} GiB; free space, pick another --out, shrink the features "
                         "(-- --dtype float16 or --feature-dim), or pass --force to try anyway")
    command = [sys.executable, "-m", "lsm_gnn", "prepare", "synthetic", "--num-nodes", str(args.num_nodes),
               "--out", out, *(["--overwrite"] if args.overwrite else []), *extra]
    print("running: " + " ".join(command), flush=True)
    load_before = os.getloadavg()
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    monitor = PhaseMonitor(child.pid, start)
    tail: list[str] = []
    reader = threading.Thread(target=_follow_stderr, args=(child.stderr, monitor, tail), daemon=True)
    reader.start()
    last_report = start
    while child.poll() is None:
        status = monitor.sample()
        now = time.perf_counter()
        if status is not None and now - last_report >= args.report_every:
            last_report = now
            print(f"[{now - start:8.1f} s] {monitor.current()}: rss {status['VmRSS'] / 2**20:,.0f} MiB "
                  f"(anon {status['RssAnon'] / 2**20:,.0f}, file {status['RssFile'] / 2**20:,.0f}); "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)
        time.sleep(args.interval)
    end = time.perf_counter()
    reader.join()
    summary = child.stdout.read().decode().strip()
    if child.returncode != 0:
        raise SystemExit(f"the generator failed (exit {child.returncode}):\n" + "\n".join(tail))
    max_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # kB on Linux
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)
    sizes = {name: os.path.getsize(os.path.join(out, name)) for name in ("indptr.npy", "indices.npy", "features.bin")}
    num_edges = meta["num_edges"]
    result = {
        "command": " ".join(["lsm-gnn", *command[3:]]),
        "num_nodes": meta["num_nodes"], "num_edges": num_edges, "generator": meta.get("generator"),
        "wall_seconds": end - start, "max_rss_bytes": max_rss, "phases": monitor.finish(end),
        "memory_series_mib": monitor.series(),
        "file_bytes": sizes,
        "topology_bytes_per_edge": (sizes["indptr.npy"] + sizes["indices.npy"]) / max(num_edges, 1),
        "summary": summary, "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "machine": {**machine_info(), "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")},
    }
    if args.remove:
        shutil.rmtree(out)
    return result


def predict(paths: list[str], num_nodes: int) -> dict:
    """Per phase, seconds and peak anonymous memory as ``a + b * num_nodes`` through two measured runs (the
    generator's work per node is fixed by its parameters, so edges scale with nodes): a linear extrapolation,
    blind to effects that appear only at the larger size (page cache misses, disk bandwidth)."""
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append(json.load(f))
    if len(runs) != 2 or runs[0]["num_nodes"] == runs[1]["num_nodes"]:
        raise SystemExit("--predict needs two result files of different --num-nodes")
    (n0, r0), (n1, r1) = sorted(((r["num_nodes"], r) for r in runs), key=lambda x: x[0])

    def line(v0: float, v1: float) -> float:
        return v0 + (v1 - v0) * (num_nodes - n0) / (n1 - n0)

    phases0 = {p["name"]: p for p in r0["phases"]}
    rows = []
    for phase in r1["phases"]:
        if phase["name"] not in phases0:
            continue
        p0 = phases0[phase["name"]]
        rows.append({"name": phase["name"], "seconds": line(p0["seconds"], phase["seconds"]),
                     "peak_rss_anon": line(p0["peak_rss_anon"], phase["peak_rss_anon"])})
    return {"prediction": True, "from": paths, "num_nodes": num_nodes,
            "note": "a straight line through two measured runs, not a measurement; a phase shorter than the "
                    "sampling interval, or whose peak lies at a phase boundary, makes its memory line unreliable "
                    "(docs/benchmarks/scale.md, 'Out of core: topology and scale')",
            "wall_seconds": line(r0["wall_seconds"], r1["wall_seconds"]),
            "max_rss_anon_bytes": max(r["peak_rss_anon"] for r in rows), "phases": rows}


def _print_phases(result: dict) -> None:
    print(f"{'phase':<28}{'seconds':>10}{'peak anon MiB':>15}{'peak rss MiB':>14}")
    for p in result["phases"]:
        rss = f"{p['peak_rss'] / 2**20:>14,.0f}" if "peak_rss" in p else ""
        print(f"{p['name']:<28}{p['seconds']:>10.1f}{p['peak_rss_anon'] / 2**20:>15,.0f}{rss}")
    print(f"total {result['wall_seconds']:.1f} s" + (f", max RSS {result['max_rss_bytes'] / 2**20:,.0f} MiB"
                                                     if "max_rss_bytes" in result else ""))


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-nodes", type=parse_count, default=10**6)
    p.add_argument("--out", help="dataset path (default /work/data-scale/syn-<num-nodes>)")
    p.add_argument("--json", help="result file (default docs/results/generate_scale_<1eN>.json)")
    p.add_argument("--interval", type=float, default=0.2, help="seconds between memory samples")
    p.add_argument("--report-every", type=float, default=30.0, help="seconds between progress lines")
    p.add_argument("--overwrite", action="store_true", help="replace a dataset already at --out")
    p.add_argument("--remove", action="store_true", help="delete the dataset once measured")
    p.add_argument("--force", action="store_true", help="run even when the disk looks too small")
    p.add_argument("--predict", nargs=2, metavar="RESULT_JSON",
                   help="extrapolate --num-nodes from two measured runs instead of running")
    args = p.parse_args(argv)
    tag = f"1e{len(str(args.num_nodes)) - 1}" if str(args.num_nodes).rstrip("0") == "1" else str(args.num_nodes)
    if args.predict:
        result = predict(args.predict, args.num_nodes)
        _print_phases(result)
        if args.json:
            write_json(args.json, result)
        return result
    args.out = args.out or f"/work/data-scale/syn-{tag}"
    result = run_generation(args, extra)
    _print_phases(result)
    write_json(args.json or f"docs/results/generate_scale_{tag}.json", result)
    return result


if __name__ == "__main__":
    main()
