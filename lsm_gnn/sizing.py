"""Sizing the cache before training: the largest batch, estimated from sampled batches, against its lines.

A cache refuses a batch with more distinct ids than it has lines
(:class:`~lsm_gnn.cache.CacheTooSmall`). Found by the first such batch, that
costs a start-up (the loader samples its whole window first) and names the
size of that one batch, which the next one exceeds. So before any training
the trainer samples a few batches of the first epoch, on every rank, exactly
as training will (:meth:`~lsm_gnn.loader.NodeLoader.sample_input_nodes`),
and :func:`cache_fits` finds what each cache must hold:

- a cache of its own (one rank, or ``cache.mode=isolated``): the distinct
  ids of a batch;
- a rank's slice of a shared cache: the distinct ids all ranks' batches of
  one iteration ask of its owner (the slice serves their union);
- a dataset's feature caches (one per row format, :func:`store_fits`): the ids
  of their node types.

Only the count matters, not how ids fall into sets: a batch that overflows
one 32-way set while the cache has lines enough is served exactly (its
later misses take lines an earlier miss of the batch took; docs/cache.md).
Batches of one epoch vary by a few percent, so a suggested capacity holds
:data:`~lsm_gnn.cache.geometry.HEADROOM` times the largest, in the
unit the user gave (a share of the nodes, or bytes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from lsm_gnn.cache.geometry import HEADROOM
from lsm_gnn.config import ConfigError, capacity_spec
from lsm_gnn.features import TypedFeatures
from lsm_gnn.utils.units import round_up, suggest_bytes

#: batches sampled before training, all ranks together (at least MIN_PER_RANK on each)
SAMPLED_BATCHES = 16
MIN_PER_RANK = 4


def batches_per_rank(world_size: int) -> int:
    return max(MIN_PER_RANK, math.ceil(SAMPLED_BATCHES / world_size))


@dataclass(frozen=True)
class CacheFit:
    """One cache against the sampled batches."""

    what: str      # which cache, for a message: "the cache", "each rank's cache slice", "the cache of paper"
    lines: int     # its lines (a rank's slice: that slice's)
    largest: int   # the most distinct ids one sampled batch (one iteration of all ranks, when shared) asks of it
    sampled: int   # batches sampled on each rank

    @property
    def fits(self) -> bool:
        return self.largest <= self.lines

    @property
    def asks(self) -> str:
        """The verb of a message: a slice is asked for the ids (by every rank), a cache's batch has them."""
        return "asks one owner for" if "slice" in self.what else "has"

    def describe(self) -> str:
        return (f"{_sampled(self.sampled)} sampled {self.asks} {self.largest:,} distinct nodes; "
                f"{self.what} holds {self.lines:,} lines ({self.lines / max(self.largest, 1):.2f}x)")


def store_fits(features: TypedFeatures, batches: list[list], label=lambda types: "+".join(types)) -> list[CacheFit]:
    """Each feature group's cache of ``features`` against ``batches[rank][i]``, the input nodes per node type of
    sampled batch ``i`` on each rank. A group's cache is "the cache of <label(types)>", or "the cache" where
    ``label`` gives None (a graph of one node type's one cache, :func:`lsm_gnn.build.cache_label`)."""
    fits = []
    for g, group in enumerate(features.groups):
        ids = [[features.group_ids(nodes)[g] for nodes in per_rank] for per_rank in batches]
        name = label(group.types)
        fits += cache_fits(group.features, ids, "the cache" if name is None else f"the cache of {name}")
    return fits


def cache_fits(features, batches: list[list], what: str = "the cache") -> list[CacheFit]:
    """The cache of one source ``features`` against ``batches[rank][i]``, the ids (``torch`` or numpy) of
    sampled batch ``i`` on each rank. A source without a cache gives no entry; a cache shared by ranks is judged
    by its slices (``owner``)."""
    sampled = len(batches[0]) if batches else 0
    if features.cache_lines is None:
        return []
    if features.owner is not None:
        largest = 0
        for i in range(sampled):  # an owner serves the union of what every rank asks of it in one iteration
            ids = np.unique(np.concatenate([_ids(per_rank[i]) for per_rank in batches]))
            largest = max(largest, int(np.bincount(features.owner(ids), minlength=1).max(initial=0)))
        slice_what = "each rank's cache slice" if what == "the cache" else f"each rank's slice of {what[4:]}"
        return [CacheFit(slice_what, features.cache_lines, largest, sampled)]
    largest = max((np.unique(_ids(b)).size for per_rank in batches for b in per_rank), default=0)
    return [CacheFit(what, features.cache_lines, int(largest), sampled)]


