"""The Triton kernels on a GPU: cache all-hit bandwidth beside a device-to-device copy, sampler edges/s.

For a GPU owner (``benchmarks/gpu_suite.sh`` runs it): the figures only a GPU can give. Every ratio is
measured in one run, medians of ``--repeats``:

  cache all-hit   torch.ops.lsm_gnn.cache_assign on a batch whose ids are all cached (the hit
                  kernel) plus the row gather, in GB/s of rows served, beside ``copy_`` of the same
                  bytes from one device buffer to another (the limit; the paper's 750 GB/s on an A100)
  lookup all-hit  the same batch through SoftwareCache.lookup, the loader's call (its own fixed cost added)
  lookup misses   SoftwareCache.lookup of batches half of whose ids miss, read by the GPU from the table in
                  page-locked host memory (the ``pinned`` storage: no disk), beside the same rows moved without
                  a cache: the hit half copied on the device, the miss half gathered over UVA by the same kernel;
                  again with PVP, its victim buffer serving the misses (the host's part of a PVP lookup)
  sampler         torch.ops.lsm_gnn.sample_hops (the Triton sampler) in sampled edges/s on a power-law
                  CSR in device memory, beside the C++ sampler on the host
                  (``--profile-sampler``: its time by op, where the host's launches and reads back show)

``--device cpu`` runs the same code on CPU tensors under Triton's interpreter at a tiny size: a smoke
test of the script (tests run it), not a measurement.

    python benchmarks/gpu_kernels.py                  # on a GPU
    python benchmarks/gpu_kernels.py --device cpu --quick
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np
import torch

import lsm_gnn  # noqa: F401  (chooses Triton's interpreter on machines without a GPU)
from lsm_gnn.testing.benchmarking import median_seconds, write_json
from lsm_gnn.kernels.layout import INVALID_TAG, NO_REUSE_RECORD
from lsm_gnn.cache.policies import POLICY_CODE
from lsm_gnn.kernels import set_kernel_mode
from lsm_gnn.kernels import ops  # noqa: F401  (registers torch.ops.lsm_gnn)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def print_profile(fn, device, title: str, sort_by: str, rows: int = 18) -> None:
    """``fn``'s time by op over 10 calls (torch.profiler, host and device), after one untimed call: a call that
    compiles a kernel (a new specialization) would otherwise fill the table."""
    fn()
    synchronize(device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn()
        synchronize(device)
    print(f"-- {title}: 10 calls, by {sort_by}")
    print(prof.key_averages().table(sort_by=sort_by, row_limit=rows))


def timed(fn, device, repeats: int) -> float:
    def run():
        fn()
        synchronize(device)
    return median_seconds(run, repeats)


def cache_all_hit(device, num_lines: int, batch: int, row_bytes: int, repeats: int, profile: bool = False) -> dict:
    ways = 32
    dim = row_bytes // 4
    num_sets = num_lines // ways
    n = num_sets * ways
    state = [torch.full((n,), INVALID_TAG, dtype=torch.int64, device=device),
             torch.full((n,), NO_REUSE_RECORD, dtype=torch.int64, device=device),
             torch.zeros(n, dtype=torch.uint8, device=device), torch.zeros(n, dtype=torch.int16, device=device),
             torch.full((n,), -1, dtype=torch.int64, device=device),
             torch.zeros(num_sets, dtype=torch.int32, device=device)]
    data = torch.randn(n, dim, device=device)
    hot = torch.arange(batch, device=device)  # fewer ids than lines, spread by the hash: they all fit
    policy = POLICY_CODE["hybrid"]

    def assign(ids, iteration):
        return torch.ops.lsm_gnn.cache_assign(*state, ways, ids, None, policy, iteration, 0, 32, [0, 1, 2, 3],
                                              None, None, None, None, 0, 0, False, False, 0)

    line, _, *_ = assign(hot, 0)  # fill
    out = torch.empty(batch, dim, device=device)
    iteration = [1]

    def serve():
        line, hit, *_ = assign(hot, iteration[0])
        iteration[0] += 1
        torch.index_select(data, 0, line.clamp_min(0), out=out)

    _, hit, *_ = assign(hot, 0)
    hit_ratio = float(hit.float().mean())
    if profile:  # where an all-hit serve's time goes, op by op (the figure to close toward the copy)
        print_profile(serve, device, f"all-hit assign + gather, {batch:,} ids",
                      "cuda_time_total" if device.type == "cuda" else "cpu_time_total")
    src, dst = torch.randn(batch, dim, device=device), torch.empty(batch, dim, device=device)
    serve_s = timed(serve, device, repeats)
    copy_s = timed(lambda: dst.copy_(src), device, repeats)
    moved = batch * row_bytes
    return {"batch": batch, "row_bytes": row_bytes, "hit_ratio": hit_ratio, "serve_gb_per_s": moved / serve_s / 1e9,
            "copy_gb_per_s": moved / copy_s / 1e9, "ratio_to_copy": copy_s / serve_s}


def lookup_all_hit(device, batch: int, row_bytes: int, repeats: int, profile: bool = False,
                   graphs: bool = False) -> dict:
    """``SoftwareCache.lookup`` of a batch the cache holds in full, as the loader calls it (hits served first
    into a reused ``out``, stats): the op figure plus the lookup's own fixed cost. ``graphs``: served by a
    replayed CUDA graph (``SoftwareCache(graphs=True)``)."""
    from lsm_gnn.cache import SoftwareCache
    from lsm_gnn.planner.simulate import TraceStorage

    num_rows = 4 * batch
    storage = TraceStorage(num_rows, row_bytes // 4, "float32")
    # Four lines per id of the batch: no set of 32 ways overflows, so the second lookup on hits everything.
    cache = SoftwareCache(storage, capacity=4 * batch * row_bytes, device=device, graphs=graphs)
    ids = torch.randperm(num_rows)[:batch].to(cache.device)
    out = torch.empty(batch, row_bytes // 4, device=cache.device)
    cache.lookup(ids, out=out)  # installs the batch
    cache.data.normal_()  # random rows: zeros can copy faster than real data
    cache.lookup(ids, out=out)  # hit in full: the next lookups are probed (and, with graphs, this one captures)
    _, hit = cache.lookup(ids, out=out)
    if profile:  # the lookup's own cost is host time: by self CPU time
        print_profile(lambda: cache.lookup(ids, out=out), device, f"all-hit SoftwareCache.lookup, {batch:,} ids",
                      "self_cpu_time_total", rows=30)
    lookup_s = timed(lambda: cache.lookup(ids, out=out), device, repeats)
    src, dst = torch.randn(batch, row_bytes // 4, device=device), torch.empty(batch, row_bytes // 4, device=device)
    copy_s = timed(lambda: dst.copy_(src), device, repeats)
    moved = batch * row_bytes
    return {"batch": batch, "row_bytes": row_bytes, "graphs": graphs, "hit_ratio": float(hit.float().mean()),
            "lookup_gb_per_s": moved / lookup_s / 1e9, "copy_gb_per_s": moved / copy_s / 1e9,
            "ratio_to_copy": copy_s / lookup_s}


def lookup_with_misses(device, batch: int, row_bytes: int, repeats: int, root: str, pvp: bool = False) -> dict:
    """``SoftwareCache.lookup`` (LRU, 4 lines per id of a batch) of batches whose first half is the same every
    time (hits) and whose second half comes back every 10 lookups (misses: LRU holds a cold id about 7), over the
    ``pinned`` storage; the limit moves the same rows without a cache. Ratio: the limit's time over ours.
    ``pvp``: with the victim buffer, a window of the next 10 batches (as the loader keeps it) and the next queue
    moved after each lookup (the loader's ``prefetch``): the cold ids come back from their queue, not the table."""
    from lsm_gnn import open_storage
    from lsm_gnn.cache import SoftwareCache, WindowBuffer
    from lsm_gnn.kernels.row_gather import gather_rows
    from lsm_gnn.testing import write_tiny_dataset

    half, dim, rounds = batch // 2, row_bytes // 4, 10
    path = os.path.join(root, "misses")
    if not os.path.exists(path):
        write_tiny_dataset(path, num_nodes=(1 + rounds) * half, dim=dim, avg_degree=1, chunk=max(half, 1))
    storage = open_storage(path, "pinned", device=device)
    victims = dict(pvp=True, window=rounds, period=1, pvp_queue_capacity=half) if pvp else {}
    cache = SoftwareCache(storage, capacity=4 * batch * row_bytes, device=device, policy="lru", **victims)
    hot = torch.arange(half)
    calls = [0]

    def ids_of(k: int) -> torch.Tensor:
        return torch.cat([hot, half + (k % rounds) * half + torch.arange(half)]).to(cache.device)

    future = WindowBuffer(rounds, storage.num_rows) if pvp else None
    for k in range(1, rounds + 1 if pvp else 1):
        future.push(ids_of(k))

    def lookup() -> None:
        k = calls[0]
        calls[0] += 1
        cache.lookup(ids_of(k), future=future, out=out)
        if pvp:  # as the loader keeps its window and moves the next queue while the batch trains
            future.pop()
            future.push(ids_of(k + rounds + 1))
            cache.prefetch()

    out = torch.empty(batch, dim, device=cache.device)
    for _ in range(2 * rounds):  # the steady state: every cold id seen and evicted before it comes back
        lookup()
    before = (cache.stats.hits + cache.stats.pvp_hits, cache.stats.unique)
    lookup_s = timed(lookup, device, repeats)
    hit_ratio = (cache.stats.hits + cache.stats.pvp_hits - before[0]) / max(cache.stats.unique - before[1], 1)
    cache.settle()
    rows = torch.randn(half, dim, device=cache.device)
    cold = (half + torch.arange(half)).to(cache.device)

    def limit():
        out[:half].copy_(rows)
        gather_rows(storage._rows, cold, out[half:])

    limit_s = timed(limit, device, repeats)
    storage.close()
    return {"batch": batch, "row_bytes": row_bytes, "pvp": pvp, "hit_ratio": hit_ratio, "lookup_ms": lookup_s * 1e3,
            "limit_ms": limit_s * 1e3, "ratio_to_limit": limit_s / lookup_s}


def sampler_edges(device, num_nodes: int, avg_degree: int, batch: int, fanouts, repeats: int,
                  profile: bool = False) -> dict:
    from lsm_gnn import _C

    rng = np.random.default_rng(0)
    degree = np.minimum(rng.zipf(1.8, num_nodes) * avg_degree // 2, 1000)
    indptr = torch.from_numpy(np.concatenate([[0], np.cumsum(degree)]).astype(np.int64))
    indices = torch.from_numpy(rng.integers(0, num_nodes, int(indptr[-1])).astype(np.int64))
    seeds = torch.from_numpy(rng.choice(num_nodes, batch, replace=False))
    on_device = (indptr.to(device), indices.to(device), seeds.to(device))
    hops = torch.ops.lsm_gnn.sample_hops(*on_device, fanouts, 7, 0, 0)
    edges = sum(t.numel() for t in hops[1::3])
    if profile:  # where a batch's time goes: the host's launches and reads back, beside the kernels themselves
        print_profile(lambda: torch.ops.lsm_gnn.sample_hops(*on_device, fanouts, 7, 0, 0), device,
                      f"sampler, fanouts {fanouts}, {batch:,} seeds", "self_cpu_time_total", rows=30)
    triton_s = timed(lambda: torch.ops.lsm_gnn.sample_hops(*on_device, fanouts, 7, 0, 0), device, repeats)
    cpp_s = median_seconds(lambda: _C.sample_hops(indptr, indices, seeds, fanouts, 7, 0, 0), repeats)
    return {"edges_per_batch": edges, "triton_edges_per_s": edges / triton_s, "cpp_cpu_edges_per_s": edges / cpp_s}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="tiny sizes (the CPU interpreter smoke run)")
    p.add_argument("--json", default="bench-results/gpu_kernels.json")
    p.add_argument("--hit-batch", default="65536,262144",
                   help="ids of the all-hit batch (4 KiB rows each); several, comma-separated, each measured")
    p.add_argument("--miss-batch", type=int, default=16384,
                   help="ids of the lookup with misses (4 KiB rows; half miss); 0 leaves it out")
    p.add_argument("--skip-sampler", action="store_true", help="only the cache figures")
    p.add_argument("--profile", action="store_true",
                   help="print the all-hit serve's and lookup's time by op (torch.profiler)")
    p.add_argument("--profile-sampler", action="store_true",
                   help="print the sampler's time by op for 10 batches (torch.profiler, by self CPU time)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_kernels.py: torch sees no CUDA device; run it on a GPU machine (or --device cpu --quick)",
              file=sys.stderr)
        return 2
    if device.type == "cpu":
        set_kernel_mode("triton")  # the Triton kernels, under the interpreter
    big = not args.quick
    try:
        batches = [int(b) for b in str(args.hit_batch).split(",") if b] if big else [64]
    except ValueError:
        p.error(f"--hit-batch takes batch sizes separated by commas, got {args.hit_batch!r}")
    all_hit = [cache_all_hit(device, num_lines=(1 << 20) if big else 256, batch=b, row_bytes=4096 if big else 64,
                             repeats=args.repeats, profile=args.profile) for b in batches]
    lookups = [lookup_all_hit(device, batch=b, row_bytes=4096 if big else 64, repeats=args.repeats,
                              profile=args.profile, graphs=graphs)
               for b in batches for graphs in ((False, True) if device.type == "cuda" else (False,))]
    misses = None
    if args.miss_batch > 0:
        with tempfile.TemporaryDirectory() as root:
            misses = [lookup_with_misses(device, batch=args.miss_batch if big else 64, row_bytes=4096 if big else 64,
                                         repeats=args.repeats, root=root, pvp=pvp) for pvp in (False, True)]
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton interpreter)",
        "cache_all_hit": all_hit[0],  # the first batch size; every size in cache_all_hit_by_batch
        "cache_all_hit_by_batch": all_hit,
        "lookup_all_hit_by_batch": lookups,
        "lookup_with_misses": None if misses is None else misses[0],
        "lookup_with_misses_pvp": None if misses is None else misses[1],  # the victim buffer serving the cold half
    }
    if args.skip_sampler:
        print(json.dumps(result))
        return 0
    result["sampler"] = sampler_edges(device, num_nodes=1_000_000 if big else 500, avg_degree=10,
                                      batch=4096 if big else 32, fanouts=[10, 5] if big else [3, 2],
                                      repeats=args.repeats, profile=args.profile_sampler)
    write_json(args.json, result)
    s = result["sampler"]
    print(f"device {result['device']}")
    print(f"{'measure':<28}{'ours':>14}{'limit / peer':>16}{'ratio':>8}")
    for c in all_hit:
        label = f"cache all-hit GB/s, {c['batch']:,} ids"
        print(f"{label:<28}{c['serve_gb_per_s']:>14.2f}{c['copy_gb_per_s']:>16.2f}"
              f"{c['ratio_to_copy']:>8.2f}   (limit: device copy)")
    for c in lookups:
        label = f"lookup all-hit{' graphed' if c['graphs'] else ''} GB/s, {c['batch']:,}"
        print(f"{label:<28}{c['lookup_gb_per_s']:>14.2f}{c['copy_gb_per_s']:>16.2f}"
              f"{c['ratio_to_copy']:>8.2f}   (SoftwareCache.lookup; hit ratio {c['hit_ratio']:.3f})")
    for m in misses or ():
        label = f"lookup, half miss{', PVP' if m['pvp'] else ''}, ms, {m['batch']:,}"
        print(f"{label:<28}{m['lookup_ms']:>14.3f}{m['limit_ms']:>16.3f}{m['ratio_to_limit']:>8.2f}"
              f"   (limit: the rows moved without a cache; hit ratio {m['hit_ratio']:.3f}"
              f"{', cache and victim buffer' if m['pvp'] else ''})")
    ratio = s["triton_edges_per_s"] / s["cpp_cpu_edges_per_s"]
    print(f"{'sampler edges/s':<28}{s['triton_edges_per_s']:>14,.0f}{s['cpp_cpu_edges_per_s']:>16,.0f}"
          f"{ratio:>8.2f}   (peer: C++ sampler on the host)")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
