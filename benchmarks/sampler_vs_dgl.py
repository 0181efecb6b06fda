"""Our neighbor sampler against DGL's, side by side: same graph, same seeds, same fanouts, same threads.

DGL's ``dgl.dataloading.NeighborSampler(fanouts).sample_blocks`` and ours (``lsm_gnn.sampling.OneTypeSampler``)
sample the same batches of seed nodes (uniform without replacement, in-neighbors, one hop after another,
both numbering the reached nodes; DGL's fanouts are given in its order, input layer first, so both draw the
same neighbours per hop). The two run alternately, ``--repeats`` times each, at every thread count;
the figures are medians, and the ratio DGL time / our time is taken within each repeat. Ours is also timed
with the batches side by side (``sample_many``: the threads take whole batches, as a loader filling its window
does), against DGL's one batch at a time on the same threads (DGL's own way across batches is worker
processes, not measured here). DGL must be
importable (``pip install dgl``); without it the script says so and exits.

``--profile`` also splits one thread's time per batch of ours into the native op (``sample_hops``) and the
Python around it (checking and converting the seeds, cutting the op's flat output into hops), the split that
says where to look before changing anything.

    python benchmarks/sampler_vs_dgl.py --data /work/bench-data/syn-2m-d15 --profile \\
        --json docs/results/sampler_vs_dgl.json
    python benchmarks/sampler_vs_dgl.py --quick
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lsm_gnn.data import open_dataset  # noqa: E402
from lsm_gnn.sampling import OneTypeSampler  # noqa: E402
from lsm_gnn.testing.benchmarking import side_by_side_per_batch  # noqa: E402


def dgl_graph(ds):
    """The dataset's CSR as a DGL graph whose in-edges of v are v's CSR row (messages flow src -> dst)."""
    import dgl

    indptr = torch.from_numpy(np.asarray(ds.indptr, dtype=np.int64))
    indices = torch.from_numpy(np.asarray(ds.indices, dtype=np.int64))
    return dgl.graph(("csc", (indptr, indices, torch.empty(0, dtype=torch.int64))), num_nodes=ds.num_nodes)


def set_threads(threads: int) -> None:
    """One thread count for torch's, DGL's (OpenMP) and ours (``num_threads`` given to the sampler)."""
    import dgl

    torch.set_num_threads(threads)
    dgl.utils.set_num_threads(threads)


def seconds_per_batch(sample, batches) -> float:
    start = time.perf_counter()
    for k, seeds in enumerate(batches):
        sample(k, seeds)
    return (time.perf_counter() - start) / len(batches)


def profile_ours(ds, fanouts, batches, repeats: int) -> dict:
    """Per batch, one thread: the whole ``sample`` and the native op alone on the same seeds (ms)."""
    from lsm_gnn.sampling.neighbor import _signed64
    from lsm_gnn.utils.ids import as_id_tensor

    sampler = OneTypeSampler(ds, fanouts, seed=0, num_threads=1)
    tensors = [as_id_tensor(b, torch.device("cpu")) for b in batches]

    def op(k, seeds):
        torch.ops.lsm_gnn.sample_hops(sampler.indptr, sampler.indices, seeds, list(fanouts),
                                      _signed64(sampler.sampler.seed), k, 1)

    def whole_sample(k, seeds):
        sampler.sample(seeds, k)

    # A warm-up of each, then the two in turn: a machine that gets busier (or a topology still being read in)
    # slows both alike, and the share cannot go negative from one running in a quieter spell.
    seconds_per_batch(whole_sample, batches)
    seconds_per_batch(op, tensors)
    whole, native = [], []
    for _ in range(repeats):
        whole.append(seconds_per_batch(whole_sample, batches))
        native.append(seconds_per_batch(op, tensors))
    w, n = 1e3 * statistics.median(whole), 1e3 * statistics.median(native)
    return {"sample_ms": w, "native_op_ms": n, "python_around_ms": w - n, "python_share": (w - n) / w}


def measure(ds, graph, setup: str, threads: list[int], batches_per: int, repeats: int, seed: int) -> dict:
    import dgl

    fanouts, batch_size = [int(x) for x in setup.split("@")[0].split(",")], int(setup.split("@")[1])
    rng = np.random.default_rng(seed)
    train = np.asarray(ds.split("train")) if "train" in ds.split_names() else np.arange(ds.num_nodes)
    batches = [np.sort(rng.choice(train, batch_size, replace=False)) for _ in range(batches_per)]
    dgl_seeds = [torch.from_numpy(b) for b in batches]
    row = {"fanouts": fanouts, "batch_size": batch_size, "threads": {}}
    for t in threads:
        set_threads(t)
        ours = OneTypeSampler(ds, fanouts, seed=0, num_threads=t)  # auto: preloaded, on huge pages
        # the topology where it is mapped (the file's page cache pages), as read before preloading copied it
        mapped = OneTypeSampler(ds, fanouts, seed=0, num_threads=t, topology_access="random")
        # DGL lists fanouts from the input layer to the seeds' layer, ours from the seeds outward: reversed,
        # both draw the same number of neighbours at each hop (the edge counts below show it).
        theirs = dgl.dataloading.NeighborSampler(list(reversed(fanouts)))
        seconds_per_batch(lambda k, s: ours.sample(s, k), batches[:2])  # warm up both
        seconds_per_batch(lambda k, s: theirs.sample_blocks(graph, s), dgl_seeds[:2])
        seconds_per_batch(lambda k, s: mapped.sample(s, k), batches[:2])
        mine, dgls, ratios, mapped_s, mapped_ratios, many, many_ratios = [], [], [], [], [], [], []
        ours.sample_many([(s, k) for k, s in enumerate(batches[:2])])  # its workers started
        for _ in range(repeats):  # alternating, so a change in the machine's load meets all
            a = seconds_per_batch(lambda k, s: ours.sample(s, k), batches)
            b = seconds_per_batch(lambda k, s: theirs.sample_blocks(graph, s), dgl_seeds)
            c = seconds_per_batch(lambda k, s: mapped.sample(s, k), batches)
            d = side_by_side_per_batch(ours, batches)
            mine.append(a)
            dgls.append(b)
            ratios.append(b / a)
            mapped_s.append(c)
            mapped_ratios.append(b / c)
            many.append(d)
            many_ratios.append(b / d)
        edges = sum(h.edge_index.shape[1] for h in ours.sample(batches[0], 0))
        dgl_edges = sum(block.num_edges() for block in theirs.sample_blocks(graph, dgl_seeds[0])[2])
        row["threads"][t] = {"ours_ms": 1e3 * statistics.median(mine), "dgl_ms": 1e3 * statistics.median(dgls),
                             "speedup": statistics.median(ratios), "speedups": ratios,
                             "mapped_ms": 1e3 * statistics.median(mapped_s),
                             "mapped_speedup": statistics.median(mapped_ratios), "mapped_speedups": mapped_ratios,
                             "side_by_side_ms": 1e3 * statistics.median(many),
                             "side_by_side_speedup": statistics.median(many_ratios),
                             "edges_first_batch": edges, "dgl_edges_first_batch": dgl_edges}
        print(f"{setup} {t} thread(s): ours {row['threads'][t]['ours_ms']:.2f} ms, DGL "
              f"{row['threads'][t]['dgl_ms']:.2f} ms a batch: {row['threads'][t]['speedup']:.2f}x (topology mapped: "
              f"{row['threads'][t]['mapped_ms']:.2f} ms, {row['threads'][t]['mapped_speedup']:.2f}x; batches side by "
              f"side: {row['threads'][t]['side_by_side_ms']:.2f} ms, {row['threads'][t]['side_by_side_speedup']:.2f}x)",
              file=sys.stderr)
    row["batches"] = batches
    return row


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="/work/bench-data/syn-2m-d15")
    p.add_argument("--setups", default="10,5@1024;5,2,2,2@2048", help="fanouts@batch_size, separated by ';'")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--batches", type=int, default=20, help="batches per measurement")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--profile", action="store_true", help="also split our one-thread time: native op vs Python")
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    try:
        import dgl  # noqa: F401
    except ImportError:
        print("DGL is not importable (pip install dgl): nothing to compare against", file=sys.stderr)
        return {}
    if args.quick:
        from lsm_gnn.testing import write_tiny_dataset

        path = "/tmp/lsm-gnn-bench/sampler-dgl-quick"
        if not os.path.exists(path):
            write_tiny_dataset(path, num_nodes=5000, dim=4, avg_degree=8)
        args.data, args.setups, args.batches, args.repeats, args.threads = path, "5,2@256", 3, 1, "1"
    ds = open_dataset(args.data, check="shape")
    graph = dgl_graph(ds)
    threads = [int(x) for x in args.threads.split(",")]
    before = torch.get_num_threads()
    rows = []
    try:
        for setup in args.setups.split(";"):
            row = measure(ds, graph, setup, threads, args.batches, args.repeats, seed=len(rows))
            batches = row.pop("batches")
            if args.profile:
                torch.set_num_threads(1)
                row["profile_1t"] = profile_ours(ds, row["fanouts"], batches, args.repeats)
            rows.append(row)
    finally:
        torch.set_num_threads(before)
    print(f"{'fanouts':<10}{'batch':>7}{'threads':>8}{'ours ms':>9}{'DGL ms':>9}{'speedup':>9}")
    for r in rows:
        for t, m in r["threads"].items():
            print(f"{','.join(map(str, r['fanouts'])):<10}{r['batch_size']:>7}{t:>8}{m['ours_ms']:>9.2f}"
                  f"{m['dgl_ms']:>9.2f}{m['speedup']:>8.2f}x   edges of the first batch: ours "
                  f"{m['edges_first_batch']:,}, DGL {m['dgl_edges_first_batch']:,}")
        if "profile_1t" in r:
            pr = r["profile_1t"]
            print(f"  one thread, per batch: sample {pr['sample_ms']:.2f} ms = native op {pr['native_op_ms']:.2f} "
                  f"+ Python around it {pr['python_around_ms']:.2f} ({pr['python_share']:.0%})")
    import dgl

    result = {"dataset": ds.path, "num_nodes": ds.num_nodes, "num_edges": ds.num_edges, "dgl": dgl.__version__,
              "torch": torch.__version__, "cpus": os.cpu_count(), "rows": rows, "load_average": os.getloadavg()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
