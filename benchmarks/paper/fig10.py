"""Fig. 10: the eviction policies' hit ratios at the paper's three cache sizes, beside GraphBolt's CPU cache
policies (LRU, CLOCK, S3-FIFO, SIEVE through libCacheSim), both Belady MIN bounds and the paper's published
figures. The trace and the simulations are ``benchmarks/cache_policies.py``'s; this draws and tabulates them."""
from __future__ import annotations

import os

from benchmarks import cache_policies
from benchmarks.paper.published import FIG10_HIT_RATIO, PAPER_CACHE_GB, PAPER_POLICIES, SIZE_SHARES

#: ours beyond the paper's: the project's default policy
EXTRA_POLICIES = ("farthest",)
QUICK = ["--num-nodes", "20000", "--window", "16", "--warmup", "8", "--iterations", "40", "--batch-size", "64"]
#: the paper's regime on a 2M-node graph: each batch touches the share of the graph 2048 seeds touch on IGB-Full
#: (2048 seeds here would make every cache smaller than one batch; docs/benchmarks/cache_policies.md)
FULL = ["--batch-size", "scaled"]


def run(out_dir: str, quick: bool) -> dict:
    """Runs the trace at the paper's sizes and writes ``fig10.json`` and ``fig10.png`` into ``out_dir``; returns
    the rows of the paper-vs-ours table."""
    policies = [*PAPER_POLICIES.values(), *EXTRA_POLICIES]
    argv = ["--policies", ",".join(policies), "--sizes", ",".join(f"{s:.6g}" for s in SIZE_SHARES),
            "--json", os.path.join(out_dir, "fig10.json"), *(QUICK if quick else FULL)]
    results = cache_policies.main(argv)
    sizes = list(results["sizes"])
    names = policies + [p for p in cache_policies.BOUNDS + cache_policies.PEERS if p in results["sizes"][sizes[0]]]
    draw(results, names, os.path.join(out_dir, "fig10.png"))
    rows = []
    for label, policy in PAPER_POLICIES.items():
        for k, size in enumerate(sizes):
            paper = FIG10_HIT_RATIO.get(policy, (None,) * len(sizes))[k]
            rows.append({"figure": "10", "what": f"{label} ({policy}) hit ratio", "size": f"{PAPER_CACHE_GB[k]} GB",
                         "paper": paper, "ours": results["sizes"][size][policy]["hit_ratio"]})
    return {"rows": rows, "results": results}


def draw(results: dict, names: list[str], path: str) -> None:
    """Our hit ratios per size, the paper's published figures as black diamonds on their bars."""
    cfg = results["config"]
    cache_policies.plot(results, names, path, published=FIG10_HIT_RATIO,
                        xlabels=[f"{gb} GB of IGB-Full: {float(s):.2%} of nodes"
                                 for gb, s in zip(PAPER_CACHE_GB, results["sizes"])],
                        title=f"Fig. 10: eviction policies, {cfg['num_nodes']:,}-node R-MAT, batch "
                              f"{cfg['batch_size']}, fanouts {cfg['fanouts']}, 32 ways")
