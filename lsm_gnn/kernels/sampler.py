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
``[0, num_nodes)``, is reported through an error code per row and a flag per
hop (the interpreter skips device asserts). The flags are read once, after the
last hop (a bad id is stored as 0 meanwhile, so later hops stay in bounds), and
the first flagged hop's first bad row raised as the C++ sampler's
``lsm_gnn._C.CorruptGraphError`` (message, "indptr" or "indices"), which callers
turn into a DatasetError naming the file.
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
def _draw(indptr_ptr, indices_ptr, frontier_ptr, offsets_ptr, src_ptr, dst_ptr, error_ptr, flag_ptr, n, num_nodes,
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
    bad_any = tl.zeros([BLOCK], tl.int32)
    for c in range(0, KMAX):
        write = drawn & (c < got)
        position = tl.sum(tl.where(cols[None, :] == c, positions, 0), axis=1)
        neighbor = tl.load(indices_ptr + begin + position, mask=write, other=0).to(tl.int64)
        bad = write & ((neighbor < 0) | (neighbor >= num_nodes))
        # A bad id is stored as 0: the error is raised after the last hop, and later hops must index in bounds.
        tl.store(src_ptr + out + c, tl.where(bad, 0, neighbor), mask=write)
        tl.store(dst_ptr + out + c, i, mask=write)
        bad_any = bad_any | bad.to(tl.int32)
    # Every row's code is written (no zero fill); the hop's flag is what the host reads, once for all hops.
    code = tl.where(bad_row, 1, tl.where(bad_any != 0, 2, 0)).to(tl.int8)
    tl.store(error_ptr + i, code, mask=valid)
    tl.store(flag_ptr + 0 * i, tl.full([BLOCK], 1, tl.int8), mask=valid & (code != 0))


@triton.jit
def _copy_all(indptr_ptr, indices_ptr, frontier_ptr, offsets_ptr, src_ptr, dst_ptr, error_ptr, flag_ptr, num_nodes,
              num_edges, fanout, BLOCK: tl.constexpr):
    """Nodes that take every neighbor (fanout -1 or degree <= fanout): one program per frontier node, which
    decides itself (no list of such nodes to read back first); the others' loops run no trip."""
    i = tl.program_id(0)
    v = tl.load(frontier_ptr + i)
    begin = tl.load(indptr_ptr + v)
    end = tl.load(indptr_ptr + v + 1)
    bad_row = (begin < 0) | (end < begin) | (end > num_edges)
    degree = tl.where(bad_row, 0, end - begin)
    count = tl.where((fanout < 0) | (degree <= fanout), degree, 0)
    out = tl.load(offsets_ptr + i)
    for start in range(0, count, BLOCK):
        j = start + tl.arange(0, BLOCK)
        m = j < count
        neighbor = tl.load(indices_ptr + begin + j, mask=m, other=0).to(tl.int64)
        bad = m & ((neighbor < 0) | (neighbor >= num_nodes))
        tl.store(src_ptr + out + j, tl.where(bad, 0, neighbor), mask=m)  # 0: in bounds for later hops
        tl.store(dst_ptr + out + j, i + 0 * j, mask=m)
        tl.store(error_ptr + i + 0 * j, tl.full([BLOCK], 2, tl.int8), mask=bad)
        tl.store(flag_ptr + 0 * j, tl.full([BLOCK], 1, tl.int8), mask=bad)


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
    checks = None
    if seeds.numel():
        if num_nodes == 0:
            raise IndexError(f"seed node {int(seeds[0])} at position 0 is outside [0, 0)")
        # Both seed checks stay on the device; they come back with the first hop's edge count (one read).
        ordered = torch.sort(seeds).values
        checks = torch.stack([*torch.aminmax(seeds), (ordered[1:] == ordered[:-1]).sum()])
    batch = batch_key(int(seed), int(iteration))
    frontier = seeds
    hops, errors = [], []
    # One flag per hop, set by the kernels beside a row's error code: read once after the last hop.
    flags = torch.zeros(len(fanouts), dtype=torch.int8, device=device)
    for h, fanout in enumerate(int(k) for k in fanouts):
        key = hop_key(batch, h)
        n = frontier.numel()
        offsets = torch.zeros(n + 1, dtype=torch.int64, device=device)
        if n:
            # Unchecked seeds are clamped for these gathers: an index out of bounds would kill the CUDA context.
            safe = frontier.clamp(0, num_nodes - 1) if checks is not None and h == 0 else frontier
            ranges = indptr.unfold(0, 2, 1)[safe]  # [begin, end) of each row in one gather
            begin, end = ranges[:, 0], ranges[:, 1]
            bad_row = (begin < 0) | (end < begin) | (end > num_edges)
            degree = torch.where(bad_row, 0, end - begin)
            got = degree if fanout < 0 else torch.clamp(degree, max=fanout)
            torch.cumsum(got, 0, dtype=torch.int64, out=offsets[1:])
        if checks is not None and h == 0:
            total, *seen = torch.cat([offsets[-1:], checks]).tolist()
            _check_seeds(seeds, num_nodes, *seen)
        else:
            total = int(offsets[-1])
        src = torch.empty(total, dtype=torch.int64, device=device)
        dst = torch.empty(total, dtype=torch.int64, device=device)
        error = torch.empty(n, dtype=torch.int8, device=device)
        if n:
            kmax, rows = draw_tile(fanout, block)
            flag = flags[h:h + 1]
            _draw[(triton.cdiv(n, rows),)](indptr, indices, frontier, offsets, src, dst, error, flag, n, num_ids,
                                            num_edges, fanout, key & 0xFFFFFFFF, key >> 32, BLOCK=rows, KMAX=kmax)
            _copy_all[(n,)](indptr, indices, frontier, offsets, src, dst, error, flag, num_ids, num_edges, fanout,
                            BLOCK=128)
        errors.append((error, frontier))
        # Relabel as the CPU does: a node's local id is its rank by first occurrence in [frontier, sources].
        nodes, labels = first_occurrence_labels(torch.cat([frontier, src]))
        hops.append((nodes, n, labels[n:], dst))
        frontier = nodes
    if checks is not None and not hops:  # no hop read them
        _check_seeds(seeds, num_nodes, *checks.tolist())
    flagged = [h for h, f in enumerate(flags.tolist() if hops else []) if f]
    if flagged:  # the first hop with an error, as when each hop was checked before the next
        _raise_corrupt(*errors[flagged[0]], indptr, num_ids)
    return hops


def _check_seeds(seeds: torch.Tensor, num_nodes: int, low: int, high: int, repeats: int) -> None:
    """The seed errors, from the seeds' minimum, maximum and count of repeats read back with the first hop."""
    if low < 0 or high >= num_nodes:
        i = int(torch.nonzero((seeds < 0) | (seeds >= num_nodes))[0])
        raise IndexError(f"seed node {int(seeds[i])} at position {i} is outside [0, {num_nodes})")
    if repeats:
        ordered = torch.sort(seeds).values
        repeated = ordered[1:] == ordered[:-1]
        raise ValueError(f"seed node {int(ordered[1:][repeated][0])} appears twice in the batch; seeds must be "
                         "distinct")
