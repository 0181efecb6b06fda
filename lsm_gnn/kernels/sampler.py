"""The neighbor sampler in Triton, hop for hop identical to the C++ sampler, with one read back per call.

Each frontier node draws from its own splitmix64 stream keyed by (seed, iteration, hop, node)
(``csrc/sampler/sampler_rng.h``): Floyd's algorithm picks ``fanout`` distinct neighbor positions with Lemire's
bounded draw, so the positions, and therefore the hops, equal the C++ sampler's.

A call is one zero fill and two kernels a hop, and the host reads nothing until the last hop is queued:

- ``_draw`` (a tile of frontier rows a program): the rows' degrees, their offsets in the hop's edge list (a
  prefix sum over the tiles by decoupled look-back), the draws (or every neighbor, for a row that takes all),
  the edges in global ids, and every id put in a device hash table, which keeps the id's earliest position in
  the hop (an atomic max). At hop 0 it also checks the seeds and gives them local ids 0, 1, ...
- ``_relabel`` (a tile of edges a program): an id that no earlier hop numbered, at its earliest position, takes
  the next local id (a second look-back counts them, so local ids follow first occurrence, as the C++
  sampler's ``emplace`` in edge order); then every edge reads its id's local id from the table.

One table serves every hop: hop h's frontier is hop h-1's node list, so a node keeps its local id.

Sizes: no hop's count is read before the next is queued. Each hop's outputs are allocated at a bound: the
frontier's bound times the fanout (take-all: times the CSR's largest degree, computed once per CSR and cached),
at most the CSR's edge count, which no hop of distinct rows over a valid CSR exceeds. The counts, the error
flags and the seed checks come back together in one ``tolist`` at the end; the outputs are views narrowed to
them. Rows of a corrupt CSR may overlap while each is in bounds: a hop past its bound then keeps its exact count
(the writes past the bound are dropped), and the call reruns with that count as the hop's bound.

The kernels bounds-check what they follow, as the C++ sampler does: a row whose ``indptr`` decreases or leaves
``indices``, or a neighbor id outside ``[0, num_ids)``, is reported through an error code per row and a flag
per hop (the interpreter skips device asserts; a bad id is stored as 0 meanwhile, so later hops stay in
bounds), raised after the read back as the C++ sampler's ``lsm_gnn._C.CorruptGraphError`` (message,
"indptr" or "indices"), which callers turn into a DatasetError naming the file. Bad seeds raise the C++
sampler's IndexError / ValueError, with its messages.
"""
from __future__ import annotations

import weakref

import torch
import triton
import triton.language as tl

from lsm_gnn.utils.hashing import mix64

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


# -- device helpers ------------------------------------------------------------------------------------------------

# A tile's look-back status: its count << 2 | one of these (0: not published yet), one int64 so that a reader
# never sees a flag without its count.
_AGGREGATE = tl.constexpr(1)  # the tile's own count
_INCLUSIVE = tl.constexpr(2)  # the count of every tile up to it


@triton.jit
def _next_tile(ticket_ptr):
    """The tile this program takes: tiles are numbered in the order programs start (not by program id), so every
    tile before a program's own has started, whatever order the GPU runs programs in, and a look-back ends."""
    return tl.atomic_add(ticket_ptr, 1)


@triton.jit
def _exclusive_prefix(status_ptr, tile, count, MAX_WAITS: tl.constexpr):
    """(the sum of ``count`` over the tiles before ``tile``, whether it gave up): decoupled look-back. The own
    count is published first, so a later tile waits only for tiles that have started and wait on nothing but
    earlier tiles. It gives up after MAX_WAITS reads of an unpublished tile, which only a bug can cause (a
    hang otherwise; under the interpreter, whose programs run one after another, a single such read is one)."""
    tl.atomic_xchg(status_ptr + tile, (count << 2) | _AGGREGATE)
    prefix = count * 0
    waits = count * 0
    k = tile - 1
    while (k >= 0) & (waits <= MAX_WAITS):
        status = tl.atomic_add(status_ptr + k, 0)  # an atomic read: a plain load may see a stale line
        flag = status & 3
        prefix += tl.where(flag != 0, status >> 2, 0)
        waits += tl.where(flag == 0, 1, 0)
        k = tl.where(flag == _INCLUSIVE, -1, tl.where(flag == _AGGREGATE, k - 1, k))
    tl.atomic_xchg(status_ptr + tile, ((prefix + count) << 2) | _INCLUSIVE)
    return prefix, k >= 0


