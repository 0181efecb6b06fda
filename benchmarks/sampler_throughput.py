"""Neighbor sampler throughput (sampled edges/s) beside a vectorized numpy reference.

Both sample uniformly without replacement, hop by hop, and number the
reached nodes. The numpy reference is vectorized, not a Python loop, so the
ratio is against a fair baseline: nodes with at most k neighbors take all;
up to 2k, a random key per candidate and a segmented sort; above (the hubs
of a power-law graph), k random positions per node with the rare rows that
repeat one redrawn. Ours: medians over --repeats; the reference, seconds per batch on a
power-law graph, is timed once over --numpy-batches. Ratios print last.

With ``--caps 0.25,0.5`` it also measures the sampler with the topology
out of core: each measurement runs in a child process inside a memory cgroup
(:class:`lsm_gnn.utils.memcap.MemoryCap`) limited to the child's own needs (its
measured peak with nothing sampled: imports, the opened dataset) plus that
share of the topology files, whose page cache is dropped first
(``posix_fadvise(DONTNEED)``). The uncapped run beside it starts with the
topology read into the page cache (the in-memory ceiling). Each child warms
up on ``--warm-batches`` batches, then times ``--repeats`` groups of
``--batches`` batches never sampled before (a page cache of the cap's size
holds what the warm-up left, not the batches timed); medians over
``--cap-runs`` runs, uncapped and capped interleaved, and the ratio capped /
uncapped within each run.

    python benchmarks/sampler_throughput.py --data /work/bench-data/rmat-2000000-d15-s0
    python benchmarks/sampler_throughput.py --quick
    python benchmarks/sampler_throughput.py --data /work/data-scale/syn1e7 --no-numpy --caps 0.25,0.5 \\
        --setups "10,5@512" --threads 2 --json docs/results/sampler_topology_capped.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from lsm_gnn.data import open_dataset
from lsm_gnn.sampling import OneTypeSampler
from lsm_gnn.sampling.neighbor import TOPOLOGY_ACCESS
from lsm_gnn.testing.benchmarking import disk_read_bytes, median_seconds, write_json


def _sample_positions(degree: np.ndarray, k: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(segment, position) of min(k, degree) distinct neighbor positions per node, vectorized."""
    segments, positions = [], []
    take_all = np.flatnonzero(degree <= k) if k >= 0 else np.arange(degree.size)
    segments.append(np.repeat(take_all, degree[take_all]))
    positions.append(np.arange(segments[-1].size) - np.repeat(np.cumsum(degree[take_all]) - degree[take_all],
                                                               degree[take_all]))
    if k < 0:
        return np.concatenate(segments), np.concatenate(positions)
    # Few candidates: a random key per candidate and a segmented sort.
    near = np.flatnonzero((degree > k) & (degree <= 2 * k))
    d = degree[near]
    seg = np.repeat(np.arange(near.size), d)
    pos = np.arange(seg.size) - np.repeat(np.cumsum(d) - d, d)
    order = np.lexsort((rng.random(seg.size), seg))
    rank = np.empty(seg.size, np.int64)
    rank[order] = pos  # sorted order keeps segments contiguous, so pos there is the rank in the segment
    keep = rank < k
    segments.append(near[seg[keep]])
    positions.append(pos[keep])
    # Many candidates (hubs): draw k positions, redraw the rows that repeat one (rare when degree > 2k).
    far = np.flatnonzero(degree > 2 * k)
    draws = (rng.random((far.size, k)) * degree[far, None]).astype(np.int64)
    redo = np.arange(far.size)
    while redo.size:
        rows = np.sort(draws[redo], axis=1)
        redo = redo[(np.diff(rows, axis=1) == 0).any(axis=1)]
        draws[redo] = (rng.random((redo.size, k)) * degree[far[redo], None]).astype(np.int64)
    segments.append(np.repeat(far, k))
    positions.append(draws.reshape(-1))
    return np.concatenate(segments), np.concatenate(positions)


