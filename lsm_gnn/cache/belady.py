"""Belady's MIN: the offline optimum hit ratio for a recorded trace.

Fully associative, ``capacity`` lines, batch-granular like the cache: the
distinct ids of iteration t are all requested at time t. After serving t the
cache keeps the ``capacity`` ids with the nearest next use among what it held
and what t brought in (bypass allowed), which no policy can beat.
"""
from __future__ import annotations

import heapq

import numpy as np
import torch

from lsm_gnn.ids import as_id_tensor

NEVER = np.iinfo(np.int64).max


def next_uses(batches: list[np.ndarray]) -> list[np.ndarray]:
    """For each batch (distinct ids), the iteration each id is next requested (NEVER if not)."""
    seen: dict[int, int] = {}
    out = [None] * len(batches)
    for t in range(len(batches) - 1, -1, -1):
        nxt = np.empty(batches[t].size, np.int64)
        for j, v in enumerate(batches[t].tolist()):
            nxt[j] = seen.get(v, NEVER)
            seen[v] = t
        out[t] = nxt
    return out


def belady_reference(trace, capacity: int) -> tuple[int, int]:
    """(hits, distinct requests) of MIN over ``trace`` (an iterable of id batches). Pure Python."""
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    batches = [np.unique(as_id_tensor(b).numpy()) for b in trace]
    nexts = next_uses(batches)
    cached: dict[int, int] = {}   # id -> its next use
    heap: list[tuple[int, int]] = []  # (-next use, id); stale entries skipped lazily
    hits = total = 0
    for t, (ids, nxt) in enumerate(zip(batches, nexts)):
        total += ids.size
        misses = []
        for v, n in zip(ids.tolist(), nxt.tolist()):
            if v in cached:
                hits += 1
                cached[v] = n
                heapq.heappush(heap, (-n, v))
            else:
                misses.append((n, v))
        for n, v in misses:
            if len(cached) < capacity:
                cached[v] = n
                heapq.heappush(heap, (-n, v))
                continue
            while heap and cached.get(heap[0][1]) != -heap[0][0]:
                heapq.heappop(heap)  # stale entry
            if heap and -heap[0][0] > n:
                _, victim = heapq.heappop(heap)
                del cached[victim]
                cached[v] = n
                heapq.heappush(heap, (-n, v))
    return hits, total


def belady_min(trace, capacity: int, num_nodes: int, count_from: int = 0) -> tuple[int, int]:
    """(hits, distinct requests) of MIN, computed by the native core (same definition);
    iterations before ``count_from`` warm the cache but are not counted."""
    from lsm_gnn import _C

    batches = [torch.from_numpy(np.unique(as_id_tensor(b).numpy())) for b in trace]
    return _C.belady_min(batches, int(num_nodes), int(capacity), int(count_from))
