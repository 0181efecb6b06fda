"""The host's work per call of the GPU data path, counted on CPU tensors against issue 43's budget.

Runs a device-mode cache (its GPU path: a stream stand-in, the staging buffer, the Triton kernels under the
interpreter) and the device sampler on CPU tensors under the recorder of tests/host_budget.py, and prints per
operation the kernel launches, reads back to the host, fresh device allocations and bytes copied to the host,
with the budget beside each (a lookup's bytes at two cache sizes: they must not grow with the cache).

    python benchmarks/host_budget.py
"""
from __future__ import annotations

import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))  # the recorder is a test helper, not part of the package

import pytest  # noqa: E402  (its MonkeyPatch installs the stream stand-in)

import lsm_gnn  # noqa: E402,F401  (turns on Triton's interpreter on a machine without a GPU)
from host_budget import (BUDGETS, CACHE_SETS, LOOKUPS, WAYS, device_mode, lookup_work, sampler_work,  # noqa: E402
                         tiny_dataset)


def _cell(count: int, most: int | None) -> str:
    return f"{count} (<= {most})" if most is not None else str(count)


def rows(dataset: str) -> list[list[str]]:
    table = []
    for op in LOOKUPS:
        small, large = (lookup_work(op, dataset, sets) for sets in CACHE_SETS)
        budget = BUDGETS.get(op, {})
        c = small.counts
        same = "same" if large.counts.bytes_to_host == c.bytes_to_host else "grows"
        table.append([op, _cell(c.launches, budget.get("launches")), _cell(c.reads_back, budget.get("reads_back")),
                      str(c.allocations), f"{c.bytes_to_host} / {large.counts.bytes_to_host} (must be same: {same})"])
    budget = BUDGETS["sampler call"]
    for hops in (1, 2):
        c = sampler_work(hops).counts
        per_hop = f"{c.launches / hops:g} (<= {budget['launches per hop']})"
        table.append([f"sampler call, {hops} hop{'s' * (hops > 1)}", f"{c.launches}; per hop {per_hop}",
                      _cell(c.reads_back, budget["reads_back"]), str(c.allocations), str(c.bytes_to_host)])
    return table


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as monkeypatch, device_mode(monkeypatch):
        table = rows(tiny_dataset(os.path.join(tmp, "ds")))
    lines = [f"{WAYS}-way caches of {CACHE_SETS[0] * WAYS} and {CACHE_SETS[1] * WAYS} lines (bytes to host at both), "
             "40 ids a lookup; sampler: 10 seeds, fanout 4; (<= n): the budget (the issue's; the launches of a lookup "
             "with misses, with or without PVP: ours)",
             "", "| operation | launches | reads back | allocations | bytes to host |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in table]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
