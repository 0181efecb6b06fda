"""The cache's assign step in Triton: find the hits, then choose and install a line for every miss.

The same decisions as ``csrc/cache/cpu_cache.cpp`` (``_C.cache_assign``),
rule for rule (``csrc/cache/line_state.h``): a hit marks its line used and,
after a scan, fresh; a miss takes an invalid way first, else the policy's
victim among the lines this iteration has not used, else among all; a line
taken twice in one batch caches only the later id. Given a window's first
occurrences (next use at assign), hit and installed lines get their next use
instead of the fresh mark, and with ``bypass`` a miss whose own key is below
its victim's is not cached.

Two kernels, neither waiting on another program:

- ``_find_hits``: one program per block of distinct ids; distinct ids hit
  distinct lines, so the writes never collide.
- ``_install_misses``: the misses sorted by set (a stable sort keeps the
  ascending id order the C++ core uses), one program per set that has
  misses, handling that set's misses in order. Only that program touches
  the set.

Run on CUDA tensors they compile for the GPU; on CPU tensors under
``TRITON_INTERPRET=1`` (see :mod:`lsm_gnn.kernels`) the interpreter runs the
same source, which is how CI checks them against the C++ core.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from lsm_gnn.kernels import compact, layout
from lsm_gnn.kernels.codes import LEVEL_CODE, POLICY_CODE

# Kernels read globals only as compile-time constants.
FRESH = tl.constexpr(layout.FRESH)
INVALID_TAG = tl.constexpr(layout.INVALID_TAG)
NO_ID = tl.constexpr(layout.NO_ID)
NO_REUSE = tl.constexpr(layout.NO_REUSE)
NO_REUSE_RECORD = tl.constexpr(layout.NO_REUSE_RECORD)
REUSE_SHIFT = tl.constexpr(layout.REUSE_SHIFT)
RANK_SHIFT = tl.constexpr(layout.RANK_SHIFT)
INDEX_MASK = tl.constexpr(layout.INDEX_MASK)
NOT_FRESH = tl.constexpr(0xFF & ~layout.FRESH)
_RR, _LRU, _STATIC, _DYNAMIC = (tl.constexpr(POLICY_CODE[n]) for n in ("rr", "lru", "static", "dynamic"))
_HYBRID_FAR, _HYBRID_PVP_ROOM = tl.constexpr(POLICY_CODE["hybrid_far"]), tl.constexpr(POLICY_CODE["hybrid_pvp_room"])
_FARTHEST = tl.constexpr(POLICY_CODE["farthest"])
_LEVEL_NONE, _LEVEL_FAR, _LEVEL_FRESH, _LEVEL_NEAR = (tl.constexpr(LEVEL_CODE[n]) for n in
                                                      ("none", "far", "fresh", "near"))
_NOT_A_CANDIDATE = tl.constexpr(1 << 50)  # above every eviction key (keys use at most 35 bits; LRU's an iteration)
#: Elements of _find_hits' [ids, ways] tile: 128 ids of 32 ways by default; 32 ids at 128 ways (which spilled at 128).
FIND_HITS_TILE_ELEMENTS = 4096


@triton.jit
def _set_of(ids, num_sets):
    """splitmix64(id) % num_sets, as line_state.h's set_of."""
    z = ids.to(tl.uint64) + 0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    z = z ^ (z >> 31)
    # tl.cast, not num_sets.to: the launcher passes a one-set cache's num_sets as the constant 1.
    return (z % tl.cast(num_sets, tl.uint64)).to(tl.int64)


