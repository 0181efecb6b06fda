"""Belady's MIN: the offline optimum hit ratio for a recorded trace.

Fully associative, ``capacity`` lines, batch-granular like the cache: the
distinct ids of iteration t are all requested at time t. After serving t the
cache keeps the ``capacity`` ids with the nearest next use among what it held
and what t brought in (bypass allowed), which no policy can beat.

Set-associative (``belady_set_associative``): the same rule per set, where id
``v`` may only live in set ``set_of(v, num_sets)`` (the cache's mapping) of
``ways`` lines. Sets share no ids, so this is the optimum of a ``num_sets x
ways`` cache; it is at most the fully associative optimum at ``num_sets *
ways`` lines, and equal to it with one set. The difference is what the
associativity costs; what a policy loses beyond it is the policy's own.
"""
from __future__ import annotations

import heapq

import numpy as np
import torch

from lsm_gnn.cache.geometry import set_of
from lsm_gnn.utils.ids import as_id_tensor

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


def _distinct_batches(trace) -> list[np.ndarray]:
    return [np.unique(as_id_tensor(b).numpy()) for b in trace]


def belady_reference(trace, capacity: int) -> tuple[int, int]:
    """(hits, distinct requests) of MIN over ``trace`` (an iterable of id batches). Pure Python."""
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    batches = _distinct_batches(trace)
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


def belady_set_associative_reference(trace, num_sets: int, ways: int) -> tuple[int, int]:
    """(hits, distinct requests) of MIN per set of a ``num_sets x ways`` cache. Pure Python, written
    independently of the fully associative version: each set is a list of [next use, id] lines."""
    if num_sets < 1 or ways < 0:
        raise ValueError(f"a cache needs num_sets >= 1 and ways >= 0, got {num_sets} sets x {ways} ways")
    batches = _distinct_batches(trace)
    sets: list[list[list[int]]] = [[] for _ in range(num_sets)]
    hits = total = 0
    for ids, nxt in zip(batches, next_uses(batches)):
        total += ids.size
        misses = []
        for v, n, s in zip(ids.tolist(), nxt.tolist(), set_of(ids, num_sets).tolist()):
            line = next((line for line in sets[s] if line[1] == v), None)
            if line is None:
                misses.append((v, n, s))
            else:
                hits += 1
                line[0] = n
        for v, n, s in misses:
            lines = sets[s]
            if len(lines) < ways:
                lines.append([n, v])
            elif lines and max(lines)[0] > n:  # replace the farthest next use unless v is needed later still
                lines[lines.index(max(lines))] = [n, v]
    return hits, total


def _native_trace(trace) -> list[torch.Tensor]:
    return [torch.from_numpy(b) for b in _distinct_batches(trace)]


def belady_min(trace, capacity: int, num_nodes: int, count_from: int = 0) -> tuple[int, int]:
    """(hits, distinct requests) of MIN, computed by the native core (same definition);
    iterations before ``count_from`` warm the cache but are not counted."""
    from lsm_gnn import _C

    return _C.belady_min(_native_trace(trace), int(num_nodes), int(capacity), int(count_from))


def belady_set_associative(trace, num_sets: int, ways: int, num_nodes: int, count_from: int = 0) -> tuple[int, int]:
    """(hits, distinct requests) of MIN per set of a ``num_sets x ways`` cache (ids mapped to sets as the
    cache maps them), by the native core; iterations before ``count_from`` warm the cache, uncounted."""
    from lsm_gnn import _C

    return _C.belady_set_associative(_native_trace(trace), int(num_nodes), int(num_sets), int(ways),
                                     int(count_from))
