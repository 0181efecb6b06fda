"""Does the loader keep its rate at scale? Batches/s per window of batches, first against last.

Builds the feature path the trainer builds (:func:`lsm_gnn.build.build_features`
from the default config: the software cache over io_uring storage, static
scores) and iterates a :class:`~lsm_gnn.loader.NodeLoader` (sampling ahead
into the window buffer, gathering through the cache) for ``--batches``
batches with no model, so the figures are the loader's own. Every
``--window`` batches it records batches/s, sampled edges/s, the hit ratio
and the process's resident memory (anonymous and file-backed), and prints a
line (a run left in the background shows where it is). A steady loader has
its last window within noise of the first ones after warm-up, and no memory
growth once the cache is full.

    python benchmarks/loader_scale.py --data /work/data-scale/syn1e7 --batches 400
    nohup python benchmarks/loader_scale.py --data /work/data-scale/syn1e8 --batches 400 \\
        --json docs/results/loader_scale_1e8.json > loader1e8.log 2>&1 &

Config overrides (``key=value``, as ``lsm-gnn train`` takes them) go after ``--``,
e.g. ``-- cache.capacity=2G sampler.batch_size=1024``.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time

from lsm_gnn.testing.benchmarking import disk_read_bytes, machine_info, write_json


def memory_status() -> dict[str, int]:
    """This process's RssAnon, RssFile and VmHWM, in bytes."""
    with open("/proc/self/status") as f:
        text = f.read()
    return {name: int(re.search(rf"^{name}:\s+(\d+) kB", text, re.M).group(1)) * 1024
            for name in ("RssAnon", "RssFile", "VmHWM")}


def read_bytes(data_path: str) -> dict[str, int]:
    """Bytes read so far by this process (``/proc/self/io``: O_DIRECT reads and page cache misses) and by
    everyone from the disk that holds ``data_path``, so a window slowed by another job's reads shows it."""
    with open("/proc/self/io") as f:
        own = int(re.search(r"^read_bytes:\s+(\d+)", f.read(), re.M).group(1))
    return {"own_read_bytes": own, "disk_read_bytes": disk_read_bytes(data_path)}


def run(args, overrides: list[str]) -> dict:
    import torch

    from lsm_gnn.build import build_features, resolve
    from lsm_gnn.config import load_config
    from lsm_gnn.data import open_dataset
    from lsm_gnn.loader import NodeLoader

    cfg = load_config(None, overrides)
    start = time.perf_counter()
    ds = open_dataset(args.data, check="fast")
    spec = resolve(cfg, ds)
    features = build_features(spec, ds, torch.device("cpu"), fanouts=cfg.sampler.fanouts,
                              batch_size=cfg.sampler.batch_size, num_threads=cfg.sampler.num_threads)
    loader = NodeLoader(ds, features, cfg.sampler.fanouts, cfg.sampler.batch_size, window=cfg.cache.window,
                        num_threads=cfg.sampler.num_threads, seed=0)
    setup_seconds = time.perf_counter() - start
    print(f"setup {setup_seconds:.1f} s: {ds.num_nodes:,} nodes, {ds.num_edges:,} edges, cache "
          f"{spec.size.bytes / 2**20:,.0f} MiB ({spec.policy.name}), "
          f"storage {getattr(features.only, 'storage', features.only)}",
          flush=True)
    windows, current = [], None
    batches = 0
    try:
        while batches < args.batches:
            for batch in loader:  # epochs follow one another until enough batches
                if current is None:
                    current = {"first_batch": batches, "start": time.perf_counter(), "edges": 0, "hits": 0, "rows": 0,
                               "sample_s": 0.0, "gather_s": 0.0, "io_before": read_bytes(ds.path)}
                current["edges"] += sum(int(h.edge_index.shape[1]) for h in batch.hops)
                current["hits"] += batch.hits
                current["rows"] += batch.gathered
                current["sample_s"] += batch.timings.get("sample", 0.0)
                current["gather_s"] += batch.timings.get("gather", 0.0)
                batches += 1
                if batches - current["first_batch"] == args.window:
                    seconds = time.perf_counter() - current.pop("start")
                    before, after = current.pop("io_before"), read_bytes(ds.path)
                    window = {**current, "batches": args.window, "seconds": seconds,
                              **{k: after[k] - before[k] for k in after},
                              "batches_per_s": args.window / seconds, "edges_per_s": current["edges"] / seconds,
                              "hit_ratio": current["hits"] / max(current["rows"], 1), **memory_status(),
                              "load_average": os.getloadavg()[0]}
                    windows.append(window)
                    current = None
                    print(f"batches {window['first_batch']:>5}-{batches - 1:<5} {window['batches_per_s']:7.2f} batch/s "
                          f"{window['edges_per_s']:>12,.0f} edges/s  hit {window['hit_ratio']:.3f}  "
                          f"anon {window['RssAnon'] / 2**20:,.0f} MiB  file {window['RssFile'] / 2**20:,.0f} MiB  "
                          f"read {window['own_read_bytes'] / seconds / 2**20:,.0f} MiB/s of the disk's "
                          f"{window['disk_read_bytes'] / seconds / 2**20:,.0f}  load {window['load_average']:.2f}",
                          flush=True)
                if batches >= args.batches:
                    break
    finally:
        loader.close()
    if len(windows) < 2:
        raise SystemExit(f"only {len(windows)} window(s) of {args.window} batches: ask for more --batches")
    later = windows[1:]  # the first window warms the cache and the page cache
    return {
        "dataset": ds.path, "num_nodes": ds.num_nodes, "num_edges": ds.num_edges, "overrides": overrides,
        "fanouts": list(cfg.sampler.fanouts), "batch_size": cfg.sampler.batch_size,
        "cache_bytes": spec.size.bytes, "policy": spec.policy.name, "backend": spec.backend,
        "setup_seconds": setup_seconds, "windows": windows,
        "first_window_batches_per_s": windows[0]["batches_per_s"],
        "second_window_batches_per_s": windows[1]["batches_per_s"],
        "last_window_batches_per_s": windows[-1]["batches_per_s"],
        "median_batches_per_s_after_warmup": statistics.median(w["batches_per_s"] for w in later),
        "last_over_second": windows[-1]["batches_per_s"] / windows[1]["batches_per_s"],
        "rss_anon_growth_after_warmup_bytes": windows[-1]["RssAnon"] - windows[1]["RssAnon"],
        "machine": machine_info(),
    }


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--batches", type=int, default=400)
    p.add_argument("--window", type=int, default=50, help="batches per reported window")
    p.add_argument("--json", default="bench-results/loader_scale.json")
    args = p.parse_args(argv)
    result = run(args, overrides)
    print(f"first window {result['first_window_batches_per_s']:.2f} batch/s, second "
          f"{result['second_window_batches_per_s']:.2f}, last {result['last_window_batches_per_s']:.2f} "
          f"(last/second {result['last_over_second']:.3f}); anonymous memory "
          f"{result['rss_anon_growth_after_warmup_bytes'] / 2**20:+,.0f} MiB after the first window")
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
