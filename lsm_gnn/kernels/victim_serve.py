"""PVP serve and scatter in Triton: the prefetched lines that serve a batch, and their rows written out.

The same results as the torch ops of :mod:`lsm_gnn.cache.pvp` (``match_prefetched``, ``scatter_prefetched``).
Serve: a prefetched line is valid if its record's index ``p`` is inside the batch and ``ids[p]`` is its
node; of several valid lines for one distinct id the first (lowest entry) serves. Each valid line claims
its distinct id with an atomic min of its entry; the minimum does not depend on the order programs run
in, so the winner is deterministic, and a second kernel, launched after the first, reads the claims.
Scatter: one kernel copies the served rows to every request position of their id, and again into the
ids' new cache lines when reinstalling. Fill (reinstalling, after the cache's assign): the match, then
the rows of the served ids the cache missed into their new lines only. No program waits on another; bad
indices raise through a flag tensor (the interpreter skips device asserts).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from lsm_gnn.kernels import layout

INDEX_MASK = tl.constexpr(layout.INDEX_MASK)


@triton.jit
def _claim_first_line(ids_ptr, inverse_ptr, node_ptr, record_ptr, claim_ptr, error_ptr, num_lines, batch,
                      num_unique, BLOCK: tl.constexpr):
    """Each valid prefetched line claims its distinct id: claim[u] = min(claim[u], entry)."""
    entry = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_buffer = entry < num_lines
    index = tl.load(record_ptr + entry, mask=in_buffer, other=0) & INDEX_MASK
    in_batch = in_buffer & (index < batch)
    node = tl.load(node_ptr + entry, mask=in_buffer, other=0)
    valid = in_batch & (tl.load(ids_ptr + index, mask=in_batch, other=0) == node)
    u = tl.load(inverse_ptr + index, mask=valid, other=0)
    known = (u >= 0) & (u < num_unique)
    tl.atomic_min(claim_ptr + u, entry.to(tl.int64), mask=valid & known)
    tl.store(error_ptr + 0 * entry, tl.full([BLOCK], 1, tl.int8), mask=valid & ~known)


@triton.jit
def _take_claims(claim_ptr, record_ptr, served_ptr, entry_ptr, position_ptr, num_lines, num_unique,
                 BLOCK: tl.constexpr):
    """Per distinct id: served, its line (the claim) and the line's stored index; -1 where none claimed it."""
    u = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = u < num_unique
    claim = tl.load(claim_ptr + u, mask=valid, other=num_lines)
    served = valid & (claim < num_lines)
    position = tl.load(record_ptr + claim, mask=served, other=0) & INDEX_MASK
    tl.store(served_ptr + u, served, mask=valid)
    tl.store(entry_ptr + u, tl.where(served, claim, -1), mask=valid)
    tl.store(position_ptr + u, tl.where(served, position, -1), mask=valid)


def pvp_match(ids, inverse, num_unique: int, node, record, check: bool = True, block: int = 256):
    """Triton twin of :func:`lsm_gnn.cache.pvp.match_prefetched`: ``(served, entry, position)`` per distinct id.
    ``check``: refuse an ``inverse`` outside ``[0, num_unique)`` (one read back; False where the distinct ids'
    kernel made it)."""
    device = ids.device
    num_lines, batch = node.numel(), ids.numel()
    claim = torch.full((num_unique,), num_lines, dtype=torch.int64, device=device)  # num_lines: unclaimed
    served = torch.empty(num_unique, dtype=torch.bool, device=device)
    entry = torch.empty(num_unique, dtype=torch.int64, device=device)
    position = torch.empty(num_unique, dtype=torch.int64, device=device)
    if num_unique == 0:
        return served, entry, position
    if num_lines and batch:
        error = _error_flag(device, check)
        _claim_first_line[(triton.cdiv(num_lines, block),)](ids, inverse, node, record, claim, error, num_lines,
                                                            batch, num_unique, BLOCK=block)
        if check and bool(error.any()):
            raise ValueError(f"inverse names a distinct id outside [0, {num_unique})")
    _take_claims[(triton.cdiv(num_unique, block),)](claim, record, served, entry, position, num_lines, num_unique,
                                                    BLOCK=block)
    return served, entry, position


