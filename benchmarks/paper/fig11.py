"""Fig. 11: the victim-buffer prefetcher (PVP), judged both ways, with real reads of 4 KiB rows from a file.

On the trace of Fig. 10 (``benchmarks/cache_policies.py``) at the paper's three cache sizes, for the paper's
hybrid policy (window 256) and the project's default (``farthest``), three caches each:

- ``plain``: the cache alone;
- ``pvp``: the same cache with PVP, its victim queues scaled like the paper's (``benchmarks/pvp.py``: 16K lines
  per queue against ~140K distinct nodes per batch) and the project's PVP settings (``cache.pvp=true``:
  reinstall on; hybrid becomes ``hybrid_pvp_room``, the paper's level swap made safe);
- ``same_bytes``: the plain cache given PVP's queue bytes as cache lines.

``pvp`` against ``plain`` is the GPU's comparison (the paper's): the queues live in host memory, so they cost no
GPU bytes. ``pvp`` against ``same_bytes`` is the CPU's: here cache and queues are the same host memory. Each
cache replays the trace over a file of 4 KiB rows (the paper's 1024 float32 features) read with O_DIRECT, so
the time of its lookups is feature aggregation with every miss read from the disk.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import types

import numpy as np

from benchmarks import cache_policies, pvp
from benchmarks.paper.published import FIG11_HIT_RATIO, FIG11_SPEEDUP, PAPER_CACHE_GB, SIZE_SHARES
from lsm_gnn.cache.pvp import queue_memory_bytes
from lsm_gnn.data.format import FeatureLayout
from lsm_gnn.storage import open_storage
from lsm_gnn.storage.probe import evict_page_cache
from lsm_gnn.testing.benchmarking import machine_info, write_json

#: each policy without PVP and with it (the trainer's cache.pvp=true choice for it)
PLAIN_AND_PVP = {"hybrid": "hybrid_pvp_room", "farthest": "farthest"}
CACHES = ("plain", "pvp", "same_bytes")
ROW_BYTES = pvp.FEATURE_ROW_BYTES
QUICK = ["--num-nodes", "20000", "--window", "8", "--warmup", "4", "--iterations", "20", "--batch-size", "4"]
#: Fig. 10's regime (each batch touches the share of the graph 2048 seeds touch on IGB-Full), fewer iterations:
#: every miss is a real read here
FULL = ["--batch-size", "scaled", "--iterations", "1500"]


def run(out_dir: str, quick: bool) -> dict:
    """Runs the three caches per policy and size and writes ``fig11.json`` and ``fig11.png`` into ``out_dir``;
    returns the rows of the paper-vs-ours table."""
    parser = argparse.ArgumentParser()
    cache_policies.add_trace_arguments(parser, ())
    args = parser.parse_args(["--sizes", ",".join(f"{s:.6g}" for s in SIZE_SHARES), *(QUICK if quick else FULL)])
    setup = cache_policies.record_setup_trace(args)
    n, trace = setup.num_nodes, setup.trace[:setup.measured_end + args.window]
    queue_lines = pvp.scaled_queue_capacity(setup.nodes_per_batch)
    queue_bytes = queue_memory_bytes(args.window + 1, queue_lines, ROW_BYTES)
    results = {"config": {"num_nodes": n, "batch_size": setup.batch, "fanouts": setup.fanouts,
                          "iterations": setup.iterations, "warmup": args.warmup, "window": args.window,
                          "period": args.period, "ways": 32, "nodes_per_batch": setup.nodes_per_batch,
                          "row_bytes": ROW_BYTES, "queue_lines": queue_lines, "queues": args.window + 1,
                          "queue_bytes": queue_bytes, "policies": PLAIN_AND_PVP},
               "machine": machine_info(), "load_average_before": os.getloadavg(), "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="fig11-rows-") as tmp:
        rows = rows_on_disk(os.path.join(tmp, "features.bin"), n, ROW_BYTES)
        for frac in (float(s) for s in args.sizes.split(",")):
            num_sets = max(1, int(frac * n) // 32)
            bigger_sets = max(1, (num_sets * 32 * ROW_BYTES + queue_bytes) // (32 * ROW_BYTES))
            row = {"cache_bytes": num_sets * 32 * ROW_BYTES, "same_bytes_cache_bytes": bigger_sets * 32 * ROW_BYTES}
            replays = {}
            for policy, with_pvp in PLAIN_AND_PVP.items():
                for cache, (name, mode, sets) in {"plain": (policy, "off", num_sets),
                                                  "pvp": (with_pvp, "reinstall", num_sets),
                                                  "same_bytes": (policy, "off", bigger_sets)}.items():
                    # a storage each: its own reader and counters
                    replays[policy, cache] = pvp.Replay(trace, n, name, mode, sets, args.window, args.period,
                                                        args.warmup, setup.static, queue_lines,
                                                        storage=open_storage(rows, "auto"))
            in_lockstep(list(replays.values()))
            for (policy, cache), replay in replays.items():
                r = row.setdefault(policy, {})[cache] = replay.result()
                results["config"]["o_direct"] = replay.storage.direct
                replay.storage.close()
                print(f"size {frac:.2%} {policy:<9}{cache:<11} hit {r['combined_hit_ratio']:.4f} "
                      f"read {r['disk_bytes_read'] / 2**20:8.1f} MiB {ms_per_lookup(r):7.2f} ms/lookup "
                      f"({1e3 * r['read_seconds'] / r['lookups']:.2f} reading)",
                      file=sys.stderr, flush=True)
            results["sizes"][f"{frac:g}"] = row
    results["load_average_after"] = os.getloadavg()
    write_json(os.path.join(out_dir, "fig11.json"), results)
    draw(results, os.path.join(out_dir, "fig11.png"))
    return {"rows": table_rows(results), "results": results}


def in_lockstep(replays: list) -> None:
    """Every replay's lookup of batch t before any replay's of t + 1, their order rotated per batch: the
    caches share each moment's load on the disk and the cores, so their times compare."""
    for t in itertools.count():
        k = t % len(replays)
        going = [replay.step() for replay in replays[k:] + replays[:k]]
        if not all(going):
            assert not any(going), "the replays of one trace end together"
            return


