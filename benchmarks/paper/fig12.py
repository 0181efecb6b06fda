"""Fig. 12: epoch time against DistDGL 1.1.3 and the isolated caches (M-GIDS), as a curve over the ratio of
the link's bandwidth between DistDGL's two hosts to the SSD's bandwidth under ours.

Two generated graphs, as the paper's figure has homogeneous and heterogeneous datasets: ``igb`` (one node type,
R-MAT, 4-layer GraphSAGE, mean) and ``igbh`` (IGBH-shaped: papers, authors, institutes, fields of study, 7
relations, every type 1024 float32; 4-layer R-SAGE). On each graph one model, fanouts, batch size, seed and split
on every side:

* ours: ``lsm-gnn train`` on one host, 2 ranks (torchrun), features on the SSD behind a cache of
  ``capacity`` of the nodes per rank, ``cache.mode=shared`` (LSM-GNN) and ``cache.mode=isolated`` (M-GIDS);
* DistDGL (``benchmarks/distdgl.py``): the graph METIS-partitioned in 2, one server and one trainer on each of two
  namespaced hosts, features in the servers' memory, the link shaped with ``tc tbf`` to each rate.

    python -m benchmarks.paper.fig12 --full --out DIR [--graphs igb,igbh]    # (or with the other figures:
                                                                             #  python -m benchmarks.paper)

Our runs do not cross the link, so they are measured once; DistDGL is run at every rate. The SSD's bandwidth is
the project's own storage engine reading random 4 KiB rows of the feature file at queue depth 64 (O_DIRECT), the
read the trainer does on a miss. Needs root (namespaces, tc) and dgl==1.1.3.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks.paper.published import (FIG12_SPEEDUP_OVER_DISTDGL, FIG12_SPEEDUP_OVER_MGIDS, PAPER_LINK_GBIT_S,
                                        PAPER_SSD_GB_S, PAPER_SSDS)
from lsm_gnn.data.synthetic import generate_synthetic
from lsm_gnn.data.synthetic_hetero import generate_hetero_synthetic

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FANOUTS = "5,2,2,2"  # the paper's
#: link bandwidth / SSD bandwidth at which DistDGL runs (None: the link unshaped, as fast as veth goes here)
QUICK = {"num_nodes": 3000, "split": (0.3, 0.1, 0.1), "batch_size": 64, "hidden": 32, "capacity": "40%",
         "ratios": (1.0,), "ssd_seconds": 0.3, "link_seconds": 0.3,
         "delays_ms": (), "repeats": 1}
#: IGB-medium's Fig. 12 setting scaled: a cache of 10% of the nodes per rank (the paper's 4 GB per GPU of
#: IGB-medium's 40 GB), a batch touching ~2% of the graph (2048 seeds of fanouts 5,2,2,2 on 10M nodes: ~1.5%)
FULL = {"num_nodes": 200_000, "split": (0.3, 0.05, 0.05), "batch_size": 64, "hidden": 256, "capacity": "10%",
        "ratios": (None, 0.125, 0.25, 0.5, 1.0, 2.0, 4.0), "ssd_seconds": 3.0, "link_seconds": 2.0,
        "delays_ms": (0.5, 2.0), "repeats": 2}
#: IGBH-shaped (the paper's heterogeneous bars: IGBH-Full, MAG240M): about as many nodes as FULL's graph, 1.2
#: authors, 0.005 institutes and 0.01 fields per paper, every type 1024 float32 as IGBH's; fewer link rates, a
#: third repeat (an epoch is 4x longer, so more likely to meet other load)
HETERO_QUICK = {**{k: v for k, v in QUICK.items() if k != "num_nodes"},
                "num_papers": 1200, "capacity": "90%"}  # a tiny graph's batch is most of it
HETERO_FULL = {**{k: v for k, v in FULL.items() if k != "num_nodes"},
               "num_papers": 90_000, "ratios": (None, 0.125, 0.5, 2.0), "delays_ms": (2.0,), "repeats": 3}
#: graph name: (the files it writes, its --quick and --full settings, what the table calls it)
GRAPHS = {"igb": ("fig12", QUICK, FULL, ""), "igbh": ("fig12_igbh", HETERO_QUICK, HETERO_FULL, "IGBH-shaped, ")}


def unavailable() -> str | None:
    """Why this figure cannot run here, or None: it never skips quietly."""
    from lsm_gnn.testing.virtual_hosts import unavailable as no_namespaces

    reason = no_namespaces()
    if reason is None and shutil.which("tc") is None:
        reason = "tc (iproute2) is not installed; the link is shaped with tc tbf"
    if reason is None:
        try:
            from benchmarks.distdgl import require_dgl

            require_dgl()
        except RuntimeError as exc:
            reason = str(exc)
    return reason


def ssd_bytes_per_s(dataset: str, seconds: float, queue_depth: int = 64) -> float:
    """Random distinct rows of the feature file (the target type's, on a typed graph) read through the storage
    engine (O_DIRECT), bytes per second."""
    from lsm_gnn.data import open_dataset
    from lsm_gnn.storage.probe import probe_backend

    target = open_dataset(dataset, check="fast").node_type()
    probe = probe_backend(target, "auto", seconds=seconds, queue_depth=queue_depth)
    return probe["gb_per_s"] * 1e9


def project_env(**extra) -> dict:
    """This process's environment with the checkout importable, for the commands the figure starts."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])), **extra)


def ours(dataset: str, cfg: dict, mode: str, log_dir: str) -> dict:
    """One epoch of ``lsm-gnn train`` with 2 ranks on this host; rank 0's epoch summary."""
    from lsm_gnn.testing import free_port

    fanouts = "[" + FANOUTS + "]"
    overrides = [f"dataset={dataset}", "model.kind=sage", f"model.hidden={cfg['hidden']}",
                 f"sampler.fanouts={fanouts}", f"sampler.batch_size={cfg['batch_size']}",
                 f"cache.capacity={cfg['capacity']}", f"cache.mode={mode}", "train.epochs=1", "train.seed=0",
                 "train.eval_splits=[test]", "log.progress=false", f"log.dir={log_dir}"]
    env = project_env(NPROC="2", MASTER_PORT=str(free_port()))
    done = subprocess.run(["bash", os.path.join(ROOT, "launch", "torchrun.sh"), *overrides], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"lsm-gnn train ({mode}) failed:\n{(done.stdout + done.stderr)[-3000:]}")
    with open(os.path.join(log_dir, "metrics.jsonl")) as fh:
        summary = [r["epoch_summary"] for r in map(json.loads, fh) if "epoch_summary" in r][-1]
    return {"epoch_s": summary["wall_s"], "test_accuracy": summary["test"]["accuracy"],
            "hit_ratio": summary["hit_ratio"], "bytes_read": summary["bytes_read"],
            "iterations": summary["iterations"], "stages_s": summary["stages_s"]}


def run(out_dir: str, quick: bool, graphs=tuple(GRAPHS)) -> dict:
    """Fig. 12 on each of ``graphs`` (``igb``, ``igbh``): generated, partitioned, our two modes and DistDGL at
    every link rate timed; per graph a JSON and a PNG in ``out_dir`` (``fig12``, ``fig12_igbh``); returns the
    rows of the paper-vs-ours table and each graph's result."""
    reason = unavailable()
    if reason is not None:
        raise RuntimeError(f"Fig. 12 cannot run here: {reason}")
    check_graphs(graphs)
    out_rows, results = [], {}
    for graph in graphs:
        name, quick_cfg, full_cfg, label = GRAPHS[graph]
        results[graph] = run_graph(out_dir, name, quick_cfg if quick else full_cfg, quick)
        out_rows += rows(results[graph], label)
    return {"rows": out_rows, "results": results}


def check_graphs(graphs) -> None:
    unknown = [g for g in graphs if g not in GRAPHS]
    if unknown or not graphs:
        raise ValueError(f"Fig. 12's graphs are {', '.join(GRAPHS)}; got {', '.join(unknown) or 'none'}")


def run_graph(out_dir: str, name: str, cfg: dict, quick: bool) -> dict:
    """Generates the graph, partitions it, times our two modes and DistDGL at every link rate of ``cfg``, each
    setting once a repeat; writes ``<name>.json`` and ``<name>.png`` into ``out_dir``."""
    from benchmarks import distdgl
    from lsm_gnn.testing.benchmarking import machine_info, write_json

    work = os.path.join(out_dir, f"{name}-work")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    started = time.perf_counter()
    dataset, parts, source, ssd, args = prepare(work, cfg)
    model = "sage" if source["target"] is None else "r-sage"
    result = {"config": {**cfg, "fanouts": FANOUTS, "model": model, "seed": 0, "quick": quick},
              "machine": machine_info(), "graph": source, "ssd_bytes_per_s": ssd, "repeats": []}
    for repeat in range(cfg["repeats"]):  # every setting once a repeat, so load that drifts hits them all
        here = os.path.join(work, f"repeat{repeat}")
        # --quick checks the code path, not the numbers: its three jobs run side by side to stay in seconds
        with ThreadPoolExecutor(max_workers=3 if quick else 1) as pool:
            jobs = {mode: pool.submit(ours, dataset, cfg, mode, os.path.join(here, f"ours-{mode}"))
                    for mode in ("shared", "isolated")}
            dd = pool.submit(distdgl_curve, distdgl, parts, cfg, args, ssd, here) if quick else None
            one = {"ours": {mode: job.result() for mode, job in jobs.items()}}
        one.update(dd.result() if quick else distdgl_curve(distdgl, parts, cfg, args, ssd, here))
        result["repeats"].append(one)
        cfg = dict(cfg, ratios=one["ratios_run"], skip=False)  # later repeats run the same points
    result.update(medians(result["repeats"]))
    result["elapsed_s"] = time.perf_counter() - started
    write_json(os.path.join(out_dir, f"{name}.json"), result)
    draw(result, os.path.join(out_dir, f"{name}.png"))
    if not quick:
        shutil.rmtree(work, ignore_errors=True)
    return result


def prepare(work: str, cfg: dict) -> tuple:
    """The graph generated in ``work``, its METIS partitions, the SSD's measured bandwidth and DistDGL's trainer
    arguments: (dataset, parts, partition info, bytes/s, arguments)."""
    from benchmarks import distdgl

    dataset = os.path.join(work, "graph")
    if "num_papers" in cfg:
        generate_hetero_synthetic(dataset, num_papers=cfg["num_papers"], feature_dim=1024, seed=0,
                                  split=cfg["split"], progress=False)
    else:
        generate_synthetic(dataset, num_nodes=cfg["num_nodes"], feature_dim=1024, seed=0, split=cfg["split"],
                           progress=False)
    parts = os.path.join(work, "parts")
    source = partition(dataset, parts)
    ssd = ssd_bytes_per_s(dataset, cfg["ssd_seconds"])
    return dataset, parts, source, ssd, distdgl.trainer_args(FANOUTS, cfg["batch_size"], cfg["hidden"],
                                                             source["num_classes"], 0, source["target"])


def partition(dataset: str, parts: str) -> dict:
    """DistDGL's METIS partitioning in a process of its own, so its peak memory is the partitioning's."""
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "distdgl.py"), "partition", dataset,
                           parts], capture_output=True, text=True, timeout=3600,
                          env=project_env())
    if done.returncode != 0:
        raise RuntimeError(f"DistDGL's partitioning failed:\n{(done.stdout + done.stderr)[-3000:]}")
    with open(os.path.join(parts, "lsm_gnn_source.json")) as fh:
        return json.load(fh)


