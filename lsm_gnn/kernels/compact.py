"""Compaction on the device without a count read back: the positions of an array that a flag marks, ranked in
order, by a scan in two launches (each block's count of flags, then each block's offset summed from the counts
before it). The host never learns how many there are: outputs are sized to the input and padded.

A lookup with misses uses it three times, each in place of 4 to 15 torch ops (with the last gathers' kernel,
46 launches became 14, docs/gpu.md):

- :func:`distinct_ids`: the distinct ids of a request, from its sort: a run's first position is flagged;
- :func:`set_segments`: the assign's misses by set: the first miss of each set starts the segment one
  ``_install_misses`` program walks;
- :func:`pack_misses`: the misses of an assigned batch, with their lines and the batch's counts, in one buffer
  the host reads back at once.

No program waits on another; each writes slots no other writes, so any program order gives the same bytes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from lsm_gnn.kernels import layout

NO_ID = tl.constexpr(layout.NO_ID)
RUN_STARTS = tl.constexpr(0)  # a position whose key differs from the one before it (keys sorted)
ZEROS = tl.constexpr(1)       # a position whose key is 0 (a miss in a hit mask)
#: positions per program, and block counts summed at once when a program finds its offset
BLOCK, CHUNK = 1024, 1024
#: the head of pack_misses' buffer: the assign's 4 counts, then the distinct ids' number, smallest and largest
#: (one more with PVP: the ids its lines serve)
PACKED_HEAD = 7


@triton.jit
def _key(keys_ptr, order_ptr, k, mask, GATHER: tl.constexpr):
    if GATHER:  # keys[order[k]]: sorted by order
        k = tl.load(order_ptr + k, mask=mask, other=0)
    return tl.load(keys_ptr + k, mask=mask, other=0)


@triton.jit
def _flags(keys_ptr, order_ptr, k, n, limit, KIND: tl.constexpr, GATHER: tl.constexpr, LIMITED: tl.constexpr):
    """(key, flag) at positions ``k``; with ``LIMITED`` only keys below ``limit`` are flagged."""
    valid = k < n
    key = _key(keys_ptr, order_ptr, k, valid, GATHER)
    if KIND == RUN_STARTS:
        before = _key(keys_ptr, order_ptr, k - 1, valid & (k > 0), GATHER)
        flag = valid & ((k == 0) | (key != before))
    else:
        flag = valid & (key == 0)
    if LIMITED:
        flag = flag & (key < limit)
    return key, flag


@triton.jit
def _count_flags(keys_ptr, order_ptr, n, limit, block_counts_ptr, KIND: tl.constexpr, GATHER: tl.constexpr,
                 LIMITED: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    k = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    _, flag = _flags(keys_ptr, order_ptr, k, n, limit, KIND, GATHER, LIMITED)
    tl.store(block_counts_ptr + pid, tl.sum(flag.to(tl.int64), axis=0))


@triton.jit
def _ranks(flag, block_counts_ptr, num_blocks, CHUNK: tl.constexpr):
    """(each position's rank among the flagged ones, inclusive, minus one; how many are flagged in all)."""
    pid = tl.program_id(0)
    before = tl.zeros([CHUNK], tl.int64)
    total = tl.zeros([CHUNK], tl.int64)
    for start in range(0, num_blocks, CHUNK):
        b = start + tl.arange(0, CHUNK)
        count = tl.load(block_counts_ptr + b, mask=b < num_blocks, other=0)
        before += tl.where(b < pid, count, 0)
        total += count
    rank = tl.sum(before, axis=0) + tl.cumsum(flag.to(tl.int64), axis=0) - 1
    return rank, tl.sum(total, axis=0)


@triton.jit
def _write_distinct(ordered_ptr, order_ptr, n, num_rows, block_counts_ptr, num_blocks, unique_ptr, inverse_ptr,
                    facts_ptr, BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    pid = tl.program_id(0)
    k = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = k < n
    key, first = _flags(ordered_ptr, order_ptr, k, n, 0, RUN_STARTS, False, False)
    rank, total = _ranks(first, block_counts_ptr, num_blocks, CHUNK)
    # The smallest and largest id in every lane (a vector: the interpreter cannot mask with a scalar's test).
    low = tl.load(ordered_ptr + k * 0)
    high = tl.load(ordered_ptr + n - 1 + k * 0)
    inside = (low >= 0) & (high < num_rows)  # else the batch is refused: no id may take a line
    tl.store(unique_ptr + rank, key, mask=first & inside)
    tl.store(unique_ptr + k, tl.full([BLOCK], NO_ID, tl.int64), mask=valid & ((k >= total) | ~inside))
    tl.store(inverse_ptr + tl.load(order_ptr + k, mask=valid, other=0), rank, mask=valid)
    if pid == 0:
        tl.store(facts_ptr + 0, total)
        tl.store(facts_ptr + 1, tl.min(low, axis=0))
        tl.store(facts_ptr + 2, tl.max(high, axis=0))


@triton.jit
def _write_segments(by_set_ptr, order_ptr, n, num_sets, block_counts_ptr, num_blocks, sorted_sets_ptr,
                    seg_start_ptr, BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    pid = tl.program_id(0)
    k = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = k < n
    key, start = _flags(by_set_ptr, order_ptr, k, n, num_sets, RUN_STARTS, True, True)
    rank, total = _ranks(start, block_counts_ptr, num_blocks, CHUNK)
    tl.store(sorted_sets_ptr + k, key, mask=valid)
    tl.store(seg_start_ptr + rank, k, mask=start)
    tl.store(seg_start_ptr + k, tl.zeros_like(k) + n, mask=valid & (k >= total))


@triton.jit
def _write_misses(hit_ptr, n, unique_ptr, line_ptr, counts_ptr, facts_ptr, block_counts_ptr, num_blocks,
                  packed_ptr, miss_ptr, HEAD: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    pid = tl.program_id(0)
    k = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    _, miss = _flags(hit_ptr, hit_ptr, k, n, 0, ZEROS, False, False)
    rank, _ = _ranks(miss, block_counts_ptr, num_blocks, CHUNK)
    tl.store(packed_ptr + HEAD + rank, tl.load(unique_ptr + k, mask=miss), mask=miss)
    tl.store(packed_ptr + HEAD + n + rank, tl.load(line_ptr + k, mask=miss), mask=miss)
    tl.store(miss_ptr + rank, k, mask=miss)
    if pid == 0:
        head = tl.arange(0, 8)
        four = head < 4
        values = tl.where(four, tl.load(counts_ptr + head, mask=four, other=0),
                          tl.load(facts_ptr + head - 4, mask=~four & (head < HEAD), other=0))
        tl.store(packed_ptr + head, values, mask=head < HEAD)


def _block_counts(keys, order, n: int, limit: int, kind: int, gather: bool, limited: bool):
    grid = triton.cdiv(n, BLOCK)
    counts = torch.empty(grid, dtype=torch.int64, device=keys.device)
    _count_flags[(grid,)](keys, order, n, limit, counts, KIND=kind, GATHER=gather, LIMITED=limited, BLOCK=BLOCK)
    return counts, grid


def distinct_ids(ids: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the sorted distinct ids padded with ``NO_ID`` to ``len(ids)``, the inverse, int64 ``[their number, the
    smallest id, the largest]``), all on the ids' device; every entry ``NO_ID`` where an id lies outside
    ``[0, num_rows)``. ``ids`` (int64) must not be empty."""
    from lsm_gnn.kernels.ops import check_distinct_ids_input

    check_distinct_ids_input(ids)
    n = ids.numel()
    ordered, order = torch.sort(ids)
    counts, grid = _block_counts(ordered, order, n, 0, 0, False, False)
    unique, inverse = torch.empty(n, dtype=torch.int64, device=ids.device), torch.empty_like(order)
    facts = torch.empty(3, dtype=torch.int64, device=ids.device)
    _write_distinct[(grid,)](ordered, order, n, num_rows, counts, grid, unique, inverse, facts, BLOCK=BLOCK,
                             CHUNK=CHUNK)
    return unique, inverse, facts


def set_segments(by_set: torch.Tensor, order: torch.Tensor, num_sets: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(``by_set[order]``, the segment starts): where ``by_set[order]`` is sorted, ``starts[i]`` is the position
    of the i-th distinct key below ``num_sets`` (in order) and ``len(by_set)`` after the last."""
    n = by_set.numel()
    counts, grid = _block_counts(by_set, order, n, num_sets, 0, True, True)
    sorted_sets, starts = torch.empty_like(by_set), torch.empty_like(order)
    _write_segments[(grid,)](by_set, order, n, num_sets, counts, grid, sorted_sets, starts, BLOCK=BLOCK, CHUNK=CHUNK)
    return sorted_sets, starts


def pack_misses(hit: torch.Tensor, unique: torch.Tensor, line: torch.Tensor, counts: torch.Tensor,
                facts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The misses of an assigned batch (``hit`` a bool mask over the distinct ``unique``) packed for one read
    back: int64 ``[counts (4), facts (3 or 4), the missed ids (n), their lines (n)]``, each list's first entries
    the misses in order (the rest unwritten), and the misses' positions in ``unique`` (first entries). (The
    facts: the distinct ids' number, smallest and largest, and with PVP the ids its lines serve.)"""
    n, head = hit.numel(), packed_head(counts, facts)
    packed = torch.empty(head + 2 * n, dtype=torch.int64, device=hit.device)
    position = torch.empty(n, dtype=torch.int64, device=hit.device)
    if n == 0:
        packed[:head] = torch.cat([counts, facts])
        return packed, position
    hit8 = hit.view(torch.int8)
    block_counts, grid = _block_counts(hit8, hit8, n, 0, 1, False, False)
    _write_misses[(grid,)](hit8, n, unique, line, counts, facts, block_counts, grid, packed, position,
                           HEAD=head, BLOCK=BLOCK, CHUNK=CHUNK)
    return packed, position


def packed_head(counts: torch.Tensor, facts: torch.Tensor) -> int:
    """The length of :func:`pack_misses`' head: the assign's 4 counts and 3 or 4 facts."""
    if counts.numel() != 4 or facts.numel() not in (3, 4):
        raise ValueError(f"pack_misses takes the assign's 4 counts and 3 or 4 facts, got {counts.numel()} and "
                         f"{facts.numel()}")
    return PACKED_HEAD + facts.numel() - 3
