"""The neighbor sampler's per-hop draw in Triton, hop for hop identical to the CPU sampler.

Each frontier node draws from its own splitmix64 stream keyed by (seed,
iteration, hop, node) (``csrc/sampler/sampler_rng.h``): Floyd's algorithm
picks ``fanout`` distinct neighbor positions with Lemire's bounded draw, so
the positions, and therefore the hops, equal the CPU's. One program draws
for a block of nodes at once (the draws of one node are sequential; nodes
are independent). Counting, offsets and relabelling (a node's local id is
its rank by first occurrence in ``[frontier, sampled sources]``) are torch
ops on the same device.

The kernel bounds-checks what it follows, as the C++ sampler does: a row
whose ``indptr`` decreases or leaves ``indices``, or a neighbor id outside
``[0, num_nodes)``, is reported through a flag tensor (the interpreter skips
device asserts) and raised as the C++ sampler's ``lsm_gnn._C.CorruptGraphError``
(message, "indptr" or "indices"), which callers turn into a DatasetError naming the file.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from lsm_gnn.hashing import mix64
from lsm_gnn.ids import first_occurrence_labels

_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


def batch_key(seed: int, iteration: int) -> int:
    """sampler_rng.h's batch_key."""
    return mix64((seed & _MASK64) ^ mix64(iteration))


def hop_key(batch: int, hop: int) -> int:
    return mix64((batch + hop) & _MASK64)


@triton.jit
def _mix64(z):
    z = z + 0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    return z ^ (z >> 31)


@triton.jit
def _mulhi(a, b):
    """The high 64 bits of a * b for b < 2**32 (Lemire's bounded draw), with 32-bit limbs."""
    a_hi = a >> 32
    a_lo = a & 0xFFFFFFFF
    return (a_hi * b + ((a_lo * b) >> 32)) >> 32


