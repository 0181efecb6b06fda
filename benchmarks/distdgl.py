"""DistDGL 1.1.3 on two namespaced hosts: an lsm-gnn dataset partitioned with METIS, one graph server and one
trainer per host, the link between the hosts shaped with ``tc tbf``. The baseline of the paper's Fig. 12
(benchmarks/paper/fig12.py); no part of it is in lsm_gnn.

DGL's launcher (``tools/launch.py``) is not in its wheel, so this starts the servers and trainers itself with the
environment variables ``dgl.distributed.initialize`` reads (``DGL_ROLE``, ``DGL_SERVER_ID``, ``DGL_IP_CONFIG``,
``DGL_NUM_SERVER``, ``DGL_NUM_CLIENT``, ``DGL_CONF_PATH``, ``DGL_DIST_MODE``, ``DGL_NUM_SAMPLER``). Each host runs
in its own network namespace and its own mount namespace with a private ``/dev/shm``: DistDGL's server hands its
partition to the trainer beside it through shared memory under names that are the same on every host, which two
real machines keep apart and one machine's namespaces would not.

    python benchmarks/distdgl.py partition DATASET OUT_DIR          # METIS, 2 parts
    sudo python benchmarks/distdgl.py run PARTS_DIR --rate-mbit 800 --json out.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GRAPH_NAME = "lsmgnn"
DGL_VERSION = "1.1.3"


def require_dgl():
    """dgl, checked to be the version the figure is about (a clear error with the install line otherwise)."""
    try:
        import dgl
    except ImportError as exc:
        raise RuntimeError(f"DistDGL needs dgl=={DGL_VERSION}: pip install --no-deps dgl=={DGL_VERSION} "
                           f"(its dependencies numpy, scipy, networkx, requests, tqdm, psutil) ({exc})") from exc
    if dgl.__version__ != DGL_VERSION:
        raise RuntimeError(f"dgl {dgl.__version__} is installed; the baseline is dgl=={DGL_VERSION}: "
                           f"pip install --no-deps dgl=={DGL_VERSION}")
    return dgl


def _feature_rows(node_type):
    """A node type's feature rows read whole from its file into a tensor (the servers hold them in memory)."""
    import numpy as np
    import torch

    layout = node_type.features
    rows = np.memmap(node_type.feature_path, dtype=np.uint8, mode="r", shape=(node_type.num_nodes, layout.row_stride))
    return torch.from_numpy(np.ascontiguousarray(rows[:, :layout.row_bytes]).view(layout.numpy_dtype))


def _split_masks(ds, node_type: str | None = None) -> dict:
    import numpy as np
    import torch

    masks = {}
    for split in ("train", "val", "test"):
        mask = torch.zeros(ds.num_nodes_of(node_type), dtype=torch.bool)
        mask[torch.from_numpy(np.asarray(ds.split(split, node_type), dtype=np.int64))] = True
        masks[f"{split}_mask"] = mask
    return masks


def to_dgl_graph(dataset_path: str):
    """The dataset as a DGL graph: (graph, number of classes, the node type to classify or None for a graph of
    one type). Each relation's CSR becomes its in-edges (row v of ``src name dst`` lists the src nodes v
    aggregates from, benchmarks/sampler_vs_dgl.py's convention), features are node data on every type, labels
    and split masks on the target type."""
    import numpy as np
    import torch

    from benchmarks.sampler_vs_dgl import dgl_graph
    from lsm_gnn.data import open_dataset

    dgl = require_dgl()
    ds = open_dataset(dataset_path)
    if ds.is_homogeneous:
        g = dgl_graph(ds)
        g.ndata["feat"] = _feature_rows(ds.node_type())
        g.ndata["label"] = torch.from_numpy(np.asarray(ds.labels(), dtype=np.int64))
        g.ndata.update(_split_masks(ds))
        return g, ds.num_classes(), None
    featureless = [t for t in ds.node_types if ds.node_type(t).features is None]
    if featureless:  # ours would give them a learned vector; the baseline's model has none to match
        raise ValueError(f"node types {featureless} of {dataset_path} have no features; the DistDGL baseline "
                         "takes graphs whose every type has features (generate them with feature_dim for all)")
    empty = torch.empty(0, dtype=torch.int64)
    g = dgl.heterograph({relation: ("csc", tuple(torch.from_numpy(np.asarray(a, dtype=np.int64))
                                                 for a in ds.csr(relation)) + (empty,))
                         for relation in ds.relations},
                        num_nodes_dict={t: ds.num_nodes_of(t) for t in ds.node_types})
    for t in ds.node_types:
        g.nodes[t].data["feat"] = _feature_rows(ds.node_type(t))
    target = ds.target
    g.nodes[target].data["label"] = torch.from_numpy(np.asarray(ds.labels(target), dtype=np.int64))
    g.nodes[target].data.update(_split_masks(ds, target))
    return g, ds.num_classes(target), target


