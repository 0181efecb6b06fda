"""PVP enqueue in Triton: a batch's victims join the victim queue of their next use.

The same decisions as ``csrc/cache/victim_buffer.cpp`` (``_C.victim_enqueue``):
a victim with no known reuse inside the window is dropped; otherwise it
claims the next slot of the queue of iteration ``scan_base + reuse``, and a
full queue drops it. Claims go in entry order (ascending node id), so which
victims a full queue keeps does not depend on scheduling: each victim's
slot is its queue's count plus its rank among that queue's victims of the
batch: the victims of the same queue before it in its block, plus those of
the blocks before (a running sum of per-block counts). Four launches and no
read back: each block's victims per queue, their running sum, the copies of
the claimed lines, and one program that advances the counts and adds the
outcomes to ``tallies``. No program waits on another, and no atomic decides
who gets a slot.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from lsm_gnn.kernels import layout

INVALID_TAG = tl.constexpr(layout.INVALID_TAG)
NO_REUSE = tl.constexpr(layout.NO_REUSE)
REUSE_SHIFT = tl.constexpr(layout.REUSE_SHIFT)


@triton.jit
def _victim_queues(tag_ptr, record_ptr, queue_iteration_ptr, queue_ptr, block_counts_ptr, n, num_queues, iteration,
                   scan_base, BLOCK: tl.constexpr, QUEUES: tl.constexpr):
    """victim_buffer.h's victim_queue for each entry: its queue, -1 (no reuse) or -2 (no victim); and the block's
    row of counts: its victims per queue, then (column ``num_queues``) those without a next use."""
    pid = tl.program_id(0)
    u = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = u < n
    tag = tl.load(tag_ptr + u, mask=valid, other=INVALID_TAG)
    reuse = (tl.load(record_ptr + u, mask=valid, other=0).to(tl.uint64) >> REUSE_SHIFT).to(tl.int64)
    target = scan_base + reuse
    window = num_queues - 1
    in_window = (reuse != NO_REUSE) & (target > iteration) & (target <= iteration + window)
    queue = target % num_queues
    collects = tl.load(queue_iteration_ptr + tl.where(in_window, queue, 0), mask=valid & in_window, other=-1)
    queue = tl.where(in_window & (collects == target), queue, -1)
    queue = tl.where(tag == INVALID_TAG, -2, queue)
    tl.store(queue_ptr + u, queue, mask=valid)
    column = tl.arange(0, QUEUES)  # queue q's victims, and in column num_queues the dropped ones
    key = tl.where(queue == -1, num_queues, queue)
    per_queue = tl.sum(((key[:, None] == column[None, :]) & valid[:, None]).to(tl.int64), axis=0)
    tl.store(block_counts_ptr + pid * (num_queues + 1) + column, per_queue, mask=column <= num_queues)


@triton.jit
def _copy_victims(queue_ptr, block_counts_ptr, running_ptr, count_ptr, evicted_line_ptr, tag_ptr, record_ptr,
                  cache_data_ptr, node_ptr, queue_record_ptr, queue_data_ptr, n, num_queues, capacity, dim,
                  BLOCK: tl.constexpr, DIM_BLOCK: tl.constexpr):
    """Each victim's slot: its queue's count, plus the victims of its queue in the blocks before its own (the
    running sum less its block's count) and before it in its block; a slot inside the queue takes the line's
    row, node and record."""
    pid = tl.program_id(0)
    u = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = u < n
    queue = tl.load(queue_ptr + u, mask=valid, other=-2)
    claiming = valid & (queue >= 0)
    q = tl.where(claiming, queue, 0)
    row = pid * (num_queues + 1) + q
    before = tl.load(running_ptr + row, mask=claiming, other=0) - tl.load(block_counts_ptr + row, mask=claiming,
                                                                           other=0)
    k = tl.arange(0, BLOCK)
    earlier = (queue[:, None] == queue[None, :]) & (k[None, :] < k[:, None])  # same queue, earlier entry
    within = tl.sum(earlier.to(tl.int64), axis=1)
    position = tl.load(count_ptr + q, mask=claiming, other=0) + before + within
    kept = claiming & (position < capacity)
    slot = q * capacity + position
    line = tl.load(evicted_line_ptr + u, mask=kept, other=0)
    tl.store(node_ptr + slot, tl.load(tag_ptr + u, mask=kept, other=0), mask=kept)
    tl.store(queue_record_ptr + slot, tl.load(record_ptr + u, mask=kept, other=0), mask=kept)
    for start in range(0, dim, DIM_BLOCK):
        cols = start + tl.arange(0, DIM_BLOCK)
        mask = kept[:, None] & (cols[None, :] < dim)
        values = tl.load(cache_data_ptr + line[:, None] * dim + cols[None, :], mask=mask, other=0)
        tl.store(queue_data_ptr + slot[:, None] * dim + cols[None, :], values, mask=mask)


@triton.jit
def _advance_counts(running_ptr, count_ptr, tallies_ptr, last_row, num_queues, capacity, QUEUES: tl.constexpr):
    """One program, after the copies: each queue's count advanced by the victims it kept, and ``tallies``
    (enqueued, dropped without a next use, dropped by a full queue) by the batch's outcomes."""
    column = tl.arange(0, QUEUES)
    is_queue = column < num_queues
    totals = tl.load(running_ptr + last_row * (num_queues + 1) + column, mask=column <= num_queues, other=0)
    total = tl.where(is_queue, totals, 0)
    count = tl.load(count_ptr + column, mask=is_queue, other=0)
    kept = tl.minimum(total, tl.maximum(capacity - count, 0))
    tl.store(count_ptr + column, count + kept, mask=is_queue)
    no_reuse = tl.sum(tl.where(column == num_queues, totals, 0), axis=0)
    tl.store(tallies_ptr + 0, tl.load(tallies_ptr + 0) + tl.sum(kept, axis=0))
    tl.store(tallies_ptr + 1, tl.load(tallies_ptr + 1) + no_reuse)
    tl.store(tallies_ptr + 2, tl.load(tallies_ptr + 2) + tl.sum(total - kept, axis=0))


def victim_enqueue(count, queue_iteration, node, record, data, evicted_tag, evicted_record, evicted_line,
                   cache_data, iteration: int, scan_base: int, tallies, check: bool = True, block: int = 64) -> None:
    """Triton twin of ``lsm_gnn::victim_enqueue`` (same arguments and state changes): ``tallies`` (int64
    ``[enqueued, dropped_no_reuse, dropped_full]``) gains the batch's outcomes. ``check``: refuse an evicted
    line outside the cache (one read back); the cache, whose assign kernel made the lines, passes False."""
    from lsm_gnn.kernels.ops import check_tallies

    check_tallies(tallies, count)
    n = evicted_tag.numel()
    num_queues, capacity = node.shape
    if n == 0:
        return
    lines = cache_data.shape[0]
    if check and bool(((evicted_tag != layout.INVALID_TAG) & ((evicted_line < 0) | (evicted_line >= lines))).any()):
        raise ValueError("evicted_line names a line outside the cache")
    device = evicted_tag.device
    grid = triton.cdiv(n, block)
    queues = triton.next_power_of_2(num_queues + 1)
    queue = torch.empty(n, dtype=torch.int64, device=device)
    block_counts = torch.empty((grid, num_queues + 1), dtype=torch.int64, device=device)
    _victim_queues[(grid,)](evicted_tag, evicted_record, queue_iteration, queue, block_counts, n, num_queues,
                            iteration, scan_base, BLOCK=block, QUEUES=queues)
    running = torch.cumsum(block_counts, 0)
    dim = data.shape[-1]
    _copy_victims[(grid,)](queue, block_counts, running, count, evicted_line, evicted_tag, evicted_record,
                           cache_data, node.view(-1), record.view(-1), data.view(-1, dim), n, num_queues, capacity,
                           dim, BLOCK=block, DIM_BLOCK=min(triton.next_power_of_2(max(dim, 1)), 128))
    _advance_counts[(1,)](running, count, tallies, grid - 1, num_queues, capacity, QUEUES=queues)