def _ids(nodes) -> np.ndarray:
    return nodes.cpu().numpy() if isinstance(nodes, torch.Tensor) else np.asarray(nodes)


def suggested_capacity(capacity: str, lines: int, distinct: int, ways: int, headroom: float = HEADROOM) -> str:
    """A capacity, in the unit of ``capacity`` (the one that gives ``lines``), whose cache holds ``headroom``
    times ``distinct`` lines: lines grow with the capacity, in whole sets of ``ways``."""
    kind, value = capacity_spec(capacity)
    # Lines come in whole sets (rounded down), a share's rows to the nearest row: a row more than whole sets.
    scale = (math.ceil(distinct * headroom / ways) * ways + 1) / max(lines, 1)
    if kind == "share":
        return f"{min(100.0, round_up(100 * value * scale)):g}%"
    return suggest_bytes(value * scale)


def config_fix(capacity: str, lines: int, distinct: int, ways: int, key: str = "cache.capacity") -> str:
    """What to set, in config keys (``key``: ``cache.capacity``), for a cache of ``lines`` to take ``distinct``
    ids."""
    suggested = suggested_capacity(capacity, lines, distinct, ways)
    size = f"{suggested} (every node)" if suggested == "100%" else f"{suggested} or more ({HEADROOM:g}x that batch: " \
        "batches vary)"
    return (f"set {key}={size}, or cache.oversubscribe=true to run a cache smaller than a batch anyway "
            "(it thrashes)")


def batch_rows_bound(seeds: int, fanouts: dict) -> int | None:
    """The most distinct input nodes a batch of ``seeds`` seed nodes can have, whatever the graph: each hop adds at
    most its fanout of neighbours per node it expands for each relation (``fanouts``, per relation), so
    ``seeds x prod(1 + sum of the hop's fanouts)``; None with a fanout of -1 (every neighbour: no bound but the
    graph's)."""
    layers = list(zip(*fanouts.values()))
    rows = seeds
    for layer in layers:
        if any(f < 0 for f in layer):
            return None
        rows *= 1 + sum(layer)
    return rows


def working_set_bound(cfg, dataset) -> int | None:
    """The most distinct input nodes any batch of ``cfg``'s run can have, training's or an evaluation's (None:
    no bound but the graph's): what a cache that must never refuse a batch holds (a link batch's seeds are its
    users, positive items and negatives)."""
    from lsm_gnn.tasks.options import eval_batch_size, eval_fanouts, relation_fanouts

    fanouts = relation_fanouts(cfg, dataset)
    per_edge = 2 + cfg.train.num_negatives if cfg.train.task == "link" else 1
    bounds = [batch_rows_bound(cfg.sampler.batch_size * per_edge, fanouts)]
    if cfg.train.eval_splits:
        bounds.append(batch_rows_bound(eval_batch_size(cfg), eval_fanouts(cfg, fanouts)))
    return None if None in bounds else max(bounds)


def smaller_batch(batch_size: int, lines: int, distinct: int, headroom: float = HEADROOM) -> int:
    """A batch size whose batches a cache of ``lines`` holds, where batches of ``batch_size`` seeds had ``distinct``
    ids: in proportion, with ``headroom`` (a batch's ids grow a little faster than in proportion as it shrinks:
    fewer of them repeat), rounded down to two significant digits; at least 1."""
    size = batch_size * lines / (max(distinct, 1) * headroom)
    if size < 1:
        return 1
    step = 10 ** max(len(str(int(size))) - 2, 0)
    return max(1, int(size) // step * step)


def set_at_least(capacity: str, key: str, lines: int, need: int, row_bytes: int) -> str:
    """``set KEY=VALUE or more``: the value of config key ``key`` (now ``capacity``, ``lines`` lines of
    ``row_bytes``) whose cache has ``need`` lines (one set), in its unit; bytes where 0 cannot be scaled up."""
    value = suggested_capacity(capacity, lines, need, 1, headroom=1) if lines else suggest_bytes(need * row_bytes)
    return f"set {key}={value} or more"


def _sampled(count: int) -> str:
    return "the one batch" if count == 1 else f"the largest of {count} batches"


def too_small_message(fit: CacheFit, capacity: str, ways: int, key: str = "cache.capacity") -> str:
    """The fail-fast message of a cache that sampled batches do not fit (its size is config key ``key``)."""
    return (f"{key}={capacity} gives {fit.what} {fit.lines:,} lines, but {_sampled(fit.sampled)} "
            f"sampled before training {fit.asks} {fit.largest:,} distinct nodes; "
            + config_fix(capacity, fit.lines, fit.largest, ways, key))
