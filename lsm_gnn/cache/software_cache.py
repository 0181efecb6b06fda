"""The software cache: 32-way set-associative, policy-driven, in front of a storage.

Semantics are those of :mod:`lsm_gnn.cache.reference` (the oracle); the
metadata work runs in the native core (OpenMP across sets), rows move with
torch index ops. State lives in tensors owned by this object.
"""
from __future__ import annotations

import threading

import numpy as np
import torch

from lsm_gnn.cache.policies import POLICY_CODE, PolicyConfig
from lsm_gnn.cache.reference import CacheStats, quantize_scores
from lsm_gnn.cache.window import WindowBuffer
from lsm_gnn.storage.base import as_id_tensor
from lsm_gnn.units import parse_bytes

INVALID_TAG = -1
NO_REUSE_RECORD = (0xFFFF << 48) - (1 << 64)  # the no-reuse PVP record, as a signed int64


def cache_geometry(capacity, row_bytes: int, ways: int) -> tuple[int, int]:
    """(num_sets, ways) for a capacity in bytes (or "4G"); lines hold one row each."""
    capacity = parse_bytes(capacity)
    if ways < 1:
        raise ValueError(f"ways must be >= 1, got {ways}")
    lines = capacity // row_bytes
    if lines < ways:
        raise ValueError(f"a cache of {capacity} bytes holds {lines} rows of {row_bytes} bytes, fewer than one set "
                         f"of {ways} ways; give it at least {ways * row_bytes} bytes")
    return lines // ways, ways


def static_ranks(scores) -> torch.Tensor | None:
    """Per-node static scores as the int16 view of uint16 ranks the native core reads."""
    if scores is None:
        return None
    scores = np.asarray(scores)
    ranks = scores if scores.dtype == np.uint16 else quantize_scores(scores)
    return torch.from_numpy(np.ascontiguousarray(ranks).view(np.int16))