# The hash table (id -> local id), three int64 fields a slot, all zero when empty: the key holds id + 1; the first
# field _FIRST - (the id's earliest edge position in the hop), so an atomic max keeps the earliest; the label holds
# local id + 1.
_FIRST = tl.constexpr(1 << 62)


@triton.jit
def _first_field(position):
    """The first field's value for an edge position: larger for an earlier one, and never 0 (empty)."""
    return -position + _FIRST  # tensor first: the interpreter's constexpr - tensor is no tensor


@triton.jit
def _home_slot(ids, table_mask):
    return (_mix64(ids.to(tl.uint64)) >> 1).to(tl.int64) & table_mask  # >> 1: non-negative as int64


@triton.jit
def _insert(keys_ptr, ids, mask, table_mask):
    """Each id's slot (linear probing), claimed by compare-and-swap where the id is new. Masked-off lanes compare
    with -1, which no key holds, so their swap (at slot 0) writes nothing; they return slot 0."""
    key = ids + 1
    slot = tl.where(mask, _home_slot(ids, table_mask), 0)
    pending = mask
    while tl.max(pending.to(tl.int32), axis=0) > 0:
        seen = tl.atomic_cas(keys_ptr + slot, tl.where(pending, 0, -1).to(tl.int64), key)
        pending = pending & (seen != 0) & (seen != key)
        slot = tl.where(pending, (slot + 1) & table_mask, slot)
    return slot


@triton.jit
def _find(keys_ptr, ids, mask, table_mask):
    """Each id's slot, for ids ``_insert`` put in by an earlier launch (plain loads see them)."""
    key = ids + 1
    slot = tl.where(mask, _home_slot(ids, table_mask), 0)
    seen = tl.load(keys_ptr + slot, mask=mask, other=0)
    pending = mask & (seen != 0) & (seen != key)
    while tl.max(pending.to(tl.int32), axis=0) > 0:
        slot = tl.where(pending, (slot + 1) & table_mask, slot)
        seen = tl.load(keys_ptr + slot, mask=pending, other=0)
        pending = pending & (seen != 0) & (seen != key)
    return slot


@triton.jit
def _await_labels(label_ptr, slot, mask, MAX_WAITS: tl.constexpr):
    """(the labels, local id + 1, at ``slot``; whether it gave up), waiting for those not written yet: each is
    written by the tile of its id's first occurrence, this one or an earlier one, which has started and waits
    only on earlier tiles. It gives up as ``_exclusive_prefix`` does."""
    label = tl.load(label_ptr + slot, mask=mask, other=1)
    pending = mask & (label == 0)
    waits = tl.sum(pending.to(tl.int32), axis=0) * 0
    while (tl.max(pending.to(tl.int32), axis=0) > 0) & (waits <= MAX_WAITS):
        label = tl.where(pending, tl.atomic_add(label_ptr + slot, 0, mask=pending), label)
        pending = pending & (label == 0)
        waits += 1
    return label, tl.max(pending.to(tl.int32), axis=0) > 0


@triton.jit
def _emit_edges(indices_ptr, src_ptr, dst_ptr, keys_ptr, first_ptr, at, out, row, mask, num_ids, table_mask):
    """Edges from ``row`` to the neighbors at ``indices[at]``, stored at edge positions ``out``, each neighbor put
    in the table with its position. Returns which neighbor ids lie outside [0, num_ids): those are stored as 0,
    so that later hops index in bounds until the error is raised after the read back."""
    neighbor = tl.load(indices_ptr + at, mask=mask, other=0).to(tl.int64)
    bad = mask & ((neighbor < 0) | (neighbor >= num_ids))
    neighbor = tl.where(bad, 0, neighbor)
    tl.store(src_ptr + out, neighbor, mask=mask)
    tl.store(dst_ptr + out, row, mask=mask)
    slot = _insert(keys_ptr, neighbor, mask, table_mask)
    tl.atomic_max(first_ptr + slot, _first_field(out), mask=mask)
    return bad


