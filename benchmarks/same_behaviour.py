"""Same behaviour at two commits: a refactor's check, side by side.

Runs the same trainings from checkouts of two commits, alternately, ``--repeats`` times each, and compares
what they did: every iteration's loss, hit ratio and bytes read (metrics.jsonl), the evaluations, and the
time per iteration (medians over the repeats). The runs: the README's demo job (``configs/demo.yaml`` on the
demo graph), a heterogeneous graph, link prediction with node embeddings on disk, and two gloo ranks sharing
one cache (torchrun). Read-ahead is off in every run: what it reads ahead lands in an iteration by timing (its
bytes are exact over an epoch, not per iteration), so with it on two equal runs can differ in per-iteration
bytes. Timings (wall seconds in the evaluations) are left out of the comparison::

    python benchmarks/same_behaviour.py --before cee1a75 --after HEAD --json docs/results/same_behaviour.json

Both commits must share the native extension's sources (``csrc/``): the built ``lsm_gnn/_C*.so`` of this
checkout serves both. Exit status 1 when any run's record differs.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: per-iteration fields that must be equal, bit for bit
SAME_PER_ITERATION = ("loss", "hit_ratio", "bytes_read", "hit_ratio_by_type", "pvp_hits")


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", REPO, *args], check=True, capture_output=True, text=True).stdout.strip()


def _checkout(commit: str, where: str) -> str:
    """A detached worktree of ``commit`` with this checkout's native extension."""
    _git("worktree", "add", "--detach", "--force", where, commit)
    for built in glob.glob(os.path.join(REPO, "lsm_gnn", "_C*.so")):
        shutil.copy2(built, os.path.join(where, "lsm_gnn"))
    return where