class SoftwareCache:
    """A set-associative cache of feature rows in front of ``storage``.

    ``lookup(ids, future)`` serves one iteration: it returns the rows of
    ``ids`` in request order (always exactly the bytes in storage) and a mask
    of which ids were hits. ``future`` is the window of upcoming batches (a
    :class:`WindowBuffer`, ideally built with ``num_nodes`` for its native
    index, or a list of id tensors); it feeds the dynamic policies.
    Concurrent lookups are serialized batch by batch; each batch runs in parallel.

    A batch with more distinct ids than the cache has lines raises
    ValueError, since such a cache thrashes; ``oversubscribe=True`` allows it
    (lines of the current batch are then evicted last), for studies that
    scale caches below one batch.
    """

    def __init__(self, storage, capacity=None, *, ways: int = 32, policy: str | PolicyConfig = "hybrid",
                 window: int = 256, period: int = 4, threshold: int | None = None, levels=None,
                 static_scores=None, num_sets: int | None = None, oversubscribe: bool = False,
                 device: str | torch.device = "cpu", num_threads: int = 0):
        self.storage = storage
        if isinstance(policy, PolicyConfig):
            self.policy = policy
        else:
            self.policy = PolicyConfig(policy, window=window, period=period, threshold=threshold,
                                       levels=tuple(levels) if levels is not None else None)
        if num_sets is None:
            if capacity is None:
                raise ValueError("give the cache a capacity in bytes (e.g. '4G') or num_sets")
            num_sets, ways = cache_geometry(capacity, storage.row_bytes, ways)
        elif num_sets < 1 or ways < 1:
            raise ValueError(f"a cache needs at least one set and one way, got {num_sets} x {ways}")
        self.num_sets, self.ways = int(num_sets), int(ways)
        self.device = torch.device(device)
        if self.device.type == "cuda":
            from lsm_gnn import _C

            if not _C.with_cuda:
                raise RuntimeError("this lsm-gnn build has no CUDA ops: reinstall with a CUDA build of torch "
                                   "(pip install --no-build-isolation -e .) or use device='cpu'")
        elif self.device.type != "cpu":
            raise ValueError(f"device must be 'cpu' or a CUDA device, got {device!r}")
        n = self.num_sets * self.ways
        on = {"device": self.device}
        self.tags = torch.full((n,), INVALID_TAG, dtype=torch.int64, **on)
        self.records = torch.full((n,), NO_REUSE_RECORD, dtype=torch.int64, **on)
        self.flags = torch.zeros(n, dtype=torch.uint8, **on)
        self.static_score = torch.zeros(n, dtype=torch.int16, **on)
        self.last_use = torch.full((n,), -1, dtype=torch.int64, **on)
        self.rr_pointer = torch.zeros(self.num_sets, dtype=torch.int32, **on)
        self.data = torch.zeros((n, storage.dim), dtype=storage.dtype, **on)
        self.node_static = static_ranks(static_scores)
        if self.node_static is not None:
            self.node_static = self.node_static.to(self.device)
        if self.node_static is not None and self.node_static.numel() != storage.num_rows:
            raise ValueError(f"static_scores has {self.node_static.numel()} entries; the storage has "
                             f"{storage.num_rows} nodes")
        self.num_threads = num_threads
        self.oversubscribe = oversubscribe
        self.iteration = 0
        self.scan_base = 0
        self.stats = CacheStats()
        self._lock = threading.Lock()

    @property
    def num_lines(self) -> int:
        return self.num_sets * self.ways

    @property
    def capacity_bytes(self) -> int:
        return self.num_lines * self.storage.row_bytes

    def _state(self):
        return (self.tags, self.records, self.flags, self.static_score, self.last_use, self.rr_pointer, self.ways)

    def scan(self, future) -> None:
        """Sets every cached line's next reuse from ``future`` (future[0] = next iteration)."""
        from lsm_gnn import _C

        index = future.index if isinstance(future, WindowBuffer) else None
        if index is None:  # a plain list of batches: index it now (O(ids in the window))
            index = _C.WindowIndex(self.storage.num_rows)
            for k, batch in enumerate(future):
                if k >= self.policy.window:
                    break
                index.push(as_id_tensor(batch), 0)
        if self.device.type == "cuda":
            _C.cache_scan_cuda(*self._state(), index, self.policy.window)  # untested: no GPU run yet
        else:
            _C.cache_scan(*self._state(), index, self.policy.window, self.num_threads)
        self.scan_base = self.iteration
        self.stats.scans += 1

    def lookup(self, ids, future=None, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Serves one iteration; returns (rows [len(ids), dim] in request order, hit mask [len(ids)]).

        ``out``, a contiguous ``[len(ids), dim]`` tensor of the cache's dtype
        and device, receives the rows: reusing one avoids faulting in fresh
        memory on every batch (which costs more than the copy itself).
        """
        from lsm_gnn import _C

        ids = as_id_tensor(ids).to(self.device)
        shape = (ids.numel(), self.storage.dim)
        if out is not None and (tuple(out.shape) != shape or out.dtype != self.data.dtype
                                or out.device != self.device or not out.is_contiguous()):
            raise ValueError(f"out must be a contiguous {self.data.dtype} tensor of shape {shape} on {self.device}, "
                             f"got {out.dtype} {tuple(out.shape)} on {out.device}")
        with self._lock:
            if self.device.type == "cpu":
                # np.unique: torch.unique (a parallel sort) took 50x longer on a loaded 2-core machine.
                unique_np, inverse_np = np.unique(ids.numpy(), return_inverse=True)
                unique, inverse = torch.from_numpy(unique_np), torch.from_numpy(inverse_np.reshape(-1))
            else:
                unique, inverse = torch.unique(ids, sorted=True, return_inverse=True)
            if unique.numel() and (int(unique[0]) < 0 or int(unique[-1]) >= self.storage.num_rows):
                bad = int(unique[0]) if int(unique[0]) < 0 else int(unique[-1])
                raise IndexError(f"node id {bad} is out of range [0, {self.storage.num_rows})")
            if unique.numel() > self.num_lines and not self.oversubscribe:
                raise ValueError(
                    f"this batch has {unique.numel()} distinct ids but the cache holds {self.num_lines} lines "
                    f"({self.capacity_bytes} bytes); raise the capacity to at least "
                    f"{unique.numel() * self.storage.row_bytes} bytes (or pass oversubscribe=True)")
            if self.policy.uses_window and future is not None and self.iteration % self.policy.period == 0:
                self.scan(future)
            p = self.policy
            args = (*self._state(), unique, self.node_static, POLICY_CODE[p.name], self.iteration, self.scan_base,
                    p.near_threshold, list(p.level_rank))
            if self.device.type == "cuda":  # untested: no GPU run yet
                line, hit, _, _, evictions, evicted_in_use = _C.cache_assign_cuda(*args)
            else:
                line, hit, _, _, evictions, evicted_in_use = _C.cache_assign(*args, self.num_threads)
            # Hit rows first, straight into request order, before any fill
            # overwrites a line (a hit line may have been evicted by a later miss).
            request_line = line[inverse]
            request_hit = hit[inverse]
            rows = torch.empty(shape, dtype=self.data.dtype, device=self.device) if out is None else out
            torch.index_select(self.data, 0, request_line.clamp_min(0), out=rows)
            miss = torch.nonzero(~hit).reshape(-1)
            if miss.numel():
                fetched = self.storage.read(unique[miss].cpu()).to(self.device)
                self.stats.bytes_read += miss.numel() * self.storage.row_bytes
                miss_lines = line[miss]
                cached = miss_lines >= 0
                self.data.index_copy_(0, miss_lines[cached], fetched[cached])
                slot = torch.full((unique.numel(),), -1, dtype=torch.int64, device=self.device)
                slot[miss] = torch.arange(miss.numel(), device=self.device)
                positions = torch.nonzero(~request_hit).reshape(-1)
                rows[positions] = fetched[slot[inverse[positions]]]
            s = self.stats
            s.iterations += 1
            s.requests += ids.numel()
            s.unique += unique.numel()
            s.misses += miss.numel()
            s.hits += unique.numel() - miss.numel()
            s.evictions += evictions
            s.evicted_in_use += evicted_in_use
            self.iteration += 1
            return rows, request_hit

    def snapshot(self) -> dict[str, np.ndarray]:
        """Line metadata in the reference model's terms, for decision-by-decision comparison."""
        records = self.records.cpu().numpy().view(np.uint64)
        return {"tags": self.tags.cpu().numpy().copy(), "reuse": (records >> np.uint64(48)).astype(np.uint16),
                "fresh": (self.flags.cpu().numpy() & 1).astype(bool),
                "static": self.static_score.cpu().numpy().view(np.uint16).copy(),
                "pvp_index": (records & np.uint64((1 << 40) - 1)).astype(np.int64),
                "rr_pointer": self.rr_pointer.cpu().numpy().astype(np.int64)}