def medians(repeats: list[dict]) -> dict:
    """Each setting's first run with its epoch time (and measured link) replaced by the median over repeats;
    ``epoch_s_each`` keeps every repeat's."""
    def merged(runs: list[dict]) -> dict:
        out = dict(runs[0], epoch_s=statistics.median(r["epoch_s"] for r in runs),
                   epoch_s_each=[r["epoch_s"] for r in runs])
        if "link_over_ssd" in out:
            out["link_over_ssd"] = statistics.median(r["link_over_ssd"] for r in runs)
        return out

    return {"ours": {mode: merged([r["ours"][mode] for r in repeats]) for mode in repeats[0]["ours"]},
            "distdgl": [merged([r["distdgl"][k] for r in repeats]) for k in range(len(repeats[0]["distdgl"]))],
            "ratios_run": repeats[0]["ratios_run"], "skipped_ratios": repeats[0]["skipped_ratios"]}


def distdgl_curve(distdgl, parts: str, cfg: dict, args: list[str], ssd: float, work: str) -> dict:
    """DistDGL at every link rate of ``cfg``, the unshaped link first: a rate above it would shape nothing and
    is skipped (listed in ``skipped_ratios``); then the unshaped link with each one-way delay of ``cfg``."""
    runs, done, skipped, fastest = [], [], [], None
    for ratio in sorted(cfg["ratios"], key=lambda r: r is not None):
        rate = None if ratio is None else ratio * ssd * 8 / 1e6
        if cfg.get("skip", True) and rate is not None and fastest is not None and rate > 0.8 * fastest:
            skipped.append(ratio)
            continue
        dd = distdgl.run(parts, rate, args, os.path.join(work, f"distdgl-{ratio}"), cfg["link_seconds"])
        dd["link_over_ssd"] = dd["link_mbit_s"] * 1e6 / 8 / ssd  # as measured, shaped or not
        fastest = fastest or (dd["link_mbit_s"] if rate is None else None)
        runs.append(dd)
        done.append(ratio)
    for delay in cfg["delays_ms"]:  # the unshaped link through the relay that delays each packet
        dd = distdgl.run(parts, None, args, os.path.join(work, f"distdgl-delay{delay}"), cfg["link_seconds"],
                         delay_ms=delay)
        dd["link_over_ssd"] = dd["link_mbit_s"] * 1e6 / 8 / ssd
        runs.append(dd)
    return {"distdgl": runs, "ratios_run": done, "skipped_ratios": skipped}