def numpy_sample(indptr: np.ndarray, indices: np.ndarray, seeds: np.ndarray, fanouts, rng) -> int:
    """The reference: returns the number of sampled edges."""
    nodes = seeds
    known = np.sort(seeds)
    edges = 0
    for k in fanouts:
        segment, position = _sample_positions(indptr[nodes + 1] - indptr[nodes], k, rng)
        chosen = indices[indptr[nodes][segment] + position]
        edges += chosen.size
        new = np.setdiff1d(np.unique(chosen), known, assume_unique=True)
        known = np.union1d(known, new)
        nodes = np.concatenate([nodes, new])
    return edges


# -- the topology out of core ---------------------------------------------------------------------------------

CAP_SLACK = 32 << 20  # above the child's measured needs, so run-to-run variation does not OOM-kill it


def topology_files(ds) -> list[str]:
    return [ds.file_path(ds.meta["graph"]["indptr"]), ds.file_path(ds.meta["graph"]["indices"])]


def drop_page_cache(paths) -> None:
    """Asks the kernel to drop the files' clean cached pages, so the next reads come from the device."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_into_page_cache(paths) -> None:
    for path in paths:
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass


def stream_batches(train: np.ndarray, batch_size: int, first: int, count: int) -> list[np.ndarray]:
    """Batches ``first .. first + count`` of a seeded stream: each batch differs from every other."""
    return [np.random.default_rng(b).choice(train, batch_size, replace=False) for b in range(first, first + count)]


def child_measure(spec: dict) -> dict:
    """In the (capped) child: opens the dataset, warms up, times groups of fresh batches."""
    ds = open_dataset(spec["data"], check="fast")
    sampler = OneTypeSampler(ds, spec["fanouts"], seed=0, num_threads=spec["threads"],
                              topology_access=spec["access"])
    train = np.asarray(ds.split("train"))
    warm = stream_batches(train, spec["batch_size"], 0, spec["warm"])
    for i, b in enumerate(warm):
        sampler.sample(b, i)
    rates = []
    for r in range(spec["repeats"]):
        group = stream_batches(train, spec["batch_size"], spec["warm"] + r * spec["batches"], spec["batches"])
        start = time.perf_counter()
        edges = sum(sum(h.edge_index.shape[1] for h in sampler.sample(b, i)) for i, b in enumerate(group))
        rates.append(edges / (time.perf_counter() - start))
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if line.startswith(("VmHWM", "RssFile", "RssAnon")))
    return {"edges_per_s": statistics.median(rates), "rates": rates,
            **{k: int(v.split()[0]) * 1024 for k, v in status.items()}}


def run_child(spec: dict, limit_bytes: int) -> tuple[dict, int, bool]:
    """Runs :func:`child_measure` in a memory cgroup of ``limit_bytes``: (result, cgroup peak, OOM killed)."""
    from lsm_gnn.utils.memcap import MemoryCap

    disk_before, start = disk_read_bytes(spec["data"]), time.perf_counter()
    with MemoryCap(limit_bytes) as cap:
        # The child imports lsm_gnn from this checkout, installed or not.
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        run = cap.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)], timeout=3600,
                      env=env)
    if run.returncode != 0 and not run.oom_killed:
        raise RuntimeError(f"the sampling child failed (exit {run.returncode}):\n{run.stderr[-2000:]}")
    result = json.loads(run.stdout.strip().splitlines()[-1]) if run.returncode == 0 else {}
    # The whole disk's reads while the child ran (its own included): another job's show here.
    result["disk_read_mib_per_s"] = (disk_read_bytes(spec["data"]) - disk_before) / 2**20 / (
        time.perf_counter() - start)
    return result, run.peak_bytes, run.oom_killed


def capped_rows(ds, args, setups) -> dict:
    """Sampler throughput with the topology in the page cache and capped to fractions of it."""
    files = topology_files(ds)
    topology_bytes = sum(os.path.getsize(f) for f in files)
    fractions = [float(x) for x in args.caps.split(",")]
    threads = int(args.cap_threads)
    rows = []
    for fanouts, batch_size in setups:
        spec = {"data": ds.path, "fanouts": fanouts, "batch_size": batch_size, "threads": threads,
                "warm": args.warm_batches, "batches": args.batches, "repeats": args.repeats,
                "access": args.topology_access}
        runs = {"uncapped": [], **{f: [] for f in fractions}}
        peaks: dict = {f: [] for f in fractions}
        disk: dict = {"uncapped": [], **{f: [] for f in fractions}}  # the whole disk's MiB/s per child
        limits: dict = {}
        oom = False
        for run in range(args.cap_runs):
            drop_page_cache(files)
            read_into_page_cache(files)  # by this process: the child's cgroup is not charged for these pages
            result, overhead, _ = run_child(spec, 1 << 36)
            runs["uncapped"].append(result["edges_per_s"])
            disk["uncapped"].append(result["disk_read_mib_per_s"])
            if not limits:
                # What the child needs besides the topology (imports, the dataset's other arrays, sampling
                # buffers): its cgroup's peak when the topology was already cached by someone else.
                limits = {f: int(overhead + CAP_SLACK + f * topology_bytes) for f in fractions}
            for f in fractions:
                drop_page_cache(files)
                result, peak, killed = run_child(spec, limits[f])
                oom |= killed
                runs[f].append(result.get("edges_per_s", 0.0))
                peaks[f].append(peak)
                disk[f].append(result["disk_read_mib_per_s"])
                print(f"{fanouts}@{batch_size} run {run}: uncapped {runs['uncapped'][-1]:,.0f} e/s, "
                      f"cap {f:g} of topology {runs[f][-1]:,.0f} e/s, cgroup peak {peak / 2**20:,.0f} MiB "
                      f"of {limits[f] / 2**20:,.0f}; disk reads {disk[f][-1]:,.0f} MiB/s; "
                      f"load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
        row = {"fanouts": fanouts, "batch_size": batch_size, "threads": threads,
               "topology_access": args.topology_access,
               "child_overhead_bytes": min(limits.values()) - CAP_SLACK - min(fractions) * topology_bytes,
               "uncapped_edges_per_s": statistics.median(runs["uncapped"]),
               "uncapped_runs": runs["uncapped"], "uncapped_disk_read_mib_per_s": disk["uncapped"],
               "oom_killed": oom, "caps": []}
        for f in fractions:
            ratios = [c / u for c, u in zip(runs[f], runs["uncapped"])]
            row["caps"].append({"topology_fraction": f, "limit_bytes": limits[f], "peak_bytes": max(peaks[f]),
                                "edges_per_s": statistics.median(runs[f]), "runs": runs[f],
                                "disk_read_mib_per_s": disk[f],
                                "capped_over_uncapped": statistics.median(ratios)})
        rows.append(row)
    return {"topology_bytes": topology_bytes, "files": files, "rows": rows}


def _print_capped(capped: dict) -> None:
    print(f"topology {capped['topology_bytes'] / 2**20:,.0f} MiB")
    print(f"{'fanouts':<12}{'batch':>7}{'cap':>8}{'limit MiB':>11}{'peak MiB':>10}{'edges/s':>14}{'x uncapped':>12}")
    for r in capped["rows"]:
        name = ",".join(map(str, r["fanouts"]))
        print(f"{name:<12}{r['batch_size']:>7}{'none':>8}{'':>11}{'':>10}{r['uncapped_edges_per_s']:>14,.0f}"
              f"{1.0:>12.3f}")
        for c in r["caps"]:
            print(f"{name:<12}{r['batch_size']:>7}{c['topology_fraction']:>8g}{c['limit_bytes'] / 2**20:>11,.0f}"
                  f"{c['peak_bytes'] / 2**20:>10,.0f}{c['edges_per_s']:>14,.0f}{c['capped_over_uncapped']:>12.3f}")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="/work/bench-data/rmat-2000000-d15-s0")
    p.add_argument("--setups", default="5,2,2,2@2048;10,5@512;15,10,5@1024",
                   help="fanouts@batch_size, separated by ';'")
    p.add_argument("--batches", type=int, default=8, help="batches per measurement")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--numpy-batches", type=int, default=2, help="batches the numpy reference is timed on (once)")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--json", default="docs/results/sampler_throughput.json")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-numpy", action="store_true", help="skip the numpy reference (it reads the whole CSR)")
    p.add_argument("--caps", default="", help="topology fractions to cap at, e.g. 0.25,0.5 (needs root)")
    p.add_argument("--cap-runs", type=int, default=3, help="capped and uncapped runs, interleaved")
    p.add_argument("--cap-threads", default="2", help="sampler threads in the capped runs")
    p.add_argument("--warm-batches", type=int, default=8, help="batches each capped child samples untimed first")
    p.add_argument("--topology-access", choices=TOPOLOGY_ACCESS, default="random",
                   help="the sampler's madvise on the mapped CSR in the capped runs (random: no read-around)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child_measure(json.loads(args.child))))
        return {}
    if args.quick:
        from lsm_gnn.testing import write_tiny_dataset

        path = "/tmp/lsm-gnn-bench/sampler-quick"
        if not os.path.exists(path):
            write_tiny_dataset(path, num_nodes=5000, dim=4, avg_degree=8)
        args.data, args.setups, args.batches, args.repeats = path, "5,2@256", 2, 1
    ds = open_dataset(args.data, check="shape")
    indptr = np.asarray(ds.indptr, dtype=np.int64)
    indices = np.asarray(ds.indices)
    train = np.asarray(ds.split("train")) if "train" in ds.meta.get("splits", {}) else np.arange(ds.num_nodes)
    setups = [([int(x) for x in f.split(",")], int(b)) for f, b in (s.split("@") for s in args.setups.split(";"))]
    rows = []
    for (fanouts, batch_size), setup in zip(setups, args.setups.split(";")):
        if args.no_numpy:
            continue
        batches = [np.random.default_rng(b).choice(train, batch_size, replace=False) for b in range(args.batches)]
        sampler = OneTypeSampler(ds, fanouts, seed=0)
        edges = sum(sum(h.edge_index.shape[1] for h in sampler.sample(b, i)) for i, b in enumerate(batches))
        # The reference takes seconds per batch on a power-law graph: time it once over a few batches.
        ref_batches = batches[:args.numpy_batches]
        rng = np.random.default_rng(0)
        ref_edges = 0

        def reference():
            nonlocal ref_edges
            ref_edges = sum(numpy_sample(indptr, indices, b, fanouts, rng) for b in ref_batches)

        ref_seconds = median_seconds(reference, 1, warmup=False)
        row = {"fanouts": fanouts, "batch_size": batch_size, "edges_per_batch": edges / len(batches),
               "numpy_edges_per_batch": ref_edges / len(ref_batches), "numpy_edges_per_s": ref_edges / ref_seconds}
        for t in [int(x) for x in args.threads.split(",")]:
            s = OneTypeSampler(ds, fanouts, seed=0, num_threads=t)
            row[f"ours_{t}t_edges_per_s"] = edges / median_seconds(
                lambda: [s.sample(b, i) for i, b in enumerate(batches)], args.repeats)
            row[f"ours_{t}t_vs_numpy"] = row[f"ours_{t}t_edges_per_s"] / row["numpy_edges_per_s"]
        rows.append(row)
        print(f"{setup}: {row}", file=sys.stderr)
    capped = capped_rows(ds, args, setups) if args.caps else None
    threads = [int(x) for x in args.threads.split(",")]
    header = f"{'fanouts':<12}{'batch':>7}{'edges/batch':>13}{'numpy e/s':>12}" + "".join(
        f"{f'ours {t}t e/s':>14}{f'x numpy':>9}" for t in threads)
    print(header)
    for r in rows:
        print(f"{','.join(map(str, r['fanouts'])):<12}{r['batch_size']:>7}{r['edges_per_batch']:>13,.0f}"
              f"{r['numpy_edges_per_s']:>12,.0f}" + "".join(
                  f"{r[f'ours_{t}t_edges_per_s']:>14,.0f}{r[f'ours_{t}t_vs_numpy']:>9.1f}" for t in threads))
    if capped:
        _print_capped(capped)
    result = {"dataset": ds.path, "num_nodes": ds.num_nodes, "num_edges": ds.num_edges, "rows": rows,
              "cpus": os.cpu_count(), "capped": capped, "load_average": os.getloadavg()}
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