@triton.jit
def _assign_record(ids, mask, first_iteration_ptr, first_position_ptr, first_rank_ptr, num_nodes, front, limit,
                   iteration, scan_base):
    """line_state.h's assign_record: the next use of ``ids`` after this iteration, its reuse counted from the
    last scan (occurrences beyond ``limit`` batches of this iteration are no reuse)."""
    known = mask & (ids >= 0) & (ids < num_nodes)
    node = tl.where(known, ids, 0)
    first = tl.load(first_iteration_ptr + node, mask=known, other=-1).to(tl.int64)
    position = tl.load(first_position_ptr + node, mask=known, other=0).to(tl.int64)
    rank = tl.load(first_rank_ptr + node, mask=known, other=0).to(tl.int64)
    ahead = first - front + 1  # batches from this iteration to the next use
    reused = (first >= 0) & (ahead <= limit)
    reuse = ahead + (iteration - scan_base)
    record = (reuse << REUSE_SHIFT) | ((rank & 0xFF) << RANK_SHIFT) | (position & INDEX_MASK)
    return tl.where(reused, record, NO_REUSE_RECORD)


@triton.jit
def _hit_lines(ids, valid, tags_ptr, num_sets, WAYS: tl.constexpr):
    """(set, line, hit) of each id: the way of its set whose tag is the id (at most one; line -1 where none)."""
    sets = _set_of(ids, num_sets)
    ways = tl.arange(0, WAYS)
    lines = sets[:, None] * WAYS + ways[None, :]
    tags = tl.load(tags_ptr + lines, mask=valid[:, None], other=INVALID_TAG)
    match = (tags == ids[:, None]) & valid[:, None]
    way = tl.max(tl.where(match, ways[None, :], -1), axis=1)
    hit = way >= 0
    return sets, tl.where(hit, sets * WAYS + way, -1), hit


@triton.jit
def _mark_hits(ids, line, hit, last_use_ptr, flags_ptr, records_ptr, iteration, scan_base, known,
               first_iteration_ptr, first_position_ptr, first_rank_ptr, num_nodes, front, limit):
    """A hit marks its line used and, after a scan, fresh (or, given the window, sets its next use). The same
    values for every occurrence of an id, so repeated ids may mark their line in any order."""
    safe = tl.where(hit, line, 0)
    tl.store(last_use_ptr + safe, tl.zeros_like(line) + iteration, mask=hit)
    old = tl.load(flags_ptr + safe, mask=hit, other=0)
    if known != 0:  # its next use, read now
        record = _assign_record(ids, hit, first_iteration_ptr, first_position_ptr, first_rank_ptr, num_nodes, front,
                                limit, iteration, scan_base)
        tl.store(records_ptr + safe, record, mask=hit)
        tl.store(flags_ptr + safe, (old & NOT_FRESH).to(tl.uint8), mask=hit)
    else:
        fresh = tl.where(iteration > scan_base, old | FRESH, old)  # the predicted reuse is being consumed
        tl.store(flags_ptr + safe, fresh.to(tl.uint8), mask=hit)


@triton.jit
def _find_hits(unique_ptr, n, tags_ptr, last_use_ptr, flags_ptr, records_ptr, line_ptr, hit_ptr, set_ptr,
               evicted_tag_ptr, evicted_record_ptr, evicted_line_ptr, counts_ptr,
               num_sets, iteration, scan_base, known, first_iteration_ptr, first_position_ptr, first_rank_ptr,
               num_nodes, front, limit, WAYS: tl.constexpr, BLOCK: tl.constexpr):
    # Also writes every id's "nothing evicted" (the outputs are allocated empty: no fill launches), its set as the
    # install sorts it (hits and padding last, as set num_sets), and adds its misses to counts[3], which the host
    # reads to skip the install when the batch hit in full.
    pid = tl.program_id(0)
    u = pid * BLOCK + tl.arange(0, BLOCK)
    valid = u < n
    ids = tl.load(unique_ptr + u, mask=valid, other=-1)
    pad = ids == NO_ID  # (after the distinct ids) no line, and not a miss
    sets, line, hit = _hit_lines(ids, valid & ~pad, tags_ptr, num_sets, WAYS)
    tl.store(line_ptr + u, line, mask=valid)
    tl.store(hit_ptr + u, (hit | pad).to(tl.int8), mask=valid)
    tl.store(set_ptr + u, tl.where(hit | pad, num_sets, sets), mask=valid)  # the install's sort key
    tl.store(evicted_tag_ptr + u, tl.full([BLOCK], INVALID_TAG, tl.int64), mask=valid)
    tl.store(evicted_record_ptr + u, tl.full([BLOCK], NO_REUSE_RECORD, tl.int64), mask=valid)
    tl.store(evicted_line_ptr + u, tl.full([BLOCK], -1, tl.int64), mask=valid)
    tl.atomic_add(counts_ptr + 3, tl.sum((valid & ~hit & ~pad).to(tl.int32), axis=0))
    _mark_hits(ids, line, hit, last_use_ptr, flags_ptr, records_ptr, iteration, scan_base, known,
               first_iteration_ptr, first_position_ptr, first_rank_ptr, num_nodes, front, limit)