@triton.jit
def _draw(indptr_ptr, indices_ptr, frontier_ptr, offsets_ptr, src_ptr, dst_ptr, error_ptr, n, num_nodes,
          num_edges, fanout, key_lo, key_hi, BLOCK: tl.constexpr, KMAX: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = i < n
    v = tl.load(frontier_ptr + i, mask=valid, other=0)
    begin = tl.load(indptr_ptr + v, mask=valid, other=0)
    end = tl.load(indptr_ptr + v + 1, mask=valid, other=0)
    bad_row = valid & ((begin < 0) | (end < begin) | (end > num_edges))
    degree = tl.where(bad_row, 0, end - begin)
    got = tl.where((fanout < 0) | (degree <= fanout), degree, fanout)
    drawn = valid & (got < degree)
    out = tl.load(offsets_ptr + i, mask=valid, other=0)
    # Floyd's algorithm, KMAX >= fanout draws wide per node: positions[:, c] is the c-th drawn position.
    key = (tl.cast(key_hi, tl.uint64) << 32) | tl.cast(key_lo, tl.uint64)  # either half may come as the constant 1
    state = key ^ _mix64(v.to(tl.uint64))
    cols = tl.arange(0, KMAX)
    positions = tl.full([BLOCK, KMAX], -1, tl.int64)
    for c in range(0, KMAX):
        active = drawn & (c < fanout)
        j = degree - fanout + c
        state = tl.where(active, state + 0x9E3779B97F4A7C15, state)
        r = _mulhi(_mix64(state), (j + 1).to(tl.uint64)).to(tl.int64)
        taken = tl.sum(((positions == r[:, None]) & (cols[None, :] < c)).to(tl.int32), axis=1) > 0
        pick = tl.where(taken, j, r)
        positions = tl.where((cols[None, :] == c) & active[:, None], pick[:, None], positions)
    # Positions to neighbor ids (nodes that take every neighbor, perhaps many, are _copy_all's).
    for c in range(0, KMAX):
        write = drawn & (c < got)
        position = tl.sum(tl.where(cols[None, :] == c, positions, 0), axis=1)
        neighbor = tl.load(indices_ptr + begin + position, mask=write, other=0).to(tl.int64)
        tl.store(src_ptr + out + c, neighbor, mask=write)
        tl.store(dst_ptr + out + c, i, mask=write)
        bad = write & ((neighbor < 0) | (neighbor >= num_nodes))
        tl.store(error_ptr + i, tl.full([BLOCK], 2, tl.int8), mask=bad)
    tl.store(error_ptr + i, tl.full([BLOCK], 1, tl.int8), mask=bad_row)


@triton.jit
def _copy_all(indptr_ptr, indices_ptr, frontier_ptr, offsets_ptr, src_ptr, dst_ptr, error_ptr, node_ptr, n_all,
              num_nodes, BLOCK: tl.constexpr):
    """Nodes that take every neighbor (fanout -1 or degree <= fanout): one program per such node."""
    which = tl.program_id(0)
    i = tl.load(node_ptr + which)
    v = tl.load(frontier_ptr + i)
    begin = tl.load(indptr_ptr + v)
    end = tl.load(indptr_ptr + v + 1)
    out = tl.load(offsets_ptr + i)
    for start in range(0, end - begin, BLOCK):
        j = start + tl.arange(0, BLOCK)
        m = j < end - begin
        neighbor = tl.load(indices_ptr + begin + j, mask=m, other=0).to(tl.int64)
        tl.store(src_ptr + out + j, neighbor, mask=m)
        tl.store(dst_ptr + out + j, i + 0 * j, mask=m)
        bad = m & ((neighbor < 0) | (neighbor >= num_nodes))
        tl.store(error_ptr + i + 0 * j, tl.full([BLOCK], 2, tl.int8), mask=bad)


def _raise_corrupt(error: torch.Tensor, frontier: torch.Tensor, indptr: torch.Tensor, num_ids: int) -> None:
    from lsm_gnn._C import CorruptGraphError

    i = int(torch.nonzero(error)[0])
    node, code = int(frontier[i]), int(error[i])
    if code == 1:
        raise CorruptGraphError(f"the row of node {node} is [{int(indptr[node])}, {int(indptr[node + 1])}), not an "
                                "ordered range inside indices", "indptr")
    raise CorruptGraphError(f"a neighbor id of node {node} is outside [0, {num_ids})", "indices")


#: Elements of _draw's [rows, KMAX] tile of positions: wider draws take fewer rows a program, so the tile stays in
#: registers (64 x 64 int64 needed 255 registers and spilled; 1024 still spilled with triton 3.6 and int64 indices).
DRAW_TILE_ELEMENTS = 512


def draw_tile(fanout: int, block: int = 64) -> tuple[int, int]:
    """(KMAX, rows a program) of ``_draw`` for ``fanout``: KMAX is at least 2 (a [rows, 1] tile trips a layout
    pass of triton 3.6), rows at most ``block``."""
    kmax = max(triton.next_power_of_2(max(fanout, 1)), 2)
    return kmax, max(1, min(block, DRAW_TILE_ELEMENTS // kmax))


def sample_hops(indptr: torch.Tensor, indices: torch.Tensor, seeds: torch.Tensor, fanouts, seed: int,
                iteration: int, num_ids: int = -1, block: int = 64) -> list:
    """Triton twin of ``_C.sample_hops``: ``[(nodes, num_dst, src_local, dst), ...]`` per hop, on the seeds'
    device (the CSR must be on it too). ``seed`` is taken modulo 2**64, as the C++ core's uint64. Neighbor
    ids lie in ``[0, num_ids)`` (-1: the CSR's rows; another bound: one hop over a relation of two types)."""
    device = seeds.device
    num_nodes = indptr.numel() - 1
    num_edges = indices.numel()
    if num_ids < 0:
        num_ids = num_nodes
    elif num_ids != num_nodes and len(fanouts) > 1:
        raise ValueError(f"a CSR whose neighbor ids lie in [0, {num_ids}) but whose rows are [0, {num_nodes}) is "
                         f"sampled one hop at a time, got {len(fanouts)} fanouts")
    seeds = seeds.to(torch.int64).contiguous()
    if seeds.numel():
        if bool(((seeds < 0) | (seeds >= num_nodes)).any()):
            i = int(torch.nonzero((seeds < 0) | (seeds >= num_nodes))[0])
            raise IndexError(f"seed node {int(seeds[i])} at position {i} is outside [0, {num_nodes})")
        ordered = torch.sort(seeds).values
        repeated = ordered[1:] == ordered[:-1]
        if bool(repeated.any()):
            raise ValueError(f"seed node {int(ordered[1:][repeated][0])} appears twice in the batch; seeds must be "
                             "distinct")
    batch = batch_key(int(seed), int(iteration))
    frontier = seeds
    hops = []
    for h, fanout in enumerate(int(k) for k in fanouts):
        key = hop_key(batch, h)
        n = frontier.numel()
        begin, end = indptr[frontier], indptr[frontier + 1]
        bad_row = (begin < 0) | (end < begin) | (end > num_edges)
        degree = torch.where(bad_row, torch.zeros_like(begin), end - begin)
        got = degree if fanout < 0 else torch.clamp(degree, max=fanout)
        offsets = torch.zeros(n + 1, dtype=torch.int64, device=device)
        offsets[1:] = torch.cumsum(got, 0)
        total = int(offsets[-1])
        src = torch.empty(total, dtype=torch.int64, device=device)
        dst = torch.empty(total, dtype=torch.int64, device=device)
        error = torch.zeros(n, dtype=torch.int8, device=device)
        if n:
            kmax, rows = draw_tile(fanout, block)
            _draw[(triton.cdiv(n, rows),)](indptr, indices, frontier, offsets, src, dst, error, n, num_ids,
                                            num_edges, fanout, key & 0xFFFFFFFF, key >> 32, BLOCK=rows, KMAX=kmax)
            take_all = torch.nonzero((got == degree) & (degree > 0) & ~bad_row).reshape(-1)
            if take_all.numel():
                _copy_all[(take_all.numel(),)](indptr, indices, frontier, offsets, src, dst, error, take_all,
                                               take_all.numel(), num_ids, BLOCK=128)
        if bool(error.any()):
            _raise_corrupt(error, frontier, indptr, num_ids)
        # Relabel as the CPU does: a node's local id is its rank by first occurrence in [frontier, sources].
        nodes, labels = first_occurrence_labels(torch.cat([frontier, src]))
        hops.append((nodes, n, labels[n:], dst))
        frontier = nodes
    return hops