# A hop's record in the report the host reads: its edge count (exact, even past the bound), its node count and
# whether a row of it is corrupt. After the hops' records, the call's flags: a seed out of range, a seed repeated,
# and a wait given up (a bug).
_EDGES = tl.constexpr(0)
_NODES = tl.constexpr(1)
_CORRUPT = tl.constexpr(2)
_RECORD = 3
_OUTSIDE = tl.constexpr(0)
_REPEATED = tl.constexpr(1)
_STUCK = tl.constexpr(2)
_FLAGS = 3


# -- the kernels ---------------------------------------------------------------------------------------------------

# fanout and num_draws stay runtime values: specialized to the constant 1, a few bytes spilled on sm_80.
@triton.jit(do_not_specialize=["fanout", "num_draws"])
def _draw(indptr_ptr, indices_ptr, frontier_ptr, frontier_count_ptr, nodes_ptr, src_ptr, dst_ptr, error_ptr,
          record_ptr, flags_ptr, ticket_ptr, status_ptr, keys_ptr, first_ptr, label_ptr, num_seeds, num_rows,
          num_ids, num_edges, fanout, num_draws, edge_bound, table_mask, key_lo, key_hi, SEEDS: tl.constexpr,
          BLOCK: tl.constexpr, KMAX: tl.constexpr, MAX_WAITS: tl.constexpr):
    """One hop's edges for a tile of BLOCK frontier rows: degrees, offsets, draws and take-all rows, in global ids
    (``_relabel`` numbers them). SEEDS: the frontier is the seeds (hop 0), counted by ``num_seeds`` and checked
    here; else it is the previous hop's nodes, counted at ``frontier_count_ptr``."""
    tile = _next_tile(ticket_ptr)
    i = tile * BLOCK + tl.arange(0, BLOCK)
    if SEEDS:
        valid = i < num_seeds
    else:
        valid = i < tl.load(frontier_count_ptr)
    v = tl.load(frontier_ptr + i, mask=valid, other=0)
    tl.store(nodes_ptr + i, v, mask=valid)  # a hop's nodes begin with its frontier
    live = valid
    if SEEDS:
        # The seeds' checks, on the device: out of range (then not followed at all), or repeated (a second seed
        # finds the local id of the first already set). Seeds get local ids 0, 1, ... in the table.
        outside = valid & ((v < 0) | (v >= num_rows))
        live = valid & (outside == 0)
        slot = _insert(keys_ptr, v, live, table_mask)
        earlier = tl.atomic_cas(label_ptr + slot, tl.where(live, 0, -1).to(tl.int64), i.to(tl.int64) + 1)
        tl.store(flags_ptr + _OUTSIDE + 0 * i, 1, mask=outside)
        tl.store(flags_ptr + _REPEATED + 0 * i, 1, mask=live & (earlier != 0))
    begin = tl.load(indptr_ptr + v, mask=live, other=0).to(tl.int64)  # int64 offsets, even for an int32 indptr
    end = tl.load(indptr_ptr + v + 1, mask=live, other=0).to(tl.int64)
    bad_row = live & ((begin < 0) | (end < begin) | (end > num_edges))
    degree = tl.where(bad_row, 0, end - begin)
    got = tl.where((fanout < 0) | (degree <= fanout), degree, fanout)
    drawn = live & (got < degree)
    # Floyd's algorithm, KMAX >= fanout draws wide per node: positions[:, c] is the c-th drawn position. Drawn
    # before the look-back below, which then waits less.
    key = (tl.cast(key_hi, tl.uint64) << 32) | tl.cast(key_lo, tl.uint64)  # either half may come as the constant 1
    state = key ^ _mix64(v.to(tl.uint64))
    cols = tl.arange(0, KMAX)
    positions = tl.full([BLOCK, KMAX], -1, tl.int64)
    for c in range(0, num_draws):
        j = degree - fanout + c
        state = tl.where(drawn, state + 0x9E3779B97F4A7C15, state)
        r = _mulhi(_mix64(state), (j + 1).to(tl.uint64)).to(tl.int64)
        taken = tl.sum(((positions == r[:, None]) & (cols[None, :] < c)).to(tl.int32), axis=1) > 0
        pick = tl.where(taken, j, r)
        positions = tl.where((cols[None, :] == c) & drawn[:, None], pick[:, None], positions)
    # The rows' offsets in the hop's edge list; the last tile's running total is the hop's edge count.
    tile_edges = tl.sum(got, axis=0)
    before, stuck = _exclusive_prefix(status_ptr, tile, tile_edges, MAX_WAITS)
    tl.store(flags_ptr + _STUCK, 1, mask=stuck)
    out = before + tl.cumsum(got, axis=0) - got
    tl.store(record_ptr + _EDGES, before + tile_edges, mask=tile == tl.num_programs(0) - 1)
    # The edges, KMAX columns at a time: a drawn row's all in the first (got <= fanout <= KMAX), a row that takes
    # every neighbor (perhaps many) in as many as it needs. Edges past the bound are dropped (the host reruns).
    bad_any = tl.zeros([BLOCK], tl.int32)
    for start in range(0, tl.max(got, axis=0), KMAX):
        column = start + cols[None, :]
        position = tl.where(drawn[:, None], positions, column)
        edge = out[:, None] + column  # its position in the hop's edge list
        write = (column < got[:, None]) & (edge < edge_bound)
        bad = _emit_edges(indices_ptr, src_ptr, dst_ptr, keys_ptr, first_ptr,
                          tl.reshape(begin[:, None] + position, [BLOCK * KMAX]), tl.reshape(edge, [BLOCK * KMAX]),
                          tl.reshape(i[:, None] + 0 * column, [BLOCK * KMAX]), tl.reshape(write, [BLOCK * KMAX]),
                          num_ids, table_mask)
        bad_any = bad_any | tl.max(tl.reshape(bad, [BLOCK, KMAX]).to(tl.int32), axis=1)
    # Every row's code is written (no zero fill); the hop's flag is what the host reads, once for all hops.
    code = tl.where(bad_row, 1, tl.where(bad_any != 0, 2, 0)).to(tl.int8)
    tl.store(error_ptr + i, code, mask=valid)
    tl.store(record_ptr + _CORRUPT + 0 * i, 1, mask=valid & (code != 0))