def rows_on_disk(path: str, num_rows: int, row_bytes: int) -> types.SimpleNamespace:
    """A file of ``num_rows`` float32 rows of ``row_bytes`` (row i holds i), written here, as what
    ``open_storage`` opens (io_uring or pread with O_DIRECT: the cache's misses are real reads, never the page
    cache's)."""
    rows_per_chunk = max(1, (64 << 20) // row_bytes)
    with open(path, "wb") as f:
        for start in range(0, num_rows, rows_per_chunk):
            ids = np.arange(start, min(num_rows, start + rows_per_chunk), dtype=np.float32)
            f.write(np.repeat(ids[:, None], row_bytes // 4, axis=1).tobytes())
        f.flush()
        os.fsync(f.fileno())
    evict_page_cache(path)  # leave the memory to others: the reads bypass it
    layout = FeatureLayout(file=os.path.basename(path), dtype="float32", dim=row_bytes // 4, row_bytes=row_bytes,
                           row_stride=row_bytes, page_size=4096, file_bytes=num_rows * row_bytes)
    return types.SimpleNamespace(num_nodes=num_rows, features=layout, feature_path=path)


def ms_per_lookup(r: dict) -> float:
    return 1e3 * r["measured_seconds"] / r["lookups"]


def table_rows(results: dict) -> list[dict]:
    """Per size: the hit ratios beside the paper's, and PVP's speedup both ways (the paper's, with 2 SSDs,
    beside the GPU's comparison)."""
    rows = []
    for k, (size, row) in enumerate(results["sizes"].items()):
        gb = f"{PAPER_CACHE_GB[k]} GB"
        hybrid, farthest = row["hybrid"], row["farthest"]
        cells = [("hybrid hit ratio", FIG11_HIT_RATIO["hybrid"][k], hybrid["plain"]["combined_hit_ratio"]),
                 ("hybrid+PVP hit ratio", FIG11_HIT_RATIO["hybrid+pvp"][k], hybrid["pvp"]["combined_hit_ratio"]),
                 ("hybrid, PVP's bytes as cache: hit ratio", None, hybrid["same_bytes"]["combined_hit_ratio"]),
                 ("hybrid+PVP speedup, same cache (paper: 2 SSDs)", FIG11_SPEEDUP["2 SSDs"][k],
                  speedup(hybrid, "plain")),
                 ("hybrid+PVP speedup, same bytes", None, speedup(hybrid, "same_bytes")),
                 ("farthest+PVP speedup, same cache", None, speedup(farthest, "plain")),
                 ("farthest+PVP speedup, same bytes", None, speedup(farthest, "same_bytes"))]
        rows += [{"figure": "11", "what": what, "size": gb, "paper": paper, "ours": ours} for what, paper, ours in cells]
    return rows


def speedup(cells: dict, baseline: str) -> float:
    """PVP's aggregation speedup over ``baseline``: its time per lookup over PVP's (the same batches)."""
    return ms_per_lookup(cells[baseline]) / ms_per_lookup(cells["pvp"])


def draw(results: dict, path: str) -> None:
    """Hit ratio, bytes read and PVP's speedup per size and policy; the paper's published figures as black
    diamonds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg, sizes = results["config"], list(results["sizes"])
    fig, axes = plt.subplots(1, 3, figsize=(15, 5.6))
    bars = [(policy, cache) for policy in PLAIN_AND_PVP for cache in CACHES]
    width = 0.8 / len(bars)
    for b, (policy, cache) in enumerate(bars):
        x = np.arange(len(sizes)) + b * width
        cells = [results["sizes"][s][policy][cache] for s in sizes]
        label = f"{policy}{'+PVP' if cache == 'pvp' else ', +PVP bytes as cache' if cache == 'same_bytes' else ''}"
        color = f"C{b}"
        axes[0].bar(x, [c["combined_hit_ratio"] for c in cells], width, color=color, label=label)
        axes[1].bar(x, [c["disk_bytes_read"] / c["lookups"] * 1e3 / 2**30 for c in cells], width, color=color)
        published = {"plain": "hybrid", "pvp": "hybrid+pvp"}.get(cache) if policy == "hybrid" else None
        if published:
            axes[0].scatter(x, FIG11_HIT_RATIO[published], marker="D", color="black", zorder=3,
                            label="paper (hybrid, hybrid+PVP)" if cache == "plain" else None)
    for b, (policy, baseline) in enumerate((p, c) for p in PLAIN_AND_PVP for c in ("plain", "same_bytes")):
        x = np.arange(len(sizes)) + b * 0.2
        axes[2].bar(x, [speedup(results["sizes"][s][policy], baseline) for s in sizes], 0.2, color=f"C{b + 6}",
                    label=f"{policy}+PVP over {'the same cache' if baseline == 'plain' else 'the same bytes'}")
    for k, (ssds, values) in enumerate(FIG11_SPEEDUP.items()):
        axes[2].scatter(np.arange(len(sizes)) + 0.3, values, marker="D" if k == 0 else "s", color="black", zorder=3,
                        label=f"paper, hybrid+PVP over hybrid, {ssds}")
    axes[2].axhline(1.0, color="grey", lw=0.8)
    xlabels = [f"{gb} GB: {float(s):.2%}" for gb, s in zip(PAPER_CACHE_GB, sizes)]
    for ax, ylabel, centre in ((axes[0], "hit ratio (cache + PVP)", (len(bars) - 1) * width / 2),
                               (axes[1], "GiB read per 1000 lookups", (len(bars) - 1) * width / 2),
                               (axes[2], "aggregation speedup of PVP", 0.3)):
        ax.set_xticks(np.arange(len(sizes)) + centre)
        ax.set_xticklabels(xlabels, fontsize=8)
        ax.set_ylabel(ylabel)
    for ax in (axes[0], axes[2]):  # below the bars, which they would hide
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    fig.suptitle(f"Fig. 11: PVP, {cfg['num_nodes']:,}-node R-MAT, batch {cfg['batch_size']}, window {cfg['window']}, "
                 f"{cfg['queue_lines']} lines x {cfg['queues']} queues ({cfg['queue_bytes'] / 2**20:.0f} MiB), "
                 f"{cfg['row_bytes']} B rows read with O_DIRECT", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=120)
    plt.close(fig)