@triton.jit
def _copy_served_rows(inverse_ptr, from_pvp_ptr, entry_ptr, line_ptr, src_ptr, dst_ptr, error_ptr, n, num_unique,
                      num_src, num_dst, dim, src_stride, dst_stride, BY_REQUEST: tl.constexpr, BLOCK: tl.constexpr,
                      DIM_BLOCK: tl.constexpr):
    """Copies pf_rows[entry[u]] for every served u: to request position k (u = inverse[k]) when BY_REQUEST,
    otherwise to cache line line[k] (u = k; a line of -1 takes nothing)."""
    k = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = k < n
    if BY_REQUEST:
        u = tl.load(inverse_ptr + k, mask=valid, other=0)
        dst = k.to(tl.int64)
    else:
        u = k.to(tl.int64)
        dst = tl.load(line_ptr + k, mask=valid, other=-1)
    known = (u >= 0) & (u < num_unique)
    chosen = valid & known & (tl.load(from_pvp_ptr + u, mask=valid & known, other=0) != 0) & (dst >= 0)
    src = tl.load(entry_ptr + u, mask=chosen, other=0)
    bad = (valid & ~known) | (chosen & ((src < 0) | (src >= num_src) | (dst >= num_dst)))
    tl.store(error_ptr + 0 * k, tl.full([BLOCK], 1, tl.int8), mask=bad)
    chosen = chosen & ~bad
    for start in range(0, dim, DIM_BLOCK):
        cols = start + tl.arange(0, DIM_BLOCK)
        mask = chosen[:, None] & (cols[None, :] < dim)
        row = tl.load(src_ptr + src[:, None] * src_stride + cols[None, :], mask=mask, other=0)
        tl.store(dst_ptr + dst[:, None] * dst_stride + cols[None, :], row, mask=mask)


def _copy_rows(dst, pf_rows, inverse, from_pvp, entry, line, error, by_request: bool, block: int) -> None:
    """Launches :func:`_copy_served_rows`: to request positions (``by_request``) or to cache lines ``line``."""
    if pf_rows.stride(1) != 1 or dst.stride(1) != 1:
        raise ValueError("rows, cache_data and pf_rows need contiguous rows")
    n, dim = inverse.numel() if by_request else from_pvp.numel(), dst.shape[1]
    if n and dim:
        _copy_served_rows[(triton.cdiv(n, block),)](
            inverse, from_pvp, entry, entry if line is None else line, pf_rows, dst, error, n, from_pvp.numel(),
            pf_rows.shape[0], dst.shape[0], dim, pf_rows.stride(0), dst.stride(0), BY_REQUEST=by_request,
            BLOCK=block, DIM_BLOCK=min(triton.next_power_of_2(dim), 128))


def _error_flag(device, check: bool) -> torch.Tensor:
    """Where the kernels flag bad indices: zeroed to be read when checking, else scratch nobody reads."""
    return torch.zeros(1, dtype=torch.int8, device=device) if check else torch.empty(1, dtype=torch.int8,
                                                                                     device=device)


def _raise_copy_error(error, check: bool) -> None:
    if check and bool(error.any()):
        raise ValueError("inverse names an id outside from_pvp, or a served id an entry outside the prefetch buffer "
                         "or a line outside the cache")


def pvp_scatter(rows, cache_data, pf_rows, inverse, from_pvp, entry, line=None, check: bool = True,
                block: int = 64) -> None:
    """Triton twin of :func:`lsm_gnn.cache.pvp.scatter_prefetched` (same arguments, same writes); ``check``: read
    the bad-index flag back and refuse."""
    error = _error_flag(rows.device, check)
    _copy_rows(rows, pf_rows, inverse, from_pvp, entry, None, error, True, block)
    if line is not None:  # reinstalling: the served rows fill their new cache lines as well
        _copy_rows(cache_data, pf_rows, inverse, from_pvp, entry, line, error, False, block)
    _raise_copy_error(error, check)


def pvp_install(cache_data, pf_rows, from_pvp, entry, line, check: bool = True, block: int = 64) -> None:
    """Triton twin of ``lsm_gnn::pvp_install``: ``cache_data[line[u]] = pf_rows[entry[u]]`` for every distinct id
    ``u`` with ``from_pvp[u]`` and a line (one launch); ``check`` as :func:`pvp_scatter`."""
    error = _error_flag(cache_data.device, check)
    _copy_rows(cache_data, pf_rows, entry, from_pvp, entry, line, error, False, block)
    _raise_copy_error(error, check)


def pvp_fill(ids, inverse, hit, line, node, record, pf_rows, cache_data, block: int = 256):
    """Triton twin of :func:`lsm_gnn.cache.pvp.fill_prefetched`: the match, then the served rows into their
    lines (:func:`pvp_install`; same results, same writes)."""
    served, entry, _ = pvp_match(ids, inverse, hit.numel(), node, record, True, block)
    from_pvp = served & ~hit  # a cache hit wins over a queued copy
    entry = torch.where(from_pvp, entry, torch.full_like(entry, -1))
    pvp_install(cache_data, pf_rows, from_pvp, entry, line)
    return from_pvp, entry