def paper_ratio() -> float:
    """The paper's link bandwidth over its storage host's SSD bandwidth (published.py says where each is from)."""
    return PAPER_LINK_GBIT_S / 8 / (PAPER_SSDS * PAPER_SSD_GB_S)


def rows(result: dict, label: str = "") -> list[dict]:
    """DistDGL's epoch time over ours (shared) and over the isolated caches', at each measured link, beside the
    paper's best speedups; and shared over isolated. ``label`` opens each size (the graph, but for ``igb``).
    On heterogeneous graphs the paper has no DistDGL figure (it ran out of memory on IGBH-Full and MAG240M)."""
    shared, isolated = (result["ours"][m]["epoch_s"] for m in ("shared", "isolated"))
    over_distdgl = None if label else FIG12_SPEEDUP_OVER_DISTDGL
    out = []
    for dd in result["distdgl"]:
        size = label + f"link/SSD {dd['link_over_ssd']:.2f}" + (f", +{dd['delay_ms']:g} ms" if dd.get("delay_ms")
                                                                else "")
        out.append({"figure": "12", "what": "speedup over DistDGL (LSM-GNN)", "size": size,
                    "paper": over_distdgl, "ours": dd["epoch_s"] / shared})
        out.append({"figure": "12", "what": "speedup over DistDGL (M-GIDS)", "size": size, "paper": None,
                    "ours": dd["epoch_s"] / isolated})
    out.append({"figure": "12", "what": "speedup over M-GIDS (isolated caches)", "size": label + "one host",
                "paper": FIG12_SPEEDUP_OVER_MGIDS, "ours": isolated / shared})
    return out