@triton.jit
def _relabel(src_ptr, local_ptr, nodes_ptr, record_ptr, flags_ptr, frontier_count_ptr, ticket_ptr, status_ptr,
             keys_ptr, first_ptr, label_ptr, num_seeds, edge_bound, node_bound, table_mask, SEEDS: tl.constexpr,
             BLOCK: tl.constexpr, MAX_WAITS: tl.constexpr):
    """Local ids for a tile of BLOCK of one hop's edges: an id no earlier hop numbered takes the next local id at
    its earliest position, appended to the hop's nodes; then every edge takes its id's local id."""
    tile = _next_tile(ticket_ptr)
    e = tile * BLOCK + tl.arange(0, BLOCK)
    if SEEDS:
        frontier = num_seeds + 0 * tile
    else:
        frontier = tl.load(frontier_count_ptr)
    live = e < tl.minimum(tl.load(record_ptr + _EDGES), edge_bound)
    ids = tl.load(src_ptr + e, mask=live, other=0)
    slot = _find(keys_ptr, ids, live, table_mask)
    # A label already there is an earlier hop's (or this launch's, at an earlier position): not a first.
    unnumbered = tl.load(label_ptr + slot, mask=live, other=1) == 0
    first = live & unnumbered & (tl.load(first_ptr + slot, mask=live, other=0) == _first_field(e))
    new = first.to(tl.int64)
    tile_new = tl.sum(new, axis=0)
    before, stuck = _exclusive_prefix(status_ptr, tile, tile_new, MAX_WAITS)
    local = frontier + before + tl.cumsum(new, axis=0) - new
    tl.atomic_xchg(label_ptr + slot, local + 1, mask=first)  # atomic: later tiles may be waiting on it
    tl.store(nodes_ptr + local, ids, mask=first & (local < node_bound))
    label, lost = _await_labels(label_ptr, slot, live, MAX_WAITS)
    tl.store(local_ptr + e, label - 1, mask=live)
    tl.store(flags_ptr + _STUCK, 1, mask=stuck | lost)
    count = tl.minimum(frontier + before + tile_new, node_bound)
    tl.store(record_ptr + _NODES, count, mask=tile == tl.num_programs(0) - 1)


