"""Heterogeneous graphs: the cache on an IGBH-shaped graph whose node types share one id space.

One generated dataset (``lsm_gnn.data.synthetic_hetero``: paper, author,
institute and fos, 7 relations, every type with the same float32 features,
so one row format, one feature group and one cache), three measurements:

1. **Policies.** The typed batches of training epochs (train papers shuffled
   as the trainer's loader does, typed neighbor sampling), each batch's
   input nodes of every type mapped into the group's id space
   (``FeatureGroup.ids``), replayed through SoftwareCache for rr, static
   (reverse PageRank on the union graph), dynamic, hybrid and hybrid+pvp
   (``SoftwareCache(pvp=True)``: hybrid_pvp_room, reinstall), beside
   Belady's MIN on the same trace; hit ratios per node type too.
2. **Layout.** At equal lines, the one cache over the shared id space (what
   lsm-gnn builds) against one hybrid cache per node type, sized by the
   type's share of the rows the batches access (estimated from the first
   batches, or measured over the whole trace) or by its share of the rows,
   none given more lines than it can use (``--per-type-cap``).
3. **Training time.** The trainer for a fixed number of iterations, hybrid
   cache against features in memory (benchmarks/end_to_end.py's runner),
   medians of repeats in alternating order.

    python benchmarks/hetero.py              # ~4 min on 2 cores; docs/results/hetero.json
    python benchmarks/hetero.py --quick      # a smoke run, well under a minute
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch

from lsm_gnn.testing.benchmarking import load_script, machine_info, reusable_dataset, write_json
from lsm_gnn.build import feature_groups
from lsm_gnn.cache import SoftwareCache, belady_min, cache_geometry, replay
from lsm_gnn.data.dataset import type_offsets
from lsm_gnn.sampling import NeighborSampler
from lsm_gnn.features import FeatureGroup

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_JSON = "docs/results/hetero.json"
STEP_JSON = "docs/results/hetero_step.json"  # --step-only
POLICIES = ("rr", "static", "dynamic", "hybrid", "hybrid+pvp")
WAYS = 32
STATIC_SCORE = "reverse_pagerank"


def _sibling(name: str):
    return load_script(os.path.join(HERE, f"{name}.py"))


def ensure_dataset(path: str, num_papers: int, feature_dim: int, seed: int):
    """The IGBH-shaped dataset at ``path``, generated unless an earlier run left a matching one."""
    from lsm_gnn.data.synthetic_hetero import GENERATOR_VERSION, NODE_TYPES, generate_hetero_synthetic

    generator = {"kind": "hetero-communities", "version": GENERATOR_VERSION, "seed": seed,
                 "feature_dtype": "float32", "feature_dim": dict.fromkeys(NODE_TYPES, feature_dim)}
    ds = reusable_dataset(path, node_counts={"paper": num_papers}, generator=generator,
                          log=lambda line: print(line, file=sys.stderr))
    if ds is not None:
        return ds
    print(f"generating an IGBH-shaped graph of {num_papers:,} papers x {feature_dim} features at {path} ...",
          file=sys.stderr)
    return generate_hetero_synthetic(path, num_papers=num_papers, feature_dim=feature_dim, seed=seed,
                                     overwrite=True, progress=False)


def single_group(ds) -> FeatureGroup:
    """The one feature group of ``ds`` (only its id mapping is used: no storage behind it)."""
    groups = feature_groups(ds)
    if len(groups) != 1:
        raise SystemExit(f"{ds.path} has {len(groups)} row formats; this benchmark needs one (one shared cache)")
    types = groups[0]
    return FeatureGroup(types, type_offsets({t: ds.num_nodes_of(t) for t in types}), features=None)


@dataclass
class TypedTrace:
    """The group ids of every batch (its types one after another, in group order) and ids per type."""

    types: list[str]
    num_nodes: dict[str, int]
    offsets: dict[str, int]
    batches: list[torch.Tensor]
    counts: list[list[int]]      # per batch, ids of each type in ``types`` order
    seconds: float

    @property
    def num_rows(self) -> int:
        return sum(self.num_nodes.values())

    def type_batches(self, t: str) -> list[torch.Tensor]:
        """Per batch, the local ids of type ``t``."""
        k = self.types.index(t)
        out = []
        for ids, counts in zip(self.batches, self.counts):
            start = sum(counts[:k])
            out.append(ids[start:start + counts[k]] - self.offsets[t])
        return out

    def accesses(self, stop: int | None = None) -> dict[str, int]:
        """Rows accessed per type (distinct per batch) over the first ``stop`` batches (all by default)."""
        totals = np.sum(self.counts[:stop], axis=0)
        return {t: int(n) for t, n in zip(self.types, totals)}


def record_trace(ds, group: FeatureGroup, fanouts: list[int], batch_size: int, epochs: int, seed: int) -> TypedTrace:
    """The input nodes of ``epochs`` epochs of training, in the trainer's order: its loader shuffles the
    target type's train split with ``default_rng([seed, epoch])`` and numbers iterations across epochs."""
    sampler = NeighborSampler(ds, fanouts, seed=seed)
    train = np.asarray(ds.split("train", ds.target))
    batches, counts, iteration = [], [], 0
    start_time = time.perf_counter()
    for epoch in range(epochs):
        order = np.random.default_rng([seed, epoch]).permutation(train)
        for start in range(0, order.size, batch_size):
            ids, parts = group.ids(sampler.input_nodes({ds.target: order[start:start + batch_size]}, iteration))
            per_type = dict(parts)
            batches.append(ids)
            counts.append([per_type.get(t, 0) for t in group.types])
            iteration += 1
    return TypedTrace(list(group.types), {t: ds.num_nodes_of(t) for t in group.types}, dict(group.offsets), batches,
                      counts, time.perf_counter() - start_time)