@triton.jit
def _serve_hits(ids_ptr, n, num_rows, tags_ptr, last_use_ptr, flags_ptr, records_ptr, touched_ptr, stamp,
                data_ptr, rows_ptr, row_words, hit_ptr, counts_ptr, num_sets, iteration, scan_base, known,
                first_iteration_ptr, first_position_ptr, first_rank_ptr, num_nodes, front, limit, scalars_ptr,
                WAYS: tl.constexpr, BLOCK: tl.constexpr, COLS: tl.constexpr, SCALARS_ON_DEVICE: tl.constexpr):
    # The request as it came (repeats and all): each hit marked as _find_hits marks it and its row copied to its
    # position. counts: [positions that missed, ids out of [0, num_rows), distinct ids that hit]. A line's first
    # visitor this lookup (touched[line] swapped from another stamp) counts its id as distinct.
    if SCALARS_ON_DEVICE:  # a CUDA graph's launch: the per-call scalars are read where the host wrote them
        stamp = tl.load(scalars_ptr + 0).to(tl.int32)
        iteration = tl.load(scalars_ptr + 1)
        scan_base = tl.load(scalars_ptr + 2)
        front = tl.load(scalars_ptr + 3)
    pid = tl.program_id(0)
    p = pid * BLOCK + tl.arange(0, BLOCK)
    valid = p < n
    ids = tl.load(ids_ptr + p, mask=valid, other=-1)
    in_range = valid & (ids >= 0) & (ids < num_rows)
    _, line, hit = _hit_lines(ids, in_range, tags_ptr, num_sets, WAYS)
    _mark_hits(ids, line, hit, last_use_ptr, flags_ptr, records_ptr, iteration, scan_base, known,
               first_iteration_ptr, first_position_ptr, first_rank_ptr, num_nodes, front, limit)
    safe = tl.where(hit, line, 0)
    first = tl.atomic_xchg(touched_ptr + safe, tl.zeros_like(safe).to(tl.int32) + stamp, mask=hit) != stamp
    tl.atomic_add(counts_ptr + 0, tl.sum((valid & ~hit).to(tl.int32), axis=0))
    tl.atomic_add(counts_ptr + 1, tl.sum((valid & ~in_range).to(tl.int32), axis=0))
    tl.atomic_add(counts_ptr + 2, tl.sum((hit & first).to(tl.int32), axis=0))
    tl.store(hit_ptr + p, hit.to(tl.int8), mask=valid)
    for start in range(0, row_words, COLS):  # the row in words, COLS at a time
        cols = start + tl.arange(0, COLS)
        both = hit[:, None] & (cols[None, :] < row_words)
        words = tl.load(data_ptr + safe[:, None] * row_words + cols[None, :], mask=both)
        tl.store(rows_ptr + p[:, None].to(tl.int64) * row_words + cols[None, :], words, mask=both)


