"""Hits first: a device cache serves a request's hits before any other work, so a batch that hits in full costs
one kernel and one read back (issue 43's budget), and only a batch with misses pays for the distinct ids, the
assign and the storage reads. The probe runs where the batch before hit in full: where batches miss (a cache
smaller than the features), it would cost a read back that only says so, and the assign runs at once, its one
read back bringing the counts and the missed ids together.

The kernel (``torch.ops.lsm_gnn.cache_serve_hits``) walks the request as it came, repeats and all: it finds each
id's line, marks it as an assign marks a hit (an idempotent mark, so repeats may race) and copies its row to the
id's position. One read back of three counts then says whether every id hit, whether any was out of range, and
how many distinct ids hit (for the stats). A batch with misses goes on to the assign, which finds its hits again
and marks them the same way, so serving hits first never changes a decision (tests/test_hits_first.py).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from lsm_gnn.cache.state import CacheState
from lsm_gnn.kernels import ops as _ops  # noqa: F401  (registers torch.ops.lsm_gnn)
from lsm_gnn.kernels.row_gather import as_words, word_bytes
from lsm_gnn.kernels.layout import NO_ID

_LAST_STAMP = 2**31 - 1


class Probe(NamedTuple):
    """What serving the hits found: ``hit`` per requested id (its row is in ``rows`` where true)."""

    hit: torch.Tensor
    misses: int        # positions whose id is not cached
    out_of_range: int  # positions whose id is outside [0, num_rows)
    distinct_hits: int


class HitsFirst:
    """The buffers the kernel reuses on every lookup: its counts, and a stamp per line that tells a line's first
    visitor in this lookup (so repeated ids count once)."""

    def __init__(self, num_lines: int, device: torch.device):
        self.touched = torch.zeros(num_lines, dtype=torch.int32, device=device)
        self.counts = torch.zeros(3, dtype=torch.int32, device=device)
        self._stamp = 0
        # Probe only where the last batch hit in full: a batch with misses then costs one read back, not two.
        self.probing = False

    def serve(self, state: CacheState, data: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, num_rows: int,
              iteration: int, scan_base: int, window=None) -> Probe:
        """Serves the hits of ``ids`` into ``rows`` (``[len(ids), dim]`` like ``data``'s lines). ``window``: a
        window's ``(first_iteration, first_position, first_rank, front, limit)`` where hits take their next use
        now (a policy with ``assign_next_use``)."""
        self._stamp += 1
        if self._stamp > _LAST_STAMP:  # every 2**31 lookups: start the stamps again
            self.touched.zero_()
            self._stamp = 1
        hit = torch.empty(ids.numel(), dtype=torch.int8, device=ids.device)
        arrays, front, limit = (None, None, None), 0, 0
        if window is not None:
            *arrays, front, limit = window
        word = word_bytes(data.shape[1] * data.element_size(), data, rows)  # rows move as words of one width
        torch.ops.lsm_gnn.cache_serve_hits(state.tags, state.records, state.flags, state.last_use, self.touched,
                                           self._stamp, state.ways, ids, num_rows, as_words(data, word),
                                           as_words(rows, word), hit, self.counts, iteration, scan_base, *arrays,
                                           front, limit)
        misses, out_of_range, distinct = self.counts.tolist()  # the one read back of an all-hit batch
        return Probe(hit.view(torch.bool), misses, out_of_range, distinct)


def distinct_padded(ids: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch.unique(ids, return_inverse=True)`` without reading its size back: the sorted distinct ids padded
    with ``NO_ID`` to ``len(ids)`` (the assign gives padding no line), the inverse, and ``[their number, the
    smallest id, the largest]`` on the ids' device. Where an id lies outside ``[0, num_rows)`` every entry is
    ``NO_ID``, so the assign changes nothing before the caller reads the range and refuses the batch.
    ``ids`` must not be empty."""
    ordered, order = torch.sort(ids)
    first = torch.ones(ids.numel(), dtype=torch.bool, device=ids.device)  # of each run of equal ids
    torch.ne(ordered[1:], ordered[:-1], out=first[1:])
    rank = torch.cumsum(first, 0) - 1
    unique = torch.full_like(ids, NO_ID)
    unique.scatter_(0, rank, ordered)  # a run's ids all write the same value to its slot
    facts = torch.cat([rank[-1:] + 1, ordered[:1], ordered[-1:]])
    unique.masked_fill_((facts[1] < 0) | (facts[2] >= num_rows), NO_ID)  # (a 0-d mask: no size read)
    inverse = torch.empty_like(rank)
    inverse.scatter_(0, order, rank)
    return unique, inverse, facts