def _run(checkout: str, argv: list[str], nproc: int = 1) -> None:
    env = dict(os.environ, PYTHONPATH=checkout, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // nproc)))
    launcher = [sys.executable, "-m", "lsm_gnn"] if nproc == 1 else \
        [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_port=29571",
         "-m", "lsm_gnn"]
    done = subprocess.run([*launcher, "train", *argv], cwd=checkout, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed in {checkout}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def _untimed(value):
    """``value`` without its wall-clock fields (``seconds``, ``*_s``), which differ between equal runs."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k != "seconds" and not k.endswith("_s")}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def _record(run_dir: str) -> dict:
    """What a run did: the per-iteration fields, the evaluations, and its seconds per iteration."""
    lines = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    iterations = [r for r in lines if "iteration" in r and "loss" in r]
    with open(os.path.join(run_dir, "result.json")) as f:
        result = json.load(f)
    per_iteration = {key: [r.get(key) for r in iterations] for key in SAME_PER_ITERATION}
    return {"per_iteration": per_iteration, "evaluations": _untimed(result.get("evaluations")),
            "eval": _untimed(result.get("eval")),
            "iterations": result["iterations"], "ms_per_iteration": 1e3 * result["wall_s"] / result["iterations"]}


def _cases(data: str) -> dict[str, tuple[list[str], int]]:
    demo, hetero, shop = (os.path.join(data, name) for name in ("demo", "hetero", "shop"))
    return {
        "demo": (["configs/demo.yaml", f"dataset={demo}"], 1),
        "hetero": (["configs/demo.yaml", f"dataset={hetero}", "sampler.fanouts=[5,5]", "sampler.batch_size=128",
                    "model.hidden=64", "cache.capacity=40%"], 1),
        "link + node embeddings": (
            ["configs/demo.yaml", f"dataset={shop}", "train.task=link",
             "sampler.fanouts=[5,5]", "train.epochs=2", "sampler.batch_size=64",
             "model.hidden=64", "model.node_embedding.dim=32", "model.node_embedding.capacity=50%",
             "cache.capacity=50%"], 1),
        "2 ranks sharing one cache": (["configs/demo.yaml", f"dataset={demo}", "train.max_iterations=60"], 2),
    }


def _prepare(checkout: str, data: str) -> None:
    env = dict(os.environ, PYTHONPATH=checkout)
    steps = [
        ["synthetic", "--out", os.path.join(data, "demo"), "--num-nodes", "200000", "--avg-degree", "10",
         "--feature-dim", "128"],
        ["hetero", "synthetic", "--out", os.path.join(data, "hetero"), "--num-papers", "20000", "--feature-dim", "32"],
        ["bipartite", "--out", os.path.join(data, "shop"), "--num-users", "5000", "--num-items", "2500",
         "--avg-interactions", "5",
         "--val-fraction", "0.1"],
    ]
    for step in steps:
        if not os.path.isdir(step[step.index("--out") + 1]):
            subprocess.run([sys.executable, "-m", "lsm_gnn", "prepare", *step], cwd=checkout, env=env, check=True,
                           capture_output=True)


def _differences(before: dict, after: dict) -> list[str]:
    found = []
    for key, values in before["per_iteration"].items():
        others = after["per_iteration"][key]
        if len(values) != len(others):
            found.append(f"{key} differs ({len(values)} vs {len(others)} iterations logged)")
        elif values != others:
            first = next(i for i, (a, b) in enumerate(zip(values, others)) if a != b)
            found.append(f"{key} differs (first at iteration {first})")
    for key in ("evaluations", "eval", "iterations"):
        if before[key] != after[key]:
            found.append(f"{key} differs: {before[key]} vs {after[key]}")
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the commit before the change")
    parser.add_argument("--after", default="HEAD", help="the commit after it (default HEAD)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each case at each commit, alternating")
    parser.add_argument("--data", default="data/same_behaviour", help="where the generated datasets are kept")
    parser.add_argument("--cases", help="comma-separated subset of: " + ", ".join(_cases("")))
    parser.add_argument("--json", help="write the comparison here")
    parser.add_argument("--native-unchanged", action="store_true",
                        help="run although csrc/ differs between the commits, where you know the change leaves the "
                             "built code as it is (comments only): the diff is printed")
    args = parser.parse_args(argv)
    native = _git("diff", "--stat", args.before, args.after, "--", "csrc", "setup.py")
    if native and args.native_unchanged:
        print(f"csrc/ differs, taken as unchanged code (--native-unchanged):\n{native}", flush=True)
    elif native:
        raise SystemExit(f"csrc/ or setup.py changed between the commits; one built extension cannot serve both:\n"
                         f"{native}")
    commits = {"before": _git("rev-parse", args.before), "after": _git("rev-parse", args.after)}
    data = os.path.abspath(args.data)
    work = tempfile.mkdtemp(prefix="same-behaviour-")
    try:
        checkouts = {side: _checkout(commit, os.path.join(work, side)) for side, commit in commits.items()}
        _prepare(checkouts["after"], data)
        cases = _cases(data)
        chosen = list(cases) if args.cases is None else [c.strip() for c in args.cases.split(",")]
        report = {"commits": commits, "repeats": args.repeats, "cases": {}}
        failed = False
        for case in chosen:
            argv_case, nproc = cases[case]
            records = {"before": [], "after": []}
            for repeat in range(args.repeats):
                for side in (("before", "after") if repeat % 2 == 0 else ("after", "before")):
                    run_dir = os.path.join(work, "runs", f"{case.replace(' ', '_')}-{side}-{repeat}")
                    os.makedirs(run_dir)
                    _run(checkouts[side], [*argv_case, "cache.read_ahead=0", f"log.dir={run_dir}",
                                           f"checkpoint.dir={run_dir}",
                                           "checkpoint.resume=false", "--json", os.path.join(run_dir, "result.json")],
                         nproc)
                    records[side].append(_record(run_dir))
            problems = _differences(records["before"][0], records["after"][0])
            problems += [f"repeat {k} of 'after' differs from its first run: {p}"
                         for k, r in enumerate(records["after"][1:], 1) for p in _differences(records["after"][0], r)]
            ms = {side: statistics.median(r["ms_per_iteration"] for r in runs) for side, runs in records.items()}
            report["cases"][case] = {"identical": not problems, "problems": problems,
                                     "iterations": records["after"][0]["iterations"],
                                     "ms_per_iteration": ms, "after_over_before": ms["after"] / ms["before"],
                                     "ms_per_iteration_runs": {side: [round(r["ms_per_iteration"], 2) for r in runs]
                                                               for side, runs in records.items()},
                                     "eval": records["after"][0]["eval"]}
            failed |= bool(problems)
            print(f"{case:<28} {'identical' if not problems else 'DIFFERENT'}  {report['cases'][case]['iterations']} "
                  f"iterations  ms/it {ms['before']:.1f} -> {ms['after']:.1f} "
                  f"({ms['after'] / ms['before']:.3f}x)" + "".join(f"\n    {p}" for p in problems), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=2)
        return 1 if failed else 0
    finally:
        for side in ("before", "after"):
            subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", os.path.join(work, side)],
                           capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
