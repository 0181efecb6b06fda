"""The window scan in Triton: every valid cache line's PVP record from the window's first occurrences.

The same result as ``csrc/cache/cpu_cache.cpp``'s ``scan`` (``_C.cache_scan``): a line holding node
``v`` gets ``line_state.h``'s ``first_record`` of ``v`` (reuse counted from 1 for iteration ``front``,
occurrences beyond ``limit`` batches are no reuse) and loses its fresh mark; invalid lines are left
alone. One program per block of lines; no program reads what another writes. The per-node arrays are the
window index's: first iteration (int32, counted from the index's base, as ``front`` is; -1: none),
position (int32) and rank (uint8).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from lsm_gnn.kernels import layout

INVALID_TAG = tl.constexpr(layout.INVALID_TAG)
NO_REUSE_RECORD = tl.constexpr(layout.NO_REUSE_RECORD)
REUSE_SHIFT = tl.constexpr(layout.REUSE_SHIFT)
RANK_SHIFT = tl.constexpr(layout.RANK_SHIFT)
INDEX_MASK = tl.constexpr(layout.INDEX_MASK)
NOT_FRESH = tl.constexpr(0xFF & ~layout.FRESH)


@triton.jit
def _scan(tags_ptr, records_ptr, flags_ptr, first_iteration_ptr, first_position_ptr, first_rank_ptr, lines,
          num_nodes, front, limit, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_cache = i < lines
    tag = tl.load(tags_ptr + i, mask=in_cache, other=INVALID_TAG)
    valid = in_cache & (tag != INVALID_TAG)
    known = valid & (tag >= 0) & (tag < num_nodes)  # a tag outside the window's nodes has no reuse
    node = tl.where(known, tag, 0)
    iteration = tl.load(first_iteration_ptr + node, mask=known, other=-1).to(tl.int64)
    position = tl.load(first_position_ptr + node, mask=known, other=0).to(tl.int64)
    rank = tl.load(first_rank_ptr + node, mask=known, other=0).to(tl.int64)
    reuse = iteration - front + 1
    reused = (iteration >= 0) & (reuse <= limit)
    # Shifts on int64 keep the record's bits; the top 16 (the reuse) may set the sign bit.
    record = (reuse << REUSE_SHIFT) | ((rank & 0xFF) << RANK_SHIFT) | (position & INDEX_MASK)
    record = tl.where(reused, record, NO_REUSE_RECORD)
    tl.store(records_ptr + i, record, mask=valid)
    flags = tl.load(flags_ptr + i, mask=valid, other=0)
    tl.store(flags_ptr + i, flags & NOT_FRESH, mask=valid)


def cache_scan(tags: torch.Tensor, records: torch.Tensor, flags: torch.Tensor, first_iteration: torch.Tensor,
               first_position: torch.Tensor, first_rank: torch.Tensor, front: int, limit: int,
               block: int = 1024) -> None:
    """Triton twin of ``_C.cache_scan`` (same arguments, same state changes); all tensors on one device."""
    lines = tags.numel()
    num_nodes = first_iteration.numel()
    if first_position.numel() != num_nodes or first_rank.numel() != num_nodes:
        raise ValueError("first_iteration, first_position and first_rank must have one entry per node")
    per_node = (("first_iteration", first_iteration, torch.int32), ("first_position", first_position, torch.int32),
                ("first_rank", first_rank, torch.uint8))
    for name, array, dtype in per_node:
        if array.dtype != dtype:
            raise TypeError(f"{name} must be {dtype} (a window index's array, WindowBuffer.first_occurrence), "
                            f"got {array.dtype}")
    if records.numel() != lines or flags.numel() != lines:
        raise ValueError("tags, records and flags must have one entry per cache line")
    if lines == 0:
        return
    _scan[(triton.cdiv(lines, block),)](tags, records, flags, first_iteration, first_position, first_rank, lines,
                                        num_nodes, front, limit, BLOCK=block)