@triton.jit
def _victim_keys(records, flags, static, last_use, way, iteration, scan_base, threshold, policy,
                 r0, r1, r2, r3, room_ptr, num_queues):
    """line_state.h's victim_key for the ways of one set (smaller is evicted first)."""
    reuse = (records.to(tl.uint64) >> REUSE_SHIFT).to(tl.int64)
    d = scan_base + reuse - iteration
    fresh = (flags & FRESH) != 0
    level = tl.where(fresh, _LEVEL_FRESH,
                     tl.where(reuse == NO_REUSE, _LEVEL_NONE,
                              tl.where(d <= 0, _LEVEL_FRESH, tl.where(d <= threshold, _LEVEL_NEAR, _LEVEL_FAR))))
    d = tl.where(fresh | (reuse == NO_REUSE), 0, d)
    # dynamic: none, then fresh, then far-to-near
    dynamic = tl.where(level == _LEVEL_NONE, 0,
                       tl.where(level == _LEVEL_FRESH, 1, (2 << 32) | ((1 << 32) - 1 - d)))
    rank = tl.where(level == _LEVEL_NONE, r0,
                    tl.where(level == _LEVEL_FAR, r1, tl.where(level == _LEVEL_FRESH, r2, r3)))
    position = 2 * rank.to(tl.int64)
    far = level == _LEVEL_FAR
    if policy == _HYBRID_PVP_ROOM:
        # No victim buffer (num_queues 0): room_ptr is a single 0, so no queue has room.
        queue = (iteration + d) % tl.maximum(num_queues, 1)
        room = tl.load(room_ptr + tl.where(far, queue, 0), mask=far, other=0)
        position = tl.where(far & (room == 0), 2 * tl.cast(r0, tl.int64) + 1, position)
    # Farther reuse first: in the far level (hybrid_far, farthest) and the near level (farthest).
    farthest = policy == _FARTHEST
    by_distance = (((policy == _HYBRID_FAR) | farthest) & far) | (farthest & (level == _LEVEL_NEAR))
    far_term = tl.where(by_distance, 65535 - d, 0)
    hybrid = (position << 32) | (far_term << 16) | static
    key = tl.where(policy == _LRU, last_use + 1,
                   tl.where(policy == _STATIC, static, tl.where(policy == _DYNAMIC, dynamic, hybrid)))
    return key