def partition(dataset_path: str, out_dir: str) -> dict:
    """METIS into 2 parts (DistDGL's default method), training nodes balanced; returns the time it took, the
    dataset's bytes on disk and this process's peak resident memory (the partitioning's own where the process
    does nothing else: ``python benchmarks/distdgl.py partition``, as Fig. 12 runs it)."""
    import resource

    dgl = require_dgl()
    start = time.perf_counter()
    g, num_classes, target = to_dgl_graph(dataset_path)
    loaded = time.perf_counter()
    train = g.ndata["train_mask"] if target is None else {target: g.nodes[target].data["train_mask"].int()}
    dgl.distributed.partition_graph(g, GRAPH_NAME, 2, out_dir, part_method="metis", balance_ntypes=train,
                                    balance_edges=True)
    info = {"dataset": os.path.abspath(dataset_path), "num_classes": num_classes, "target": target,
            "num_nodes": g.num_nodes(), "num_edges": g.num_edges(),
            "feature_dim": int((g.ndata["feat"] if target is None else g.nodes[target].data["feat"]).shape[1]),
            "load_s": loaded - start, "partition_s": time.perf_counter() - loaded,
            "dataset_bytes": _bytes_under(dataset_path), "partition_bytes": _bytes_under(out_dir),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    with open(os.path.join(out_dir, "lsm_gnn_source.json"), "w") as fh:
        json.dump(info, fh, indent=1)
    return info


def _bytes_under(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


# -- one host: its server and its trainer ------------------------------------------------------------------------

def host_script(machine: int, parts_dir: str, ip_config: str, train_args: list[str], log: str) -> str:
    """The shell one host runs in its namespaces: a private /dev/shm, its server in the background, its trainer."""
    common = (f"DGL_DIST_MODE=distributed DGL_NUM_SERVER=1 DGL_NUM_CLIENT=2 DGL_NUM_SAMPLER=0 "
              f"DGL_IP_CONFIG={ip_config} DGL_CONF_PATH={os.path.join(parts_dir, GRAPH_NAME + '.json')} "
              f"DGL_GRAPH_FORMAT=csc OMP_NUM_THREADS=1")
    me = f"{sys.executable} {os.path.abspath(__file__)}"
    args = " ".join(train_args)
    return (f"set -e; mount -t tmpfs -o size=8g lsm-shm /dev/shm; "
            f"env {common} DGL_ROLE=server DGL_SERVER_ID={machine} {me} server {ip_config} > {log}.server 2>&1 & "
            f"server=$!; env {common} DGL_ROLE=client RANK={machine} {me} trainer {ip_config} {args}; "
            f"wait $server")


def shape(hosts, rate_mbit: float | None) -> None:
    """Each end of the link sends at most ``rate_mbit`` (tc's token bucket, a 50 ms queue); None: unshaped."""
    if rate_mbit is None:
        return
    burst = max(int(rate_mbit * 1e6 / 8 / 250), 64 * 1024)  # 4 ms of bytes: a timer tick's worth at this rate
    for host in hosts:
        done = subprocess.run(host.command(["tc", "qdisc", "replace", "dev", host.interface, "root", "tbf",
                                            "rate", f"{rate_mbit}mbit", "burst", str(burst), "latency", "50ms"]),
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"tc tbf on the link failed: {done.stderr.strip()} (needs the tbf qdisc)")


def run(parts_dir: str, rate_mbit: float | None, train_args: list[str], work_dir: str,
        link_seconds: float = 2.0, delay_ms: float | None = None) -> dict:
    """Both hosts' servers and trainers over a link shaped to ``rate_mbit`` (and, given ``delay_ms``, through
    virtual_hosts' user-space relay that delays each packet that long one way); rank 0's result, with the
    link's measured rate and round trip."""
    from lsm_gnn.testing import free_port
    from lsm_gnn.testing.virtual_hosts import VirtualHosts, round_trip_ms, throughput_mbit_s

    os.makedirs(work_dir, exist_ok=True)
    with VirtualHosts(delay_ms=delay_ms) as hosts:
        shape(hosts, rate_mbit)
        measured = throughput_mbit_s(hosts, link_seconds)
        rtt_ms = round_trip_ms(hosts, samples=50)
        ip_config = os.path.join(work_dir, "ip_config.txt")
        dgl_port = free_port()
        with open(ip_config, "w") as fh:
            fh.write("".join(f"{h.address} {dgl_port}\n" for h in hosts))
        result_json = os.path.join(work_dir, "result.json")
        args = [*train_args, "--master", f"{hosts[0].address}:{free_port()}", "--json", result_json]
        procs = []
        for machine, host in enumerate(hosts):
            log = os.path.join(work_dir, f"host{machine}.log")
            script = host_script(machine, parts_dir, ip_config, args, log)
            env = dict(os.environ, GLOO_SOCKET_IFNAME=host.interface, TP_SOCKET_IFNAME=host.interface,
                       PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
            with open(log, "w") as out:
                procs.append(subprocess.Popen(host.command(["unshare", "--mount", "--propagation", "private",
                                                            "sh", "-c", script]),
                                              env=env, stdout=out, stderr=subprocess.STDOUT))
        codes = [p.wait(timeout=3600) for p in procs]
        if any(codes):
            tails = "".join(f"\n-- host {m} (exit {c}):\n" + _tail(os.path.join(work_dir, f"host{m}.log"))
                            for m, c in enumerate(codes))
            raise RuntimeError(f"DistDGL failed:{tails}")
    with open(result_json) as fh:
        result = json.load(fh)
    result.update(rate_mbit=rate_mbit, delay_ms=delay_ms, link_mbit_s=measured, round_trip_ms=rtt_ms)
    return result


def _tail(path: str, chars: int = 3000) -> str:
    text = "".join(open(p).read() for p in (path, path + ".server") if os.path.exists(p))
    return text[-chars:]


# -- the processes on a host -------------------------------------------------------------------------------------

def server_main(ip_config: str) -> None:
    dgl = require_dgl()
    dgl.distributed.initialize(ip_config)  # serves until every trainer has left, then exits


def sage(in_dim: int, hidden: int, num_classes: int, num_layers: int):
    """GraphSAGE (mean) as lsm-gnn's ``model.kind=sage`` on a graph of one type: (modules, forward(blocks, x))."""
    import dgl
    import torch

    dims = [in_dim] + [hidden] * (num_layers - 1) + [num_classes]
    layers = torch.nn.ModuleList(dgl.nn.SAGEConv(a, b, "mean") for a, b in zip(dims[:-1], dims[1:]))
    _pyg_init(layers)

    def forward(blocks, x):
        for k, (layer, block) in enumerate(zip(layers, blocks)):
            x = layer(block, x)
            if k < len(layers) - 1:
                x = torch.relu(x)
        return x

    return layers, forward


def relational_sage(in_dims: dict, relations: list, target: str, hidden: int, num_classes: int, num_layers: int):
    """R-SAGE as lsm-gnn's ``HeteroHopGNN`` (``model.kind=sage`` on a typed graph): per layer a SAGEConv (mean) per
    relation, summed per destination type, plus each type's own linear term; (modules, forward(blocks, x))."""
    import dgl
    import torch

    def key(relation):
        return "__".join(relation)

    layers, dims = torch.nn.ModuleList(), dict(in_dims)
    for k in range(num_layers):
        out = num_classes if k == num_layers - 1 else hidden
        layers.append(torch.nn.ModuleDict({
            "convs": torch.nn.ModuleDict({key(r): dgl.nn.SAGEConv((dims[r[0]], dims[r[2]]), out, "mean")
                                          for r in relations}),
            "skips": torch.nn.ModuleDict({t: torch.nn.Linear(dims[t], out) for t in dims})}))
        dims = {t: out for t in dims}
    _pyg_init([conv for layer in layers for conv in layer["convs"].values()])

    def forward(blocks, x):
        for k, (layer, block) in enumerate(zip(layers, blocks)):
            out = {t: layer["skips"][t](x[t][:block.num_dst_nodes(t)])
                   for t in block.dsttypes if block.num_dst_nodes(t)}
            for r in block.canonical_etypes:
                if block.num_edges(r):  # the destinations' rows are the first of their type's sources
                    dst = x[r[2]][:block.num_dst_nodes(r[2])]
                    out[r[2]] = out[r[2]] + layer["convs"][key(r)](block[r], (x[r[0]], dst))
            x = out if k == len(layers) - 1 else {t: torch.relu(v) for t, v in out.items()}
        return x[target]

    return layers, forward


def _pyg_init(convs) -> None:
    """PyG's SAGEConv (lsm-gnn's) starts from torch.nn.Linear's init; DGL's from Xavier's."""
    import torch

    for conv in convs:
        for linear in (conv.fc_self, conv.fc_neigh):
            torch.nn.init.kaiming_uniform_(linear.weight, a=math.sqrt(5))


def trainer_main(ip_config: str, argv: list[str]) -> None:
    """One DistDGL trainer: GraphSAGE (mean), or R-SAGE given ``--target``, over DistNodeDataLoader, DDP over
    gloo; rank 0 writes the epoch's wall time and the test accuracy (sampled with the training fanouts, as
    lsm-gnn's default evaluation)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--fanouts", required=True, help="first next to the seeds, as lsm-gnn's sampler.fanouts")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--hidden", type=int, required=True)
    parser.add_argument("--num-classes", type=int, required=True)
    parser.add_argument("--target", default=None, help="the node type to classify on a heterogeneous graph")
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--master", required=True)
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    dgl = require_dgl()
    import torch
    import torch.distributed as dist

    dgl.distributed.initialize(ip_config)  # before torch.distributed, as DGL asks
    addr, port = args.master.rsplit(":", 1)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=2)
    torch.manual_seed(args.seed)
    dgl.seed(args.seed)
    torch.set_num_threads(1)
    g = dgl.distributed.DistGraph(GRAPH_NAME)
    book = g.get_partition_book()
    target = args.target
    nodes = g.ndata if target is None else g.nodes[target].data
    train_nid, test_nid = (dgl.distributed.node_split(nodes[f"{split}_mask"], book, ntype=target or "_N",
                                                      force_even=True) for split in ("train", "test"))
    fanouts = [int(f) for f in args.fanouts.split(",")]
    sampler = dgl.dataloading.NeighborSampler(list(reversed(fanouts)))  # DGL's last fanout is next to the seeds
    if target is None:
        layers, forward = sage(g.ndata["feat"].shape[1], args.hidden, args.num_classes, len(fanouts))

        def features(ids):
            return g.ndata["feat"][ids]
    else:
        in_dims = {t: g.nodes[t].data["feat"].shape[1] for t in g.ntypes}
        layers, forward = relational_sage(in_dims, g.canonical_etypes, target, args.hidden, args.num_classes,
                                          len(fanouts))

        def features(ids):
            return {t: g.nodes[t].data["feat"][i] for t, i in ids.items()}

    def loader(nid, **kw):
        return dgl.dataloading.DistNodeDataLoader(g, nid if target is None else {target: nid}, sampler,
                                                  batch_size=args.batch_size, **kw)

    def labels(seeds):
        return nodes["label"][seeds if target is None else seeds[target]]

    # a typed batch may lack a relation's edges, leaving its conv out of that loss (as lsm-gnn's HeteroHopGNN)
    model = torch.nn.parallel.DistributedDataParallel(layers, find_unused_parameters=target is not None)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    dist.barrier()
    start = time.perf_counter()
    stages = {"sample": 0.0, "fetch": 0.0, "train": 0.0}
    iterations, losses = 0, []
    it = iter(loader(train_nid, shuffle=True))
    while True:
        t0 = time.perf_counter()
        try:
            input_nodes, seeds, blocks = next(it)
        except StopIteration:
            break
        t1 = time.perf_counter()
        x, y = features(input_nodes), labels(seeds)
        t2 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(forward(blocks, x), y)
        opt.zero_grad()
        loss.backward()  # DDP's all-reduce of the gradients
        opt.step()
        t3 = time.perf_counter()
        stages["sample"] += t1 - t0
        stages["fetch"] += t2 - t1
        stages["train"] += t3 - t2
        iterations += 1
        losses.append(loss.item())
    dist.barrier()
    epoch_s = time.perf_counter() - start
    correct = total = 0
    with torch.no_grad():
        for input_nodes, seeds, blocks in loader(test_nid):
            y = labels(seeds)
            correct += int((forward(blocks, features(input_nodes)).argmax(1) == y).sum())
            total += len(y)
    counts = torch.tensor([correct, total], dtype=torch.float64)
    dist.all_reduce(counts)
    if rank == 0:
        with open(args.json, "w") as fh:
            json.dump({"epoch_s": epoch_s, "iterations": iterations, "loss": sum(losses) / max(len(losses), 1),
                       "stages_s": stages, "test_accuracy": float(counts[0] / counts[1]),
                       "train_nodes_this_rank": len(train_nid)}, fh, indent=1)
    dist.barrier()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["server"]:
        server_main(argv[1])
        return 0
    if argv[:1] == ["trainer"]:
        trainer_main(argv[1], argv[2:])
        return 0
    parser = argparse.ArgumentParser(prog="python benchmarks/distdgl.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("partition", help="METIS-partition an lsm-gnn dataset into 2 parts")
    p.add_argument("dataset")
    p.add_argument("out_dir")
    r = sub.add_parser("run", help="train one epoch on 2 namespaced hosts")
    r.add_argument("parts_dir")
    r.add_argument("--rate-mbit", type=float, default=None, help="the link's rate each way (default: unshaped)")
    r.add_argument("--delay-ms", type=float, default=None,
                   help="one-way delay added by a user-space relay (this kernel has no netem); default: none")
    r.add_argument("--fanouts", default="5,2,2,2")
    r.add_argument("--batch-size", type=int, default=1024)
    r.add_argument("--hidden", type=int, default=256)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--work-dir", default="/tmp/distdgl")
    r.add_argument("--json", default="")
    args = parser.parse_args(argv)
    if args.command == "partition":
        print(json.dumps(partition(args.dataset, args.out_dir), indent=1))
        return 0
    with open(os.path.join(args.parts_dir, "lsm_gnn_source.json")) as fh:
        source = json.load(fh)
    result = run(args.parts_dir, args.rate_mbit, trainer_args(args.fanouts, args.batch_size, args.hidden,
                                                              source["num_classes"], args.seed,
                                                              source.get("target")), args.work_dir,
                 delay_ms=args.delay_ms)
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


def trainer_args(fanouts: str, batch_size: int, hidden: int, num_classes: int, seed: int,
                 target: str | None = None) -> list[str]:
    return ["--fanouts", fanouts, "--batch-size", str(batch_size), "--hidden", str(hidden),
            "--num-classes", str(num_classes), "--seed", str(seed), *(["--target", target] if target else [])]


if __name__ == "__main__":
    sys.exit(main())
