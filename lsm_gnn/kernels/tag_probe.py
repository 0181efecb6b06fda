"""Which ids a set-associative cache holds, asked of its tags where they live: the read-ahead's miss probe.

One program per block of ids looks each id up in the ways of its set (``csrc/cache/line_state.h``'s set_of),
as the C++ read-ahead's ``held`` does on a host copy of the tags, so that a cache on a GPU never copies its
tag array to the host to find its next batches' misses (:mod:`lsm_gnn.cache.read_ahead`). Programs write
disjoint outputs and read only the tags: no order between them matters.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from lsm_gnn.kernels import layout
from lsm_gnn.kernels.cache_assign import _set_of

INVALID_TAG = tl.constexpr(layout.INVALID_TAG)
#: Elements of a program's [ids, ways] tile of tags (as the assign's _find_hits: they stay in registers).
TILE_ELEMENTS = 4096


@triton.jit
def _held(ids_ptr, n, tags_ptr, num_sets, ways, held_ptr, WAYS_BLOCK: tl.constexpr, BLOCK: tl.constexpr):
    u = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = u < n
    ids = tl.load(ids_ptr + u, mask=valid, other=0)
    way = tl.arange(0, WAYS_BLOCK)
    look = valid[:, None] & (way[None, :] < ways)
    tags = tl.load(tags_ptr + _set_of(ids, num_sets)[:, None] * ways + way[None, :], mask=look, other=INVALID_TAG)
    found = tl.max(((tags == ids[:, None]) & look).to(tl.int8), axis=1)
    tl.store(held_ptr + u, found, mask=valid)


def held(tags: torch.Tensor, ways: int, ids: torch.Tensor) -> torch.Tensor:
    """Whether each of ``ids`` (int64, on the tags' device) is in ``tags`` (int64, whole sets of ``ways``), as a
    bool tensor on that device; one launch, no read back."""
    n = ids.numel()
    out = torch.empty(n, dtype=torch.int8, device=ids.device)
    if n:
        ways_block = triton.next_power_of_2(ways)
        block = max(1, min(128, TILE_ELEMENTS // ways_block))
        _held[(triton.cdiv(n, block),)](ids, n, tags, tags.numel() // ways, ways, out, WAYS_BLOCK=ways_block,
                                        BLOCK=block)
    return out.view(torch.bool)