def make_cache(num_rows: int, num_sets: int, ways: int, policy: str, static, args) -> SoftwareCache:
    """A cache over rows of nothing (hit ratios need no bytes); hybrid+pvp is SoftwareCache(pvp=True)'s defaults."""
    pvp = policy == "hybrid+pvp"
    null_storage = _sibling("cache_policies").NullStorage(num_rows)
    # Caches below one batch are allowed (lines of the current batch go last); the result counts such batches.
    return SoftwareCache(null_storage, num_sets=num_sets, ways=ways, policy=None if pvp else policy,
                         window=args.window, period=args.period, static_scores=static, oversubscribe=True, pvp=pvp,
                         pvp_queue_capacity=args.queue_lines)


def replay_cache(cache: SoftwareCache, batches, counts, warmup: int, window: int) -> dict:
    """Serves ``batches`` with a window of the following ones; hits over distinct ids from batch ``warmup``
    on (the trace's ids are distinct within a batch), in all and per part of each batch (``counts``)."""
    parts = len(counts[0]) if counts else 0
    part_hits, part_requests = np.zeros(parts, np.int64), np.zeros(parts, np.int64)
    base = None
    start = time.perf_counter()
    for t, (current, future) in enumerate(replay(batches, window, num_nodes=cache.storage.num_rows)):
        if t == warmup:
            base = dict(vars(cache.stats))
        _, hit = cache.lookup(current, future)
        if t >= warmup and parts:
            part_hits += [int(h.sum()) for h in torch.split(hit, counts[t])]
            part_requests += counts[t]
    s = {k: v - base[k] for k, v in vars(cache.stats).items()}
    return {"hits": s["hits"], "pvp_hits": s["pvp_hits"], "requests": s["unique"], "rows_read": s["misses"],
            "part_hits": part_hits.tolist(), "part_requests": part_requests.tolist(),
            "seconds": time.perf_counter() - start}


def ratio(hits: int, requests: int) -> float | None:
    return hits / requests if requests else None


