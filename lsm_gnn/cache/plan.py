"""One lookup as named stages over a per-batch plan: the contract :class:`~lsm_gnn.cache.SoftwareCache` and the
reference model (:class:`~lsm_gnn.cache.ReferenceCache`) share, so tests can compare them stage by stage.

Each cache has a method ``_<stage>`` per name of :data:`STAGES`; ``_begin(ids, future, ...)`` returns the
batch's plan, every later stage takes it, fills in its own fields and ``_account`` returns the lookup's
``(rows, hit mask)``:

  begin          validate the ids, find the distinct ones, take the lines the victim buffer prefetched for
                 this iteration; serving hits first (a device cache, lsm_gnn.cache.hits_first), the window
                 scan when due and every hit's row first: a batch that hit in full is served here
  before_assign  the victim buffer's work before the cache decides: in the paper's PVP mode the ids a
                 prefetched line serves are matched and left out of what the cache sees
  assign         the window scan when due, then hits, victims and installs of the ids the cache sees; serving
                 hits first, the victim buffer's part of evict and after_assign that needs no host (victims
                 parked, prefetched lines matched to the misses) before the one read back
  evict          dirty victims written back, then victims parked in the victim buffer: both before any
                 new row overwrites their lines
  after_assign   back to every distinct id of the batch; hit rows out where a later miss took their line;
                 reinstalling PVP, the prefetched rows into the new lines of the ids they serve
  fill           storage reads of the misses (into their lines, or apart where they have none), the rows in
                 request order, the prefetched rows to their positions
  account        counters, the iteration, the hit mask

The plan of :class:`SoftwareCache` is :class:`LookupPlan` (tensors on the cache's device); the reference
model keeps its own, in numpy and Python.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

STAGES = ("begin", "before_assign", "assign", "evict", "after_assign", "fill", "account")


@dataclass(eq=False)
class LookupPlan:
    """One batch on its way through :meth:`SoftwareCache.lookup`; the stage named first fills each field."""

    # begin
    t: int                       # the iteration this batch is
    ids: torch.Tensor            # the request, on the cache's device
    unique: torch.Tensor | None  # its sorted distinct ids (None: served)
    inverse: torch.Tensor | None  # ids == unique[inverse]
    future: object               # the window of upcoming batches, as lookup got it
    out: torch.Tensor | None     # where the rows go, if the caller gave a tensor
    cache_ids: torch.Tensor | None  # the distinct ids the cache sees: all, unless PVP bypasses some
    prefetched: tuple | None = None  # PVP: (node, record, rows) of the lines prefetched for t
    window: tuple | None = None  # the future's first occurrences, where a scan or the policy reads them
    scan_due: bool = False       # the window scan is due at assign
    served: bool = False         # serving hits first, every id hit: rows and request_hit are final
    num_unique: int = 0          # served: its distinct ids
    num_distinct: torch.Tensor | None = None  # serving hits first: unique is padded, its count on the device
    distinct_at_most: int = 0    # and at most the distinct ids that hit plus the positions that missed
    # assign, serving hits first with PVP (before its one read back)
    claimed: bool = False        # victims parked and prefetched lines matched; pvp_hits set by the read back
    # before_assign (the paper's PVP mode)
    keep: torch.Tensor | None = None      # where some ids bypass the cache: the positions of cache_ids in unique
    # assign
    done: object = None                   # the Assignment of cache_ids (lsm_gnn.cache.state)
    line: torch.Tensor | None = None      # per id of cache_ids, after after_assign per distinct id: its line
    hit: torch.Tensor | None = None       # and whether it was cached already
    # after_assign
    one_gather: bool = True               # no line this batch uses was evicted: one gather serves every id
    request_hit: torch.Tensor | None = None  # per requested id: its id was cached (set with the rows' gather)
    rows: torch.Tensor | None = None      # the rows, in request order
    from_pvp: torch.Tensor | None = None  # per distinct id: served from the victim buffer (None: none is);
    entry: torch.Tensor | None = None     # its line among the prefetched rows (the paper's mode: before_assign)
    # fill
    miss: torch.Tensor | None = None      # the distinct ids read from storage (their positions in unique)
    miss_ids: torch.Tensor | None = None  # their ids, on the host
    miss_cached: torch.Tensor | None = None  # whether each got a line, on the host (serving hits first)
    miss_lines: torch.Tensor | None = None   # and their lines, on the device (serving hits first)
    pvp_hits: int = 0                     # distinct ids served from the victim buffer
