"""Fig. 12's training step alone: our GraphSAGE (PyG's layers, ``lsm_gnn.models.HopGNN``) against DistDGL's (DGL's
``SAGEConv``, ``benchmarks/distdgl.py``) on the very same sampled batches and features, one torch thread, nothing
running beside. Fig. 12 found our training stage 6-8 s an epoch longer than DistDGL's for the same model; this
tells whether the layers are the cause (the steps differ here too) or what runs beside the step in a real epoch
(the steps are equal here).

    python -m benchmarks.paper.fig12_step --out docs/results/paper     # Fig. 12's graph, 40 batches, 5 rounds
"""
from __future__ import annotations

import os
import shutil
import statistics
import time

import numpy as np
import torch

from benchmarks.paper.fig12 import FANOUTS, FULL


def batches(dataset: str, count: int, batch_size: int, seed: int = 0) -> list[tuple]:
    """``count`` batches of training seeds sampled by our sampler: (hops, input features, labels) each."""
    from lsm_gnn.data import open_dataset
    from lsm_gnn.sampling import OneTypeSampler

    ds = open_dataset(dataset)
    sampler = OneTypeSampler(ds, [int(f) for f in FANOUTS.split(",")], seed=seed)
    train = np.random.default_rng(seed).permutation(np.asarray(ds.split("train")))
    labels = torch.from_numpy(np.asarray(ds.labels(), dtype=np.int64))
    out = []
    for k in range(count):
        seeds = torch.from_numpy(train[k * batch_size:(k + 1) * batch_size])
        hops = sampler.sample(seeds, k)
        x = torch.from_numpy(ds.read_features_direct(hops[-1].nodes.numpy()))
        out.append((hops, x, labels[seeds]))
    return out


def ours(in_dim: int, hidden: int, classes: int):
    from lsm_gnn.models import HopGNN

    model = HopGNN("sage", in_dim, hidden, classes, num_layers=len(FANOUTS.split(",")))

    def forward(hops, x):
        for i, hop in enumerate(reversed(hops)):
            x = model.layer(i, x, hop.edge_index, (hop.num_src, hop.num_dst))
        return x

    return model, forward, lambda hops: hops


def distdgl(in_dim: int, hidden: int, classes: int):
    import dgl

    from benchmarks.distdgl import sage

    layers, forward = sage(in_dim, hidden, classes, len(FANOUTS.split(",")))

    def blocks(hops):  # the same edges as DGL blocks: sources first-dst-then-rest, as our hops order them
        return [dgl.create_block((hop.edge_index[0], hop.edge_index[1]), num_src_nodes=hop.num_src,
                                 num_dst_nodes=hop.num_dst) for hop in reversed(hops)]

    return layers, forward, blocks


def step_seconds(model, forward, data, lr: float = 0.001) -> float:
    """Seconds for forward, loss, backward and an Adam step over every batch of ``data``."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    start = time.perf_counter()
    for inputs, x, y in data:
        loss = torch.nn.functional.cross_entropy(forward(inputs, x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return time.perf_counter() - start


def main(argv=None) -> dict:
    import argparse

    from lsm_gnn.data import open_dataset
    from lsm_gnn.data.synthetic import generate_synthetic
    from lsm_gnn.testing.benchmarking import machine_info, write_json

    p = argparse.ArgumentParser(prog="python -m benchmarks.paper.fig12_step", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory for fig12_step.json")
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--rounds", type=int, default=5, help="each model times every batch once a round, interleaved")
    p.add_argument("--num-nodes", type=int, default=FULL["num_nodes"], help="Fig. 12's graph by default")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)  # as each trainer of Fig. 12, ours and DistDGL's
    torch.manual_seed(0)
    dataset = os.path.join(args.out, "fig12_step-graph")
    generate_synthetic(dataset, num_nodes=args.num_nodes, feature_dim=1024, seed=0, split=FULL["split"],
                       progress=False, overwrite=True)
    try:
        classes = open_dataset(dataset).num_classes()
        data = batches(dataset, args.batches, FULL["batch_size"])
    finally:
        shutil.rmtree(dataset, ignore_errors=True)
    sides = {}
    for name, make in (("ours (PyG SAGEConv)", ours), ("DistDGL (DGL SAGEConv)", distdgl)):
        model, forward, convert = make(1024, FULL["hidden"], classes)
        sides[name] = (model, forward, [(convert(h), x, y) for h, x, y in data])
    times = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, (model, forward, data_of) in sides.items():
            times[name].append(step_seconds(model, forward, data_of) / len(data_of))
    result = {"batches": args.batches, "rounds": args.rounds, "batch_size": FULL["batch_size"], "fanouts": FANOUTS,
              "hidden": FULL["hidden"], "num_nodes": args.num_nodes, "threads": 1, "machine": machine_info(),
              "input_nodes_mean": statistics.mean(int(h[-1].nodes.numel()) for h, _, _ in data),
              "ms_per_step": {n: 1e3 * statistics.median(t) for n, t in times.items()},
              "ms_per_step_each": {n: [1e3 * s for s in t] for n, t in times.items()}}
    ours_ms, dgl_ms = result["ms_per_step"].values()
    result["ours_over_distdgl"] = ours_ms / dgl_ms
    write_json(os.path.join(args.out, "fig12_step.json"), result)
    for name, ms in result["ms_per_step"].items():
        print(f"{name:<24} {ms:7.1f} ms a step (median of {args.rounds} rounds of {args.batches} batches)")
    print(f"ours / DistDGL's: {result['ours_over_distdgl']:.2f}x")
    return result


if __name__ == "__main__":
    main()
