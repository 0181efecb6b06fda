"""Training across two hosts as the link between them slows: the exchange's share of iteration time against
added latency.

Two namespaced hosts (lsm_gnn/testing/virtual_hosts.py), one rank each, train the same batches with the shared cache
(torchrun --nnodes 2, gloo). The link is a veth pair, or a user-space relay that delays each packet by
``--delays`` ms one way in each direction (a round trip gains twice that; the relay's own cost is in the
``relay +0`` row). Every setting is run ``--repeats`` times, settings interleaved within a repeat; each run's
figures are medians over its iterations after ``--skip``; the table gives medians over repeats. Per link: the
measured TCP round trip, ms per iteration (the training loop's wall per iteration), train (forward, backward
and DDP's all-reduce), wait (training stalled for the loader), gather and its exchange part (in the loader's
thread, overlapped with training), and the exchange's share of the iteration. Needs root (network
namespaces) and /dev/net/tun. Figures and command: docs/benchmarks/distributed.md, "Multi-node: latency".

    sudo python benchmarks/multinode_latency.py                        # ~15 min on 2 cores
    sudo python benchmarks/multinode_latency.py --quick
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from lsm_gnn.testing import free_port
from lsm_gnn.testing.benchmarking import load_script, machine_info, write_json
from lsm_gnn.testing.virtual_hosts import VirtualHosts, relay_unavailable, round_trip_ms, unavailable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def train_across(hosts: VirtualHosts, args, ds, log_dir: str) -> list[dict]:
    """One rank per host; rank 0's per-iteration records."""
    overrides = [f"dataset={ds.path}", "model.kind=sage", f"model.hidden={args.hidden}",
                 f"sampler.fanouts={args.fanouts}", f"sampler.batch_size={args.batch_size}",
                 f"cache.capacity={args.capacity}", f"train.max_iterations={args.iterations}", "train.epochs=1",
                 "log.progress=false", f"log.dir={log_dir}"]
    port = free_port()
    procs = []
    for rank, host in enumerate(hosts.hosts):
        env = host.env(dict(os.environ, NNODES="2", NODE_RANK=str(rank), NPROC="1", MASTER_ADDR=hosts[0].address,
                            MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                            PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
        procs.append(subprocess.Popen(host.command(["bash", os.path.join(ROOT, "launch", "torchrun.sh"),
                                                    *overrides]),
                                      env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    for p, out in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"a host failed (exit {p.returncode}):\n{out[-3000:]}")
    with open(os.path.join(log_dir, "metrics.jsonl")) as fh:
        return [r for r in map(json.loads, fh) if "iteration" in r]


def summarize(records: list[dict], skip: int) -> dict:
    """Medians over the iterations after ``skip`` (the cache filling), in ms."""
    kept = records[skip:] or records
    times = [r["time"] for r in kept]

    def med(fn) -> float:
        return 1e3 * statistics.median(fn(t) for t in times)

    out = {"iteration_ms": med(lambda t: t["wait"] + t["train"]), "train_ms": med(lambda t: t["train"]),
           "wait_ms": med(lambda t: t["wait"]), "gather_ms": med(lambda t: t["gather"]),
           "exchange_ms": med(lambda t: t["exchange"]), "iterations": len(kept)}
    out["exchange_share"] = out["exchange_ms"] / out["iteration_ms"]
    return out


def tabulate(runs: dict[str, list[dict]], keys) -> dict:
    """Medians over repeats; ``vs_veth``: the median of each repeat's ms/iteration over the veth run of the
    same repeat (paired, so load that shifts between repeats cancels)."""
    table = {name: {k: statistics.median(r[k] for r in rows) for k in keys} for name, rows in runs.items()}
    for name, rows in runs.items():
        ratios = [r["iteration_ms"] / base["iteration_ms"] for r, base in zip(rows, runs["veth"])]
        table[name].update(vs_veth=statistics.median(ratios), vs_veth_per_repeat=ratios)
    return table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.path.join(ROOT, "data", "bench-multinode"))
    p.add_argument("--num-nodes", type=int, default=200_000)
    p.add_argument("--dim", type=int, default=256, help="feature columns, float32 (256: 1 KiB rows)")
    p.add_argument("--delays", default="0,0.1,1,5", help="one-way delays in ms through the relay, comma-separated")
    p.add_argument("--iterations", type=int, default=120)
    p.add_argument("--skip", type=int, default=20, help="iterations left out of the medians (the cache filling)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--fanouts", default="[10,5]")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--capacity", default="10%", help="cache capacity per rank")
    p.add_argument("--quick", action="store_true", help="1 repeat, 40 iterations, 50k nodes")
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "multinode_latency.json"))
    args = p.parse_args()
    if args.quick:
        args.repeats, args.iterations, args.skip, args.num_nodes = 1, 40, 10, 50_000
        args.data += "-quick"
    why = unavailable() or relay_unavailable()
    if why:
        sys.exit(f"multinode_latency.py: cannot make two hosts here: {why}")
    ds = load_script(os.path.join(HERE, "end_to_end.py")).ensure_graph(args.data, args.num_nodes, args.dim)
    links = [("veth", None)] + [(f"relay +{d} ms", float(d)) for d in args.delays.split(",")]
    runs = {name: [] for name, _ in links}
    for repeat in range(args.repeats):
        for name, delay in links:
            with VirtualHosts(2, delay_ms=delay) as hosts, tempfile.TemporaryDirectory() as tmp:
                rtt = round_trip_ms(hosts)
                row = dict(summarize(train_across(hosts, args, ds, tmp), args.skip), rtt_ms=rtt)
            runs[name].append(row)
            print(f"repeat {repeat + 1} {name:<14} rtt {rtt:6.2f} ms  iteration {row['iteration_ms']:7.1f} ms  "
                  f"exchange {row['exchange_ms']:6.1f} ms ({row['exchange_share']:.1%})", file=sys.stderr)
    keys = ("rtt_ms", "iteration_ms", "train_ms", "wait_ms", "gather_ms", "exchange_ms", "exchange_share")
    table = tabulate(runs, keys)
    print(f"{'link':<16}{'RTT ms':>8}{'ms/it':>8}{'train':>8}{'wait':>8}{'gather':>8}{'exch':>8}{'exch/it':>9}"
          f"{'vs veth':>9}  per repeat")
    for name, t in table.items():
        print(f"{name:<16}{t['rtt_ms']:>8.2f}{t['iteration_ms']:>8.1f}{t['train_ms']:>8.1f}{t['wait_ms']:>8.1f}"
              f"{t['gather_ms']:>8.1f}{t['exchange_ms']:>8.1f}{t['exchange_share']:>9.1%}"
              f"{t['vs_veth']:>8.2f}x  {' '.join(f'{r:.2f}' for r in t['vs_veth_per_repeat'])}")
    write_json(args.out, {"machine": machine_info(), "args": vars(args), "table": table, "runs": runs})
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
