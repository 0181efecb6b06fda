"""Our neighbour sampler alone, per thread count: ms per batch over fixed batches of seeds.

No DGL in the process (``sampler_vs_dgl.py`` compares against it): this measures how the native op scales with
``num_threads``, two ways: one batch at a time with the threads inside it (``sample``), and all the batches at
once, side by side on the threads, one each (``sample_many``, as a loader fills its window). To compare two
builds, run it from each checkout in turn, alternating (docs/benchmarks/sampler.md, "The numbering on several threads").

    python benchmarks/sampler_threads.py --data /work/bench-data/syn-2m-d15
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

from lsm_gnn.data import open_dataset
from lsm_gnn.sampling import OneTypeSampler
from lsm_gnn.testing.benchmarking import side_by_side_per_batch, write_json


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="/work/bench-data/syn-2m-d15")
    p.add_argument("--setups", default="10,5@1024;5,2,2,2@2048", help="fanouts@batch_size, separated by ';'")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--batches", type=int, default=40, help="fixed batches timed per repeat")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json")
    args = p.parse_args(argv)
    ds = open_dataset(args.data, check="shape")
    rng = np.random.default_rng(0)
    result = {"data": args.data, "ms_per_batch": {}}
    for setup in args.setups.split(";"):
        fanouts, batch = setup.split("@")
        fanouts, batch = [int(k) for k in fanouts.split(",")], int(batch)
        seeds = [np.sort(rng.choice(ds.num_nodes, batch, replace=False)) for _ in range(args.batches)]
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            sampler = OneTypeSampler(ds, fanouts, seed=0, num_threads=threads)
            for i in range(min(5, len(seeds))):  # warm: the topology's copy, the first allocations
                sampler.sample(seeds[i], i)
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                for i, s in enumerate(seeds):
                    sampler.sample(s, i)
                times.append(1e3 * (time.perf_counter() - start) / len(seeds))
            median = statistics.median(times)
            result["ms_per_batch"][f"{setup}/{threads}"] = {"median": median, "repeats": times}
            print(f"{setup} {threads} thread(s): {median:.3f} ms a batch", file=sys.stderr)
            many = [1e3 * side_by_side_per_batch(sampler, seeds) for _ in range(args.repeats)]
            median = statistics.median(many)
            result["ms_per_batch"][f"{setup}/{threads}/side-by-side"] = {"median": median, "repeats": many}
            print(f"{setup} {threads} thread(s), batches side by side: {median:.3f} ms a batch", file=sys.stderr)
    result["load_average"] = os.getloadavg()  # what else ran: the figures are only as quiet as the machine
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