@triton.jit
def _install_misses(order_ptr, sorted_set_ptr, seg_start_ptr, n, unique_ptr, node_static_ptr, has_static,
                    tags_ptr, records_ptr, flags_ptr, static_ptr, last_use_ptr, rr_ptr,
                    line_ptr, evicted_tag_ptr, evicted_record_ptr, evicted_line_ptr, counts_ptr,
                    iteration, scan_base, threshold, policy, r0, r1, r2, r3, room_ptr, num_queues,
                    known, bypass, first_iteration_ptr, first_position_ptr, first_rank_ptr, num_nodes, front, limit,
                    WAYS: tl.constexpr):
    # Program p installs the misses of the p-th set that has any: [start, end) of the sorted order. Programs past
    # the last such set find start == n and do nothing (the grid is sized without reading the count back).
    start = tl.load(seg_start_ptr + tl.program_id(0))
    s = tl.load(sorted_set_ptr + start, mask=start < n, other=0)
    end = start
    if start < n:
        end = start + 1
        while tl.load(sorted_set_ptr + end, mask=end < n, other=-1) == s:  # hits sort last, as set num_sets
            end += 1
    ways = tl.arange(0, WAYS)
    lines = s * WAYS + ways
    installed_by = tl.full([WAYS], -1, tl.int64)  # way -> unique index this batch installed there
    evictions = 0
    in_use_evictions = 0
    bypassed = 0
    for k in range(start, end):
        u = tl.load(order_ptr + k)
        node = tl.load(unique_ptr + u)
        static_of = tl.load(node_static_ptr + node * has_static)  # without scores: a single 0 at index 0
        record = tl.full((), NO_REUSE_RECORD, tl.int64)
        skip = u < 0  # False: bypass decides below
        if known != 0:
            record = _assign_record(node, known != 0, first_iteration_ptr, first_position_ptr, first_rank_ptr,
                                    num_nodes, front, limit, iteration, scan_base)
        tags = tl.load(tags_ptr + lines)
        last_use = tl.load(last_use_ptr + lines)
        # An invalid way first (the lowest), then the policy's pick.
        first_invalid = tl.min(tl.where(tags == INVALID_TAG, ways, WAYS), axis=0)
        in_use = last_use == iteration
        if policy == _RR:
            pointer = tl.load(rr_ptr + s)
            order = (ways - pointer + WAYS) % WAYS  # position of each way in the scan from the pointer
            unused = tl.min(tl.where(in_use, WAYS, order), axis=0)
            step = tl.where(unused < WAYS, unused, 0)  # every line in use: the pointer's own way
            chosen = ((pointer + step) % WAYS).to(tl.int64)
            if first_invalid == WAYS:
                tl.store(rr_ptr + s, ((chosen + 1) % WAYS).to(tl.int32))
        else:
            records = tl.load(records_ptr + lines)
            flags = tl.load(flags_ptr + lines)
            static = tl.load(static_ptr + lines).to(tl.int64) & 0xFFFF
            key = _victim_keys(records, flags, static, last_use, ways, iteration, scan_base, threshold, policy,
                               r0, r1, r2, r3, room_ptr, num_queues)
            # Ties go to the lowest way, as the C++ scan in way order does: pack the way under the key.
            packed = tl.where(in_use, _NOT_A_CANDIDATE, key) * WAYS + ways
            best = tl.min(packed, axis=0)
            if best >= _NOT_A_CANDIDATE * WAYS:  # every line was used this iteration: choose among all
                best = tl.min(key * WAYS + ways, axis=0)
            chosen = (best % WAYS).to(tl.int64)
            victim_key = tl.sum(tl.where(ways == chosen, key, 0), axis=0)
            # Belady's bypass: a miss the policy would evict before its victim is not cached.
            if (bypass != 0) & (first_invalid == WAYS):
                own_key = _victim_keys(record, tl.zeros((), tl.uint8), static_of.to(tl.int64) & 0xFFFF, iteration,
                                       tl.zeros((), tl.int64), iteration,
                                       scan_base, threshold, policy, r0, r1, r2, r3, room_ptr, num_queues)
                skip = own_key < victim_key
        way = tl.where(first_invalid < WAYS, first_invalid.to(tl.int64), chosen)
        line = s * WAYS + way
        if skip:
            bypassed += 1
        else:
            old_tag = tl.load(tags_ptr + line)
            previous = tl.max(tl.where(ways == way, installed_by, -1), axis=0)
            if old_tag != INVALID_TAG:
                tl.store(evicted_tag_ptr + u, old_tag)
                # A line this batch installed holds no row yet: no victim queue may take it.
                old_record = tl.load(records_ptr + line)
                tl.store(evicted_record_ptr + u, tl.where(previous >= 0, NO_REUSE_RECORD, old_record))
                tl.store(evicted_line_ptr + u, line)
                evictions += 1
                in_use_evictions += (tl.load(last_use_ptr + line) == iteration).to(tl.int32)
            if previous >= 0:  # a line taken twice by this batch caches only the later id
                tl.store(line_ptr + previous, -1)
            installed_by = tl.where(ways == way, u, installed_by)
            tl.store(tags_ptr + line, node)
            tl.store(static_ptr + line, static_of)
            tl.store(records_ptr + line, record)
            tl.store(flags_ptr + line, tl.where(known != 0, 0, FRESH).to(tl.uint8))  # known next use: not fresh
            tl.store(last_use_ptr + line, iteration)
            tl.store(line_ptr + u, line)
        tl.debug_barrier()  # the next miss of this set reads what this one wrote
    tl.atomic_add(counts_ptr + 0, evictions)
    tl.atomic_add(counts_ptr + 1, in_use_evictions)
    tl.atomic_add(counts_ptr + 2, bypassed)


_ZEROS: dict = {}