def draw(result: dict, path: str) -> None:
    """Speedup over DistDGL against link/SSD bandwidth: ours and M-GIDS's measured, the paper's best published
    speedup over DistDGL as a dashed line (its 1.54x over M-GIDS is a ratio of our two modes, in the table), the
    paper's hardware ratio as a vertical line."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dd = sorted((d for d in result["distdgl"] if not d.get("delay_ms")), key=lambda d: d["link_over_ssd"])
    delayed = [d for d in result["distdgl"] if d.get("delay_ms")]
    x = [d["link_over_ssd"] for d in dd]
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for k, (mode, label, marker) in enumerate((("shared", "LSM-GNN (shared cache)", "o"),
                                               ("isolated", "M-GIDS (isolated)", "s"))):
        ours_s = result["ours"][mode]["epoch_s"]
        ax.plot(x, [d["epoch_s"] / ours_s for d in dd], marker=marker, color=f"C{k}", label=label)
        for d in delayed:  # the same link with a delay added: where latency moves the point
            ax.plot(d["link_over_ssd"], d["epoch_s"] / ours_s, marker="^", color=f"C{k}", ls="none")
            ax.annotate(f"+{d['delay_ms']:g} ms", (d["link_over_ssd"], d["epoch_s"] / ours_s), fontsize=7,
                        xytext=(4, 2), textcoords="offset points")
    if result["graph"].get("target") is None:
        ax.axhline(FIG12_SPEEDUP_OVER_DISTDGL, color="C0", ls="--", lw=1,
                   label=f"paper: LSM-GNN up to {FIG12_SPEEDUP_OVER_DISTDGL}x")
    else:  # the paper has no DistDGL bar to draw here
        ax.text(0.98, 0.97, "paper: DistDGL out of memory on IGBH-Full and MAG240M\n"
                f"(LSM-GNN over M-GIDS up to {FIG12_SPEEDUP_OVER_MGIDS}x)", transform=ax.transAxes, ha="right",
                va="top", fontsize=8, bbox={"facecolor": "white", "edgecolor": "none"})
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axvline(paper_ratio(), color="k", ls=":", lw=1, label=f"paper's hardware: {paper_ratio():.1f} (assumed)")
    ax.set_xscale("log")
    ticks = [t for t in (0.125, 0.25, 0.5, 1, 2, 4, 8, 16) if min(x) / 1.5 <= t <= max(x) * 1.5]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("link bandwidth between DistDGL's hosts / SSD bandwidth of our host")
    ax.set_ylabel("DistDGL epoch time / ours")
    cfg, graph = result["config"], result["graph"]
    shape = "" if graph.get("target") is None else "IGBH-shaped, "
    ax.set_title(f"Fig. 12: {shape}{graph['num_nodes']:,} nodes x 1024 float32, {cfg['model'].upper()} "
                 f"{cfg['fanouts']}, batch {cfg['batch_size']}, cache {cfg['capacity']}/rank", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    from benchmarks.paper.__main__ import base_parser, make_out, table

    parser = base_parser("python -m benchmarks.paper.fig12", __doc__)
    parser.add_argument("--graphs", default=",".join(GRAPHS), help=f"comma-separated, of {', '.join(GRAPHS)}")
    args = parser.parse_args(argv)
    graphs = tuple(g.strip() for g in args.graphs.split(",") if g.strip())
    try:
        check_graphs(graphs)
    except ValueError as exc:
        parser.error(f"--graphs: {exc}")
    make_out(parser, args.out)
    print(table(run(args.out, quick=args.quick, graphs=graphs)["rows"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
