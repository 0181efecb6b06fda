"""Neighbor sampler throughput (sampled edges/s) beside a vectorized numpy reference.

Both sample uniformly without replacement, hop by hop, and number the
reached nodes. The numpy reference is vectorized, not a Python loop, so the
ratio is against a fair baseline: nodes with at most k neighbors take all;
up to 2k, a random key per candidate and a segmented sort; above (the hubs
of a power-law graph), k random positions per node with the rare rows that
repeat one redrawn. Ours: medians over --repeats; the reference, seconds per batch on a
power-law graph, is timed once over --numpy-batches. Ratios print last.

    python benchmarks/sampler_throughput.py --data /work/bench-data/rmat-2000000-d15-s0
    python benchmarks/sampler_throughput.py --quick
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from lsm_gnn.benchmarking import median_seconds, write_json
from lsm_gnn.data import open_dataset
from lsm_gnn.sampling import NeighborSampler


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
    args = p.parse_args(argv)
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
    rows = []
    for setup in args.setups.split(";"):
        fanout_text, batch_text = setup.split("@")
        fanouts, batch_size = [int(x) for x in fanout_text.split(",")], int(batch_text)
        batches = [np.random.default_rng(b).choice(train, batch_size, replace=False) for b in range(args.batches)]
        sampler = NeighborSampler(ds, fanouts, seed=0)
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
            s = NeighborSampler(ds, fanouts, seed=0, num_threads=t)
            row[f"ours_{t}t_edges_per_s"] = edges / median_seconds(
                lambda: [s.sample(b, i) for i, b in enumerate(batches)], args.repeats)
            row[f"ours_{t}t_vs_numpy"] = row[f"ours_{t}t_edges_per_s"] / row["numpy_edges_per_s"]
        rows.append(row)
        print(f"{setup}: {row}", file=sys.stderr)
    threads = [int(x) for x in args.threads.split(",")]
    header = f"{'fanouts':<12}{'batch':>7}{'edges/batch':>13}{'numpy e/s':>12}" + "".join(
        f"{f'ours {t}t e/s':>14}{f'x numpy':>9}" for t in threads)
    print(header)
    for r in rows:
        print(f"{','.join(map(str, r['fanouts'])):<12}{r['batch_size']:>7}{r['edges_per_batch']:>13,.0f}"
              f"{r['numpy_edges_per_s']:>12,.0f}" + "".join(
                  f"{r[f'ours_{t}t_edges_per_s']:>14,.0f}{r[f'ours_{t}t_vs_numpy']:>9.1f}" for t in threads))
    result = {"dataset": ds.path, "num_nodes": ds.num_nodes, "num_edges": ds.num_edges, "rows": rows,
              "cpus": os.cpu_count()}
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
