"""Pipeline efficiency, variants side by side: the same training run with a few config keys changed.

Each run is ``lsm-gnn train CONFIG KEY=VALUE... --json`` in a child process (inside a fresh memory cgroup
with ``--cap``, page cache included), every dataset file dropped from the page cache before it, so each
starts cold. Variants alternate within each repeat (their order rotating), so a machine that gets busier
slows every variant alike; figures are medians over repeats, ratios are taken within each repeat.

From each run's epoch summary: milliseconds per iteration, the storage's busy time (``read_s``), the
training step's (``train_s``) and the pipeline's efficiency, max(read, train) over the wall time
(``docs/training.md``). Default variants: read-ahead off against the default (on).

    python benchmarks/pipeline.py configs/demo.yaml dataset=data/demo            # the demo job
    python benchmarks/pipeline.py configs/demo.yaml dataset=D --cap 1G ...       # under a 1 GiB cap
    python benchmarks/pipeline.py CFG --variant one=train.torch_threads=1 --variant two=train.torch_threads=2
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from lsm_gnn.testing.benchmarking import machine_info, write_json
from lsm_gnn.utils.units import format_bytes, parse_bytes

DEFAULT_VARIANTS = ("serial=cache.read_ahead=0", "read-ahead=cache.read_ahead=auto")


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``NAME=KEY=VALUE[,KEY=VALUE...]`` as (name, overrides)."""
    name, sep, keys = text.partition("=")
    if not sep or not name or "=" not in keys:
        raise SystemExit(f"--variant {text!r}: give NAME=KEY=VALUE[,KEY=VALUE...], e.g. serial=cache.read_ahead=0")
    return name, keys.split(",")


def dataset_files(overrides: list[str], config: str) -> list[str]:
    """The files of the run's dataset, to drop from the page cache before each run."""
    from lsm_gnn.config import load_config

    root = load_config(config, overrides).dataset
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files]


def evict(paths: list[str]) -> None:
    from lsm_gnn.storage.probe import evict_page_cache

    for path in paths:
        evict_page_cache(path)


def run_once(args, name: str, keys: list[str], workdir: str) -> dict:
    """One training run of a variant: its epoch summary's figures."""
    out = os.path.join(workdir, name)
    summary = os.path.join(workdir, f"{name}.json")
    cmd = [sys.executable, "-m", "lsm_gnn", "train", args.config, *args.overrides, *keys,
           f"log.dir={out}", f"checkpoint.dir={out}", "checkpoint.resume=false", "log.progress=false",
           "train.eval_splits=[]", "--json", summary]
    if args.cap:
        from lsm_gnn.utils.memcap import MemoryCap

        with MemoryCap(parse_bytes(args.cap)) as cap:
            run = cap.run(cmd, timeout=args.timeout)
        ok, stderr, peak = run.returncode == 0 and not run.oom_killed, run.stderr, run.peak_bytes
    else:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        ok, stderr, peak = proc.returncode == 0, proc.stderr, None
    if not ok:
        raise SystemExit(f"variant {name} failed:\n{stderr[-3000:]}")
    with open(summary) as fh:
        epoch = json.load(fh)["history"][0]
    it = epoch["iterations"]
    return {"ms_per_iteration": 1e3 * epoch["wall_s"] / it, "read_ms": 1e3 * epoch["read_s"] / it,
            "train_ms": 1e3 * epoch["train_s"] / it, "pipeline_efficiency": epoch["pipeline_efficiency"],
            "hit_ratio": epoch["hit_ratio"], "loss": epoch["loss"], "peak_bytes": peak}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", help="KEY=VALUE for every variant (e.g. dataset=...)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=VALUE[,KEY=VALUE]",
                   help=f"a variant (repeatable); default: {', '.join(DEFAULT_VARIANTS)}")
    p.add_argument("--cap", default=None, help="memory cgroup limit of each run, page cache included (e.g. 1G)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    if args.repeats < 1:
        raise SystemExit(f"--repeats must be >= 1, got {args.repeats}")
    variants = [parse_variant(v) for v in (args.variant or DEFAULT_VARIANTS)]
    names = [n for n, _ in variants]
    if len(set(names)) != len(names):
        raise SystemExit(f"variant names must differ, got {names}")
    files = dataset_files(args.overrides, args.config)
    runs: dict[str, list[dict]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="lsm-gnn-pipeline-") as workdir:
        for r in range(args.repeats):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for name, keys in order:
                evict(files)
                runs[name].append(run_once(args, name, keys, workdir))
                m = runs[name][-1]
                print(f"repeat {r + 1} {name:>12}: {m['ms_per_iteration']:7.1f} ms/it, read {m['read_ms']:6.1f}, "
                      f"train {m['train_ms']:6.1f}, efficiency {m['pipeline_efficiency']:.2f}, loss {m['loss']:.6f}",
                      flush=True)
    first = names[0]
    print(f"\nmedians of {args.repeats} repeats{' under a ' + args.cap + ' cap' if args.cap else ''}; speed-up: "
          f"{first}'s time per iteration over the variant's, within each repeat")
    print(f"{'variant':>12} {'ms/it':>8} {'read ms':>8} {'train ms':>9} {'eff.':>6} {'peak':>10} {'speed-up':>9}")
    result = {"config": args.config, "overrides": args.overrides, "cap": args.cap, "repeats": args.repeats,
              "machine": machine_info(), "variants": {}}
    for name, keys in variants:
        rows = runs[name]
        med = {k: statistics.median(m[k] for m in rows) for k in ("ms_per_iteration", "read_ms", "train_ms",
                                                                    "pipeline_efficiency")}
        ratio = statistics.median(a["ms_per_iteration"] / b["ms_per_iteration"] for a, b in zip(runs[first], rows))
        peaks = [m["peak_bytes"] for m in rows if m["peak_bytes"] is not None]
        peak = format_bytes(max(peaks)) if peaks else "-"
        print(f"{name:>12} {med['ms_per_iteration']:8.1f} {med['read_ms']:8.1f} {med['train_ms']:9.1f} "
              f"{med['pipeline_efficiency']:6.2f} {peak:>10} {ratio:8.2f}x")
        result["variants"][name] = {"keys": keys, "runs": rows, "median": med, "speedup_over_first": ratio}
    losses = {name: [m["loss"] for m in runs[name]] for name in names}
    same = len({loss for row in losses.values() for loss in row}) == 1
    print("every run ends with the same loss" if same else f"losses differ: {losses}")
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