#: Elements of _draw's [rows, KMAX] tile of positions: wider draws take fewer rows a program, so the tile stays in
#: registers (64 x 64 int64 needed 255 registers and spilled; 1024 still spilled with triton 3.6 and int64 indices).
DRAW_TILE_ELEMENTS = 512
#: _draw tiles this small run on 8 warps (see _launch).
SMALL_TILE_ELEMENTS = 128
#: Columns of _draw's tile at fanout -1: a row taking all its neighbors copies them this many at a time.
TAKE_ALL_COLUMNS = 16
#: Edges a _relabel program numbers.
RELABEL_BLOCK = 256
#: Reads of a value another program has not written yet after which a kernel gives up and flags a bug: about a
#: minute of atomic reads on a GPU, where a wait on a running program lasts microseconds.
MAX_WAITS = 1 << 26


def draw_tile(fanout: int, block: int = 64) -> tuple[int, int]:
    """(KMAX, rows a program) of ``_draw`` for ``fanout``: KMAX is at least 2 (a [rows, 1] tile trips a layout
    pass of triton 3.6), rows at most ``block`` and at most DRAW_TILE_ELEMENTS / 16 (register pressure: see the
    launch's warps)."""
    kmax = max(triton.next_power_of_2(max(fanout, 1)), 2) if fanout >= 0 else TAKE_ALL_COLUMNS
    return kmax, max(1, min(block, DRAW_TILE_ELEMENTS // max(kmax, 16)))


# id(indptr) -> (a weak reference to it, its version, its largest row length): the bound of a take-all hop, read
# back once per CSR. Keyed by id, since a WeakKeyDictionary compares tensors by value when their hashes meet.
_MAX_DEGREE: dict[int, tuple[weakref.ref, int, int]] = {}


def max_degree(indptr: torch.Tensor) -> int:
    """The CSR's largest row length (0 if none is positive), cached per ``indptr`` until it is modified in place."""
    ref, version, longest = _MAX_DEGREE.get(id(indptr), (None, -1, 0))
    if ref is None or ref() is not indptr or version != indptr._version:
        longest = max(int((indptr[1:] - indptr[:-1]).max()), 0) if indptr.numel() > 1 else 0
        _MAX_DEGREE[id(indptr)] = (weakref.ref(indptr, lambda _, key=id(indptr): _MAX_DEGREE.pop(key, None)),
                                   indptr._version, longest)
    return longest


def hop_bounds(num_seeds: int, fanouts: list[int], num_rows: int, num_edges: int, num_ids: int, longest: int,
               exact: dict[int, int]) -> list[tuple[int, int, int]]:
    """(frontier rows, edges, nodes) each hop's buffers hold. Edges: the frontier's bound times the fanout
    (take-all: times ``longest``), at most the CSR's ``num_edges`` (its rows are disjoint where valid, and a
    frontier holds each node once) unless ``exact`` gives the hop's count. Nodes: the frontier and at most
    ``num_ids`` new ids, one per edge at most; where neighbors are rows of the CSR (``num_ids == num_rows``),
    at most every id once (or the seeds, repeated ones included, which are refused after the read back)."""
    rows, bounds = num_seeds, []
    for h, fanout in enumerate(fanouts):
        edges = exact[h] if h in exact else min(rows * (longest if fanout < 0 else fanout), num_edges)
        nodes = rows + min(edges, num_ids)
        if num_ids == num_rows:
            nodes = min(nodes, max(num_seeds, num_ids))
        bounds.append((rows, edges, nodes))
        rows = nodes
    return bounds


def hash_table_size(bounds: list[tuple[int, int, int]]) -> int:
    """Slots of the call's hash table: at least twice the nodes it may hold, so probes stay short."""
    return triton.next_power_of_2(2 * bounds[-1][2])


def _read_back(report: torch.Tensor) -> list[int]:
    """The call's one read back: every hop's counts and flags, and the seed checks."""
    return report.tolist()


def sample_hops(indptr: torch.Tensor, indices: torch.Tensor, seeds: torch.Tensor, fanouts, seed: int,
                iteration: int, num_ids: int = -1, block: int = 64) -> list:
    """Triton twin of ``_C.sample_hops``: ``[(nodes, num_dst, src_local, dst), ...]`` per hop, on the seeds'
    device (the CSR must be on it too). ``seed`` is taken modulo 2**64, as the C++ core's uint64. Neighbor
    ids lie in ``[0, num_ids)`` (-1: the CSR's rows; another bound: one hop over a relation of two types).
    The tensors returned are views of buffers sized at the hops' bounds (module docstring)."""
    device = seeds.device
    num_nodes = indptr.numel() - 1
    fanouts = [int(k) for k in fanouts]
    if num_ids < 0:
        num_ids = num_nodes
    elif num_ids != num_nodes and len(fanouts) > 1:
        raise ValueError(f"a CSR whose neighbor ids lie in [0, {num_ids}) but whose rows are [0, {num_nodes}) is "
                         f"sampled one hop at a time, got {len(fanouts)} fanouts")
    seeds = seeds.to(torch.int64).contiguous()
    if not seeds.numel():
        return [(torch.empty(0, dtype=torch.int64, device=device), 0, torch.empty(0, dtype=torch.int64,
                 device=device), torch.empty(0, dtype=torch.int64, device=device)) for _ in fanouts]
    if num_nodes == 0 or not fanouts:  # nothing to launch: the seeds are checked on the host
        _raise_seed_error(seeds, num_nodes)
        return []
    longest = max_degree(indptr) if min(fanouts) < 0 else 0
    exact: dict[int, int] = {}
    while True:
        bounds = hop_bounds(seeds.numel(), fanouts, num_nodes, indices.numel(), num_ids, longest, exact)
        hops, errors, report = _launch(indptr, indices, seeds, fanouts, bounds, seed, iteration, num_ids, block)
        counts = _read_back(report)
        flags = counts[_RECORD * len(fanouts):]
        if flags[_STUCK.value]:
            raise RuntimeError("the device sampler's kernels gave up waiting on one another: a bug in "
                               "lsm_gnn/kernels/sampler.py; the C++ sampler (CPU seeds) avoids it")
        if flags[_OUTSIDE.value] or flags[_REPEATED.value]:
            _raise_seed_error(seeds, num_nodes)
        records = [counts[_RECORD * h:_RECORD * (h + 1)] for h in range(len(fanouts))]
        past = [h for h, ((_, edge_bound, _), (edges, _, _)) in enumerate(zip(bounds, records)) if edges > edge_bound]
        if not past:
            break
        exact[past[0]] = records[past[0]][0]  # exact, its frontier being right; the hops after it were not
    frontier_counts = [seeds.numel()] + [nodes for _, nodes, _ in records[:-1]]
    corrupt = [h for h, (_, _, flag) in enumerate(records) if flag]
    if corrupt:  # the first hop with an error, as when each hop is checked before the next
        error, frontier = errors[corrupt[0]]
        n = frontier_counts[corrupt[0]]
        _raise_corrupt(error[:n], frontier[:n], indptr, indices, num_ids)
    return [(nodes[:count], n, local[:edges], dst[:edges])
            for (nodes, local, dst), (edges, count, _), n in zip(hops, records, frontier_counts)]


def _launch(indptr, indices, seeds, fanouts, bounds, seed, iteration, num_ids, block):
    """Queues every hop's two kernels after one zero fill; returns the hops' buffers (nodes, local sources,
    destinations), the rows' error codes with their frontiers, and the report to read back."""
    device = seeds.device
    num_hops = len(fanouts)
    tiles = [draw_tile(fanout, block) for fanout in fanouts]
    draw_grids = [triton.cdiv(rows, tile_rows) for (rows, _, _), (_, tile_rows) in zip(bounds, tiles)]
    relabel_grids = [max(1, triton.cdiv(edges, RELABEL_BLOCK)) for _, edges, _ in bounds]
    table_size = hash_table_size(bounds)
    # One zero fill for every counter, status and table of the call (carved by views below).
    sizes = [_RECORD * num_hops + _FLAGS, 2 * num_hops, sum(draw_grids), sum(relabel_grids), 3 * table_size]
    zeros = torch.zeros(sum(sizes), dtype=torch.int64, device=device)
    report, tickets, draw_status, relabel_status, table = torch.split(zeros, sizes)
    keys, first, label = table.view(3, table_size)
    flags = report[_RECORD * num_hops:]
    max_waits = 0 if device.type == "cpu" else MAX_WAITS  # the interpreter: programs run one after another
    batch = batch_key(int(seed), int(iteration))
    frontier, hops, errors = seeds, [], []
    draw_at = relabel_at = 0
    for h, (fanout, (rows, edge_bound, node_bound)) in enumerate(zip(fanouts, bounds)):
        key = hop_key(batch, h)
        record = report[_RECORD * h:_RECORD * (h + 1)]
        # The frontier's count: the last hop's nodes (hop 0 counts its seeds by num_seeds).
        previous = report[_RECORD * (h - 1) + _NODES.value:] if h else record
        # Buffers of at least one element: a kernel argument is never an empty tensor's pointer.
        nodes = torch.empty(node_bound, dtype=torch.int64, device=device)
        src, local, dst = torch.empty(3, max(edge_bound, 1), dtype=torch.int64, device=device)
        error = torch.empty(rows, dtype=torch.int8, device=device)
        kmax, tile_rows = tiles[h]
        # Tiles of at most 32 rows, 8 warps up to 128 elements, else 2 below 16 columns and 4 from 16: the one choice
        # found where ptxas spills nothing at the recorded launches, sm_80 and sm_90, triton 3.6 and 3.9 (64 x 8 on
        # 4 warps spilled 4 bytes with 3.6, on 2 warps 8 with 3.9; 64 x 2 on 2 or 4 warps 8-12).
        warps = 8 if tile_rows * kmax <= SMALL_TILE_ELEMENTS else (4 if kmax >= 16 else 2)
        _draw[(draw_grids[h],)](indptr, indices, frontier, previous, nodes, src, dst, error, record, flags,
                                tickets[2 * h:], draw_status[draw_at:], keys, first, label, seeds.numel(),
                                indptr.numel() - 1, num_ids, indices.numel(), fanout, max(fanout, 0), edge_bound,
                                table_size - 1, key & 0xFFFFFFFF, key >> 32, SEEDS=h == 0, BLOCK=tile_rows,
                                KMAX=kmax, MAX_WAITS=max_waits, num_warps=warps)
        _relabel[(relabel_grids[h],)](src, local, nodes, record, flags, previous, tickets[2 * h + 1:],
                                      relabel_status[relabel_at:], keys, first, label, seeds.numel(), edge_bound,
                                      node_bound, table_size - 1, SEEDS=h == 0, BLOCK=RELABEL_BLOCK,
                                      MAX_WAITS=max_waits)
        draw_at += draw_grids[h]
        relabel_at += relabel_grids[h]
        hops.append((nodes, local, dst))
        errors.append((error, frontier))
        frontier = nodes
    return hops, errors, report


def _raise_seed_error(seeds: torch.Tensor, num_nodes: int) -> None:
    """The C++ sampler's seed error, if any: at the first seed out of range or repeating an earlier one (a
    flagged call only, or one with nothing to launch; this reads the seeds back)."""
    seen = set()
    for i, node in enumerate(seeds.cpu().tolist()):
        if node < 0 or node >= num_nodes:
            raise IndexError(f"seed node {node} at position {i} is outside [0, {num_nodes})")
        if node in seen:
            raise ValueError(f"seed node {node} appears twice in the batch; seeds must be distinct")
        seen.add(node)


def _raise_corrupt(error: torch.Tensor, frontier: torch.Tensor, indptr: torch.Tensor, indices: torch.Tensor,
                   num_ids: int) -> None:
    """The C++ sampler's error (csrc/graph/csr_check.h), message and all, for a hop's codes: its first bad row if
    any (it checks rows before it draws), else the first row with a neighbor id out of range, at the first such
    id of that row (a flagged call only: this reads back)."""
    from lsm_gnn._C import CorruptGraphError

    codes = error.cpu()
    rows = torch.nonzero(codes == 1)
    i = int(rows[0]) if rows.numel() else int(torch.nonzero(codes)[0])
    node = int(frontier[i])
    begin, end = int(indptr[node]), int(indptr[node + 1])
    if codes[i] == 1:
        raise CorruptGraphError(f"the row of node {node} is [indptr[{node}], indptr[{node + 1}]) = [{begin}, {end}), "
                                f"which is not an ordered range within [0, num_edges={indices.numel()}]", "indptr")
    row = indices[begin:end].cpu().to(torch.int64)
    at = int(torch.nonzero((row < 0) | (row >= num_ids))[0])
    raise CorruptGraphError(f"neighbor id {int(row[at])} of node {node} at position {begin + at} is outside "
                            f"[0, {num_ids})", "indices")
