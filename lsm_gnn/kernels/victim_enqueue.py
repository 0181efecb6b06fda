"""PVP enqueue in Triton: a batch's victims join the victim queue of their next use.

The same decisions as ``csrc/cache/victim_buffer.cpp`` (``_C.victim_enqueue``):
a victim with no known reuse inside the window is dropped; otherwise it
claims the next slot of the queue of iteration ``scan_base + reuse``, and a
full queue drops it. Claims go in entry order (ascending node id), so which
victims a full queue keeps does not depend on scheduling: each victim's
slot is its queue's count plus its rank among that queue's victims of the
batch (a stable sort by queue), computed with torch ops on the device, then
one kernel copies every claimed line's row, node and record into its slot.
No program waits on another, and no atomic decides who gets a slot.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from lsm_gnn.kernels import layout

INVALID_TAG = tl.constexpr(layout.INVALID_TAG)
NO_REUSE = tl.constexpr(layout.NO_REUSE)
REUSE_SHIFT = tl.constexpr(layout.REUSE_SHIFT)
_NOT_A_VICTIM = -2  # the entry evicted nothing
_NO_REUSE = -1      # evicted, but no next use in the window: dropped


@triton.jit
def _victim_queues(tag_ptr, record_ptr, queue_iteration_ptr, queue_ptr, n, num_queues, iteration, scan_base,
                   BLOCK: tl.constexpr):
    """victim_buffer.h's victim_queue for each entry: its queue, -1 (no reuse) or -2 (no victim)."""
    u = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
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


@triton.jit
def _copy_victims(line_ptr, slot_ptr, entry_ptr, tag_ptr, record_ptr, cache_data_ptr, node_ptr, queue_record_ptr,
                  queue_data_ptr, m, dim, BLOCK: tl.constexpr, DIM_BLOCK: tl.constexpr):
    """Copies claimed victims' rows (and node, record) from their cache line into their queue slot."""
    k = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = k < m
    line = tl.load(line_ptr + k, mask=valid, other=0)
    slot = tl.load(slot_ptr + k, mask=valid, other=0)
    entry = tl.load(entry_ptr + k, mask=valid, other=0)
    tl.store(node_ptr + slot, tl.load(tag_ptr + entry, mask=valid, other=0), mask=valid)
    tl.store(queue_record_ptr + slot, tl.load(record_ptr + entry, mask=valid, other=0), mask=valid)
    for start in range(0, dim, DIM_BLOCK):
        cols = start + tl.arange(0, DIM_BLOCK)
        mask = valid[:, None] & (cols[None, :] < dim)
        row = tl.load(cache_data_ptr + line[:, None] * dim + cols[None, :], mask=mask, other=0)
        tl.store(queue_data_ptr + slot[:, None] * dim + cols[None, :], row, mask=mask)


def victim_enqueue(count, queue_iteration, node, record, data, evicted_tag, evicted_record, evicted_line,
                   cache_data, iteration: int, scan_base: int, block: int = 64) -> tuple[int, int, int]:
    """Triton twin of ``_C.victim_enqueue`` (same arguments and state changes):
    ``(enqueued, dropped_no_reuse, dropped_full)``."""
    n = evicted_tag.numel()
    num_queues, capacity = node.shape
    if n == 0:
        return 0, 0, 0
    lines = cache_data.shape[0]
    victims = evicted_tag != layout.INVALID_TAG
    if bool(((evicted_line < 0) | (evicted_line >= lines))[victims].any()):
        raise ValueError("evicted_line names a line outside the cache")
    queue = torch.empty(n, dtype=torch.int64, device=evicted_tag.device)
    _victim_queues[(triton.cdiv(n, block),)](evicted_tag, evicted_record, queue_iteration, queue, n, num_queues,
                                             iteration, scan_base, BLOCK=block)
    no_reuse = int((queue == _NO_REUSE).sum())
    claiming = torch.nonzero(queue >= 0).reshape(-1)  # ascending entries: the claim order
    if claiming.numel() == 0:
        return 0, no_reuse, 0
    by_queue = torch.argsort(queue[claiming], stable=True)
    entries, queues = claiming[by_queue], queue[claiming][by_queue]
    _, per_queue = torch.unique_consecutive(queues, return_counts=True)
    first = torch.repeat_interleave(torch.cumsum(per_queue, 0) - per_queue, per_queue)
    position = count[queues] + torch.arange(entries.numel(), device=queues.device) - first
    kept = position < capacity
    full = int((~kept).sum())
    entries, queues, position = entries[kept], queues[kept], position[kept]
    m = entries.numel()
    if m:
        slots = queues * capacity + position
        dim = data.shape[-1]
        _copy_victims[(triton.cdiv(m, block),)](
            evicted_line[entries], slots, entries, evicted_tag, evicted_record, cache_data, node.view(-1),
            record.view(-1), data.view(-1, dim), m, dim, BLOCK=block,
            DIM_BLOCK=min(triton.next_power_of_2(dim), 128))
        count.index_add_(0, queues, torch.ones_like(queues))
    return m, no_reuse, full