def run_policies(trace: TypedTrace, static: np.ndarray, lines: int, args) -> dict:
    """Every policy on the shared cache of ``lines`` lines, and Belady's MIN at as many lines."""
    num_sets = max(1, lines // WAYS)
    row = {}
    for policy in args.policies:
        cache = make_cache(trace.num_rows, num_sets, WAYS, policy, static, args)
        r = replay_cache(cache, trace.batches, trace.counts, args.warmup, args.window)
        row[policy] = {"hit_ratio": ratio(r["hits"] + r["pvp_hits"], r["requests"]),
                       "cache_hit_ratio": ratio(r["hits"], r["requests"]),
                       "pvp_hit_ratio": ratio(r["pvp_hits"], r["requests"]),
                       "hit_ratio_by_type": {t: ratio(h, n) for t, h, n in
                                             zip(trace.types, r["part_hits"], r["part_requests"])},
                       "requests": r["requests"], "rows_read": r["rows_read"], "seconds": r["seconds"]}
        if cache.pvp is not None:  # host memory beside the cache's lines, which Belady's bound does not get
            row[policy]["victim_buffer_lines"] = cache.pvp.num_queues * cache.pvp.capacity
        print(f"  {policy:<11} hit ratio {row[policy]['hit_ratio']:.4f} ({r['seconds']:.0f} s)", file=sys.stderr)
    hits, requests = belady_min(trace.batches, num_sets * WAYS, trace.num_rows, count_from=args.warmup)
    row["belady"] = {"hit_ratio": hits / requests, "hits": hits, "requests": requests}
    for policy in args.policies:
        row[policy]["of_belady"] = row[policy]["hit_ratio"] / row["belady"]["hit_ratio"]
    return row


def lines_for_rows(num_rows: int, cap: str = "rows") -> int:
    """The most lines a per-type cache of ``num_rows`` rows is given. ``rows``: one per row, in whole sets.
    ``every-row``: the fewest sets in which hashing leaves no row without a way (what cache_geometry
    allocates to a cache larger than its rows), which takes more lines from the other types."""
    if cap == "every-row":
        num_sets, ways = cache_geometry(4 * num_rows, 1, WAYS, num_rows)
        return num_sets * ways
    return -(-num_rows // WAYS) * WAYS


def split_lines(total: int, weights: dict[str, float], caps: dict[str, int]) -> dict[str, float]:
    """``total`` lines in proportion to ``weights``, a type never given more than its cap (what it would not
    use goes to the others, in proportion)."""
    lines, open_types, left = {}, list(weights), float(total)
    while open_types:
        weight = sum(weights[t] for t in open_types)
        capped = [t for t in open_types if weight and left * weights[t] / weight >= caps[t]]
        if not capped:
            break
        for t in capped:
            lines[t] = float(caps[t])
            left -= lines[t]
            open_types.remove(t)
    for t in open_types:
        lines[t] = left * weights[t] / weight if weight else 0.0
    return lines


def type_geometries(total: int, weights: dict[str, float], caps: dict[str, int]) -> dict[str, tuple[int, int]]:
    """(sets, ways) per type for :func:`split_lines`' shares (caps in whole sets): 32 ways (fewer below one
    set), the whole sets that rounding down leaves over given to the types it cut most, so the caches add
    up to ``total`` lines within one set."""
    shares = split_lines(total, weights, caps)
    geometry, growable = {}, []
    for t, share in shares.items():
        if share >= caps[t]:
            geometry[t] = (caps[t] // WAYS, WAYS)
        elif share < WAYS:
            geometry[t] = (1, max(1, int(share)))
        else:
            geometry[t] = (int(share // WAYS), WAYS)
            growable.append(t)
    spare = total - sum(sets * ways for sets, ways in geometry.values())
    for t in sorted(growable, key=lambda t: geometry[t][0] * WAYS - shares[t]):
        if spare < WAYS:
            break
        geometry[t] = (geometry[t][0] + 1, WAYS)
        spare -= WAYS
    return geometry


def run_per_type(trace: TypedTrace, static_by_type: dict[str, np.ndarray], weights: dict[str, float], total: int,
                 args) -> dict:
    """One hybrid cache per node type, ``total`` lines split by ``weights``; each type's cache sees only its
    own ids, with a window of its own (as a feature group of its own would)."""
    caps = {t: lines_for_rows(n, args.per_type_cap) for t, n in trace.num_nodes.items()}
    geometries = type_geometries(total, weights, caps)
    by_type, hits, requests = {}, 0, 0
    for k, t in enumerate(trace.types):
        num_sets, ways = geometries[t]
        cache = make_cache(trace.num_nodes[t], num_sets, ways, "hybrid", static_by_type[t], args)
        r = replay_cache(cache, trace.type_batches(t), [[n[k]] for n in trace.counts], args.warmup, args.window)
        by_type[t] = {"lines": num_sets * ways, "hit_ratio": ratio(r["hits"], r["requests"]),
                      "requests": r["requests"]}
        hits, requests = hits + r["hits"], requests + r["requests"]
    share = sum(weights.values())
    return {"hit_ratio": ratio(hits, requests), "lines": sum(e["lines"] for e in by_type.values()),
            "weights": {t: weights[t] / share for t in trace.types},
            "lines_by_type": {t: e["lines"] for t, e in by_type.items()},
            "hit_ratio_by_type": {t: e["hit_ratio"] for t, e in by_type.items()}}


def run_layouts(trace: TypedTrace, static_by_type, shared_hybrid: dict, lines: int, args) -> dict:
    estimate_batches = max(1, round(args.estimate_share * len(trace.batches)))
    weights = {"per_type_estimated": trace.accesses(estimate_batches), "per_type_measured": trace.accesses(),
               "per_type_by_rows": trace.num_nodes}
    out = {"shared": {"hit_ratio": shared_hybrid["hit_ratio"], "lines": lines,
                      "hit_ratio_by_type": shared_hybrid["hit_ratio_by_type"]},
           "estimate_batches": estimate_batches}
    for name, w in weights.items():
        out[name] = run_per_type(trace, static_by_type, {t: float(w[t]) for t in trace.types}, lines, args)
        print(f"  {name:<19} hit ratio {out[name]['hit_ratio']:.4f} lines {out[name]['lines_by_type']}",
              file=sys.stderr)
    return out


def time_training(args, ds) -> dict:
    """benchmarks/end_to_end.py's runs on this dataset: hybrid cache against features in memory."""
    e2e = _sibling("end_to_end")
    settings = SimpleNamespace(model=args.model, hidden=args.hidden, fanouts=str(args.fanouts).replace(" ", ""),
                               batch_size=args.batch_size, capacity=args.train_capacity, window=args.window,
                               iterations=args.train_iterations, bound_iterations=0, pvp_queue_capacity=0,
                               pvp_queue_bytes=None, loader_threads=0, backend="io_uring")
    runs = e2e.run_rotated(settings, ds, ["hybrid", "memory"], args.repeats)
    summary = e2e.summarize(runs)
    per_repeat = e2e.per_repeat_ratios(runs, "hybrid", "memory")
    print(e2e.table(summary), file=sys.stderr)
    return {"runs": runs, "summary": summary,
            "hybrid_slowdown_vs_memory": e2e.ratios(summary)["hybrid_slowdown_vs_memory"],
            "hybrid_slowdown_vs_memory_per_repeat": per_repeat,
            "hybrid_slowdown_vs_memory_median": statistics.median(per_repeat)}


def model_batches(ds, args) -> list:
    """``--step-batches`` typed batches of the target's train split with their features (read from the files,
    so the step is all that is timed): (hops, {type: rows}, labels)."""
    sampler = NeighborSampler(ds, args.fanouts, seed=args.seed)
    train = np.asarray(ds.split("train", ds.target))
    rng = np.random.default_rng(args.seed)
    labels = torch.from_numpy(np.asarray(ds.labels(ds.target)).astype(np.int64))
    batches = []
    for k in range(args.step_batches):
        seeds = torch.from_numpy(np.sort(rng.choice(train, min(args.batch_size, train.size), replace=False)))
        hops = sampler.sample({ds.target: seeds}, k)
        x = {t: torch.from_numpy(ds.node_type(t).read_features_direct(ids.numpy()))
             for t, ids in hops[-1].nodes.items() if ds.node_type(t).feature_dim}
        batches.append(SimpleNamespace(hops=hops, x=x, y=labels[seeds]))
    return batches


class DestinationOnlyReference(torch.nn.Module):
    """A plain PyG R-SAGE / R-GAT written for this comparison: per layer and relation a conv of (its sources,
    only its destinations), summed per type, each type's root term, ReLU between layers. The issue's reference
    for the training step; the model under test adds only what a trainer needs (learned vectors for types
    without features, dropout, checks)."""

    def __init__(self, model):
        super().__init__()
        import copy

        # The same convs and root terms, copied: equal work and equal starting weights.
        self.convs, self.skips = copy.deepcopy(model.convs), copy.deepcopy(model.skips)
        self.embedding, self.target = copy.deepcopy(model.embedding), model.target

    def forward(self, batch):
        nodes = batch.hops[-1].nodes
        x = {t: batch.x[t].float() if t in batch.x else self.embedding[t].expand(nodes[t].numel(), -1)
             for t in nodes}
        for i, (layer, skip, hop) in enumerate(zip(self.convs, self.skips, reversed(batch.hops))):
            out = {t: skip[t](x[t][:hop.num_dst[t]]) for t in skip}
            for (src, rel, dst), conv in layer.convs.items():
                edges = hop.edge_index.get((src, rel, dst))
                if dst in out and edges is not None and edges.shape[1]:
                    out[dst] = out[dst] + conv((x[src], x[dst][:hop.num_dst[dst]]), edges)
            x = out if i == len(self.convs) - 1 else {t: torch.relu(y) for t, y in out.items()}
        return x[self.target]


def time_model_steps(args, ds) -> dict:
    """The training step alone (forward, backward, Adam) on the same batches: the trainer's model, the same
    model when every relation's conv runs over the whole layer (PyG's HeteroConv on the layer's rows, what it
    did before issue 31), and :class:`DestinationOnlyReference`; repeats alternate, medians of ms per step."""
    import lsm_gnn.models as models

    batches = model_batches(ds, args)
    in_dims = {t: ds.node_type(t).feature_dim for t in ds.node_types}
    num_classes = int(max(int(b.y.max()) for b in batches)) + 1
    torch.manual_seed(args.seed)
    ours = models.HeteroHopGNN(args.model, in_dims, ds.relations, ds.target, args.hidden, num_classes,
                               len(args.fanouts), heads=4)
    reference = DestinationOnlyReference(ours)
    destination_only = models._destination_messages

    def whole_layers(conv, x, edges, num_dst):
        return {t: y[:num_dst[t]] for t, y in conv(x, edges).items()} if edges else {}

    def run(model, messages) -> float:
        models._destination_messages = messages
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        try:
            start = time.perf_counter()
            for batch in batches:
                optimizer.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(model(batch), batch.y).backward()
                optimizer.step()
            return 1000 * (time.perf_counter() - start) / len(batches)
        finally:
            models._destination_messages = destination_only

    variants = {"ours": (ours, destination_only), "whole_layers": (ours, whole_layers),
                "reference": (reference, destination_only)}
    for model, messages in variants.values():  # warm-up
        run(model, messages)
    times = {name: [] for name in variants}
    for repeat in range(args.step_repeats):
        order = list(variants) if repeat % 2 == 0 else list(reversed(variants))
        for name in order:
            times[name].append(run(*variants[name]))
    ms = {name: statistics.median(t) for name, t in times.items()}
    per_repeat = [a / b for a, b in zip(times["ours"], times["reference"])]
    result = {"model": args.model, "hidden": args.hidden, "batches": len(batches), "ms_per_step": ms,
              "ms_per_step_runs": times, "ours_over_reference_per_repeat": per_repeat,
              "ours_over_reference": statistics.median(per_repeat),
              "whole_layers_over_ours": statistics.median(a / b for a, b in zip(times["whole_layers"], times["ours"])),
              "threads": torch.get_num_threads()}
    print(f"training step ({args.model}): ours {ms['ours']:.1f} ms, reference {ms['reference']:.1f} ms "
          f"(ours/reference {result['ours_over_reference']:.2f}x), whole layers {ms['whole_layers']:.1f} ms "
          f"({result['whole_layers_over_ours']:.2f}x ours)", file=sys.stderr)
    return result


def trace_summary(trace: TypedTrace, warmup: int) -> dict:
    sizes = np.array([ids.numel() for ids in trace.batches])
    accesses = trace.accesses()
    total = sum(accesses.values())
    per_type = {}
    for t in trace.types:
        touched = np.unique(np.concatenate([b.numpy() for b in trace.type_batches(t)]))
        per_type[t] = {"num_nodes": trace.num_nodes[t], "share_of_rows": trace.num_nodes[t] / trace.num_rows,
                       "accesses": accesses[t], "share_of_accesses": accesses[t] / total,
                       "rows_touched": int(touched.size), "share_touched": touched.size / trace.num_nodes[t]}
    return {"batches": len(trace.batches), "warmup": warmup, "rows_per_batch_mean": float(sizes.mean()),
            "rows_per_batch_max": int(sizes.max()), "sample_seconds": trace.seconds, "per_type": per_type}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="/tmp/lsm-gnn-bench/hetero", help="generated dataset directory (reused)")
    p.add_argument("--num-papers", type=int, default=200_000, help="the other types follow IGBH's proportions")
    p.add_argument("--feature-dim", type=int, default=128, help="float32 features of every type")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fanouts", default="10,5", help="per hop, for every relation")
    p.add_argument("--batch-size", type=int, default=256, help="seed papers per batch")
    p.add_argument("--epochs", type=int, default=1, help="epochs of batches in the trace")
    p.add_argument("--window", type=int, default=32, help="future batches the cache sees (trace and training)")
    p.add_argument("--period", type=int, default=4)
    p.add_argument("--warmup", type=int, default=32, help="batches that fill the caches before hits count")
    p.add_argument("--sizes", default="0.01,0.025,0.05,0.1", help="cache sizes as fractions of all feature rows")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--queue-capacity", default="scaled",
                   help="lines per victim queue of hybrid+pvp, or 'scaled' (benchmarks/pvp.py's: the paper's "
                        "16K lines per 140K nodes of a batch)")
    p.add_argument("--estimate-share", type=float, default=0.1,
                   help="share of the trace's first batches that estimate the per-type access shares")
    p.add_argument("--per-type-cap", choices=("rows", "every-row"), default="rows",
                   help="most lines of a per-type cache: one per row, or until hashing leaves no row without a way")
    p.add_argument("--train-capacity", default="10%", help="the trainer's cache.capacity")
    p.add_argument("--train-iterations", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5, help="training runs per feature path (0: no training)")
    p.add_argument("--model", default="sage")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--step-batches", type=int, default=20, help="batches of the training-step comparison (0: none)")
    p.add_argument("--step-repeats", type=int, default=5, help="repeats of it, alternating the variants' order")
    p.add_argument("--step-only", action="store_true", help="only the training-step comparison")
    p.add_argument("--json", default=None, help=f"result file (default {DEFAULT_JSON}; none with --quick)")
    p.add_argument("--quick", action="store_true", help="tiny graph, short trace, one training repeat")
    args = p.parse_args(argv)
    if args.quick:
        args.num_papers, args.feature_dim, args.batch_size, args.fanouts = 4000, 16, 64, "5,5"
        args.window, args.warmup, args.sizes = 8, 4, "0.05,0.1"
        args.train_iterations, args.repeats, args.train_capacity = 5, min(args.repeats, 1), "40%"
        args.step_batches, args.step_repeats, args.hidden = min(args.step_batches, 3), min(args.step_repeats, 2), 16
        args.data = args.data + "-quick"
    elif args.json is None:
        args.json = STEP_JSON if args.step_only else DEFAULT_JSON
    args.fanouts = [int(k) for k in args.fanouts.split(",")]
    args.policies = [p for p in args.policies.split(",") if p]
    unknown = sorted(set(args.policies) - set(POLICIES))
    if unknown:
        p.error(f"unknown policies {unknown}; valid: {', '.join(POLICIES)}")
    return args


def print_tables(result: dict) -> None:
    sizes, policies = list(result["sizes"]), result["settings"]["policies"]
    rows = [result["sizes"][s] for s in sizes]
    print(f"\nhit ratio (cache + PVP) over distinct rows per batch, and its fraction of Belady's; "
          f"{result['trace']['batches']} batches, {result['trace']['rows_per_batch_mean']:,.0f} rows each")
    print(f"{'policy':<13}" + "".join(f"{float(s):>17.2%}" for s in sizes))
    for policy in policies:
        print(f"{policy:<13}" + "".join(f"{row['policies'][policy]['hit_ratio']:>9.4f} "
                                        f"({row['policies'][policy]['of_belady']:.2f}x)" for row in rows))
    print(f"{'belady':<13}" + "".join(f"{row['policies']['belady']['hit_ratio']:>9.4f}        " for row in rows))
    types = list(result["trace"]["per_type"])
    if "hybrid" in policies:
        print("\nhybrid per type (" + ", ".join(f"{t} {result['trace']['per_type'][t]['share_of_accesses']:.1%}"
                                              for t in types) + " of the accesses)")
        for s, row in zip(sizes, rows):
            by_type = row["policies"]["hybrid"]["hit_ratio_by_type"]
            print(f"  {float(s):.2%}: " + ", ".join(f"{t} {by_type[t]:.4f}" for t in types))
        print("\nlayout at equal lines (hybrid): overall hit ratio; per type")
        for s, row in zip(sizes, rows):
            for name in ("shared", "per_type_estimated", "per_type_measured", "per_type_by_rows"):
                e = row["layout"][name]
                print(f"  {float(s):.2%} {name:<19} {e['hit_ratio']:.4f} {e['lines']:>8,} lines; "
                      + ", ".join(f"{t} {e['hit_ratio_by_type'][t]:.3f}" for t in types))
    training = result.get("training")
    if training:
        summary = training["summary"]
        print(f"\ntraining: hybrid {summary['hybrid']['ms_per_iter_wall']:.1f} ms/it (hit ratio "
              f"{summary['hybrid']['hit_ratio']:.3f}), memory {summary['memory']['ms_per_iter_wall']:.1f} ms/it: "
              "hybrid/memory per repeat " + ", ".join(f"{r:.2f}" for r in
                                                       training["hybrid_slowdown_vs_memory_per_repeat"])
              + f": median {training['hybrid_slowdown_vs_memory_median']:.2f}x (ratio of the medians "
              f"{training['hybrid_slowdown_vs_memory']:.2f}x)")


def main(argv=None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    os.makedirs(os.path.dirname(os.path.abspath(args.data)), exist_ok=True)
    ds = ensure_dataset(args.data, args.num_papers, args.feature_dim, args.seed)
    command = "python benchmarks/hetero.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.step_only:
        result = {"command": command, "settings": {k: v for k, v in vars(args).items() if k != "json"},
                  "machine": machine_info(), "training_step": time_model_steps(args, ds),
                  "seconds": time.perf_counter() - started}
        if args.json:
            write_json(args.json, result)
        return result
    group = single_group(ds)
    trace = record_trace(ds, group, args.fanouts, args.batch_size, args.epochs, args.seed)
    if args.warmup >= len(trace.batches):
        raise SystemExit(f"--warmup {args.warmup} leaves none of the trace's {len(trace.batches)} batches to measure")
    summary = trace_summary(trace, args.warmup)
    print(f"trace: {summary['batches']} batches, {summary['rows_per_batch_mean']:,.0f} rows each "
          f"({summary['rows_per_batch_mean'] / trace.num_rows:.2%} of {trace.num_rows:,}), sampled in "
          f"{trace.seconds:.0f} s", file=sys.stderr)
    args.queue_lines = (_sibling("pvp").scaled_queue_capacity(summary["rows_per_batch_mean"])
                        if args.queue_capacity == "scaled" else int(args.queue_capacity))
    static_by_type = {t: np.asarray(ds.score(STATIC_SCORE, t)) for t in trace.types}
    static = np.concatenate([static_by_type[t] for t in trace.types])  # the trainer's: group order
    result = {"command": command,
              "settings": {k: v for k, v in vars(args).items() if k != "json"}, "machine": machine_info(),
              "dataset": {"path": ds.path, "num_nodes": {t: ds.num_nodes_of(t) for t in ds.node_types},
                          "total_rows": trace.num_rows, "row_bytes": args.feature_dim * 4,
                          "relations": len(ds.relations), "num_edges": ds.num_edges},
              "trace": summary, "sizes": {}}
    for fraction in (float(s) for s in args.sizes.split(",")):
        lines = max(1, int(fraction * trace.num_rows) // WAYS) * WAYS
        print(f"cache of {fraction:.2%} of the rows ({lines:,} lines)", file=sys.stderr)
        policies = run_policies(trace, static, lines, args)
        row = {"lines": lines, "batches_larger_than_cache": sum(ids.numel() > lines for ids in trace.batches),
               "policies": policies}
        if "hybrid" in policies:
            row["layout"] = run_layouts(trace, static_by_type, policies["hybrid"], lines, args)
        result["sizes"][f"{fraction:g}"] = row
    if args.step_batches:
        result["training_step"] = time_model_steps(args, ds)
    if args.repeats:
        result["training"] = time_training(args, ds)
    result["seconds"] = time.perf_counter() - started
    print_tables(result)
    print(f"\n{result['seconds']:.0f} s in all", file=sys.stderr)
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