def _zero(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A single 0 on ``device``, made once: the kernels read it where an optional array is absent and never
    write it (a fill launch a batch saved for each)."""
    key = (device, dtype)
    if key not in _ZEROS:
        _ZEROS[key] = torch.zeros(1, dtype=dtype, device=device)
    return _ZEROS[key]


def _stand_ins(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The window arrays' single-entry stand-ins on ``device``."""
    return _zero(device, torch.int32), _zero(device, torch.int32), _zero(device, torch.uint8)


def _check_ways(ways: int) -> None:
    if ways < 1 or ways & (ways - 1):
        raise ValueError(f"the Triton cache kernels need a power of two ways (a set is one vector), got {ways}; "
                         "use cache.ways=32 (the default), 16, 8, ...")


def _window_arrays(device, first_iteration, first_position, first_rank) -> tuple[bool, int, tuple]:
    """(known, num_nodes, arrays): whether a window's first occurrences were given (next use at assign), and
    the arrays the kernels read (single-entry stand-ins where none were)."""
    window = (first_iteration, first_position, first_rank)
    if any(a is None for a in window) != all(a is None for a in window):
        raise ValueError("give all of first_iteration, first_position and first_rank (a window index's arrays) "
                         "or none")
    if first_iteration is None:  # the kernels read nothing through these
        return False, 0, _stand_ins(device)
    num_nodes = first_iteration.numel()
    for name, array, dtype in zip(("first_iteration", "first_position", "first_rank"), window,
                                  (torch.int32, torch.int32, torch.uint8)):
        if array.dtype != dtype or array.numel() != num_nodes or array.device != device:
            raise ValueError(f"{name} must be a {dtype} tensor of {num_nodes} entries on {device} (a window "
                             f"index's array), got {array.dtype} [{array.numel()}] on {array.device}")
    return True, num_nodes, window


def cache_assign(tags, records, flags, static_score, last_use, rr_pointer, ways: int, unique, node_static,
                 policy: int, iteration: int, scan_base: int, threshold: int, level_rank, queue_room=None,
                 first_iteration=None, first_position=None, first_rank=None, front: int = 0, limit: int = 0,
                 bypass: bool = False, block: int = 128, has_misses: bool = False):
    """Triton twin of ``_C.cache_assign`` (same arguments, same decisions, same state changes) as the op
    ``lsm_gnn::cache_assign`` returns it: ``(line, hit, evicted_tag, evicted_record, evicted_line, counts)``,
    ``counts`` int64 ``[evictions, evicted_in_use, bypassed, misses]`` on the device. On a GPU it reads back the
    number of misses after the hit kernel (an all-hit batch launches nothing more), unless ``has_misses`` says
    there are some; then it reads nothing, and ``unique`` may end with ``NO_ID`` padding."""
    _check_ways(ways)
    device = tags.device
    known, num_nodes, window = _window_arrays(device, first_iteration, first_position, first_rank)
    bypass = bool(bypass) and known
    n = unique.numel()
    num_sets = tags.numel() // ways
    # Allocated empty: _find_hits writes every entry (a lookup's fixed cost is launches, so none are spent on fills).
    outputs = torch.empty(5, n, dtype=torch.int64, device=device)
    line, sets, evicted_tag, evicted_record, evicted_line = outputs.unbind(0)
    hit8 = torch.empty(n, dtype=torch.int8, device=device)
    counts = torch.zeros(4, dtype=torch.int64, device=device)  # evictions, in use, bypassed, misses
    if n == 0:
        return line, hit8.view(torch.bool), evicted_tag, evicted_record, evicted_line, counts
    # Fewer ids a program as the ways widen: the [ids, ways] tile of tags stays in registers.
    rows = max(1, min(block, FIND_HITS_TILE_ELEMENTS // ways))
    _find_hits[(triton.cdiv(n, rows),)](unique, n, tags, last_use, flags, records, line, hit8, sets,
                                        evicted_tag, evicted_record, evicted_line, counts, num_sets,
                                        iteration, scan_base, int(known), *window, num_nodes, front, limit,
                                        WAYS=ways, BLOCK=rows)
    hit = hit8.view(torch.bool)  # 0 or 1 in every byte
    misses = n if has_misses else int(counts[3])  # (the one read back, where the caller did not know)
    if misses == 0:  # an all-hit batch ends here
        return line, hit, evicted_tag, evicted_record, evicted_line, counts
    # The misses by set, in ascending id order within a set (a stable sort: the C++ core's order), then the hits
    # (sets holds num_sets for them). Each set's first position becomes a segment start, found without a host sync.
    order = torch.argsort(sets, stable=True)
    sorted_sets, seg_start = compact.set_segments(sets, order, num_sets)
    segments = min(misses, num_sets)  # at most one per distinct miss set: one program each
    has_static = node_static is not None
    room = queue_room if queue_room is not None else _zero(device, torch.uint8)
    r = [int(x) for x in level_rank]
    # One warp: a program walks one set of WAYS lines (32 by default), and the barrier between its misses is
    # then a warp's, not a block's.
    _install_misses[(segments,)](
        order, sorted_sets, seg_start, n, unique,
        node_static if has_static else _zero(device, torch.int16), int(has_static),
        tags, records, flags, static_score, last_use, rr_pointer,
        line, evicted_tag, evicted_record, evicted_line, counts,
        iteration, scan_base, threshold, policy, r[0], r[1], r[2], r[3], room,
        0 if queue_room is None else queue_room.numel(), int(known), int(bypass), *window, num_nodes, front,
        limit, WAYS=ways, num_warps=1)
    return line, hit, evicted_tag, evicted_record, evicted_line, counts


#: ids per program of _serve_hits, and the most words of a row it copies at once (a [ids, words] tile)
SERVE_BLOCK, SERVE_TILE_WORDS = 16, 2048


def cache_serve_hits(tags, records, flags, last_use, touched, stamp: int, ways: int, ids, num_rows: int, data,
                     rows, hit, counts, iteration: int, scan_base: int, first_iteration=None, first_position=None,
                     first_rank=None, front: int = 0, limit: int = 0, scalars=None) -> None:
    """The hits of a request, served before anything else: ``hit[i]`` (int8) says whether ``ids[i]`` is cached,
    its line is marked as an assign marks a hit (``_find_hits``), and its row is copied from ``data`` to
    ``rows[i]`` (both ``[lines or n, words]`` views of one word, :func:`lsm_gnn.kernels.row_gather.as_words`). ``counts`` (int32[3], zeroed here)
    gets the positions that missed, the ids outside ``[0, num_rows)`` and the distinct ids that hit, counted by
    stamping their lines in ``touched`` (int32 per line) with ``stamp``, which must differ from every stamp
    there. Misses change nothing: the caller reads ``counts`` and, where any id missed, assigns the batch.
    ``scalars``: an int64[4] tensor on the ids' device holding ``[stamp, iteration, scan_base, front]``, read there
    instead of the arguments (a captured launch, :class:`lsm_gnn.cache.hits_first.ServeGraphs`)."""
    _check_ways(ways)
    if scalars is not None and (scalars.dtype != torch.int64 or scalars.numel() != 4 or scalars.device != ids.device):
        raise ValueError(f"scalars must be an int64 tensor of 4 entries on {ids.device}, got {scalars.dtype} "
                         f"[{scalars.numel()}] on {scalars.device}")
    known, num_nodes, window = _window_arrays(tags.device, first_iteration, first_position, first_rank)
    counts.zero_()
    n = ids.numel()
    if n == 0:
        return
    words = data.shape[1]
    cols = min(triton.next_power_of_2(max(words, 1)), SERVE_TILE_WORDS // SERVE_BLOCK)
    _serve_hits[(triton.cdiv(n, SERVE_BLOCK),)](
        ids, n, num_rows, tags, last_use, flags, records, touched, stamp, data, rows, words, hit, counts,
        tags.numel() // ways, iteration, scan_base, int(known), *window, num_nodes, front, limit,
        counts if scalars is None else scalars, WAYS=ways, BLOCK=SERVE_BLOCK, COLS=cols,
        SCALARS_ON_DEVICE=scalars is not None)
