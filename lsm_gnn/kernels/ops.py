"""The native ops, each registered once with ``torch.library``; torch picks the implementation by device.

``torch.ops.lsm_gnn.<op>`` runs the C++ core on CPU tensors (in the ``triton`` kernel mode, the Triton
kernel under the interpreter) and the Triton kernel on CUDA tensors.
Callers make one call and never branch on the device.
"""
from __future__ import annotations

import torch
from torch.library import Library, infer_schema

from lsm_gnn.kernels import kernel_mode, triton_module
from lsm_gnn.kernels.layout import NO_ID

_MASK64 = (1 << 64) - 1
# The ops' namespace. Defined with a plain Library rather than torch.library.custom_op: a call then costs
# about 3 us of dispatch instead of 10-40 us (custom_op's Python wrapper), which the cache pays per batch.
_LIBRARY = Library("lsm_gnn", "DEF")


class _Op:
    """One op: its schema inferred from the function's annotations, the function itself registered for
    devices without a kernel (it raises), and a kernel per device added with ``register_kernel``."""

    def __init__(self, fn, mutates_args: tuple[str, ...]):
        self.name = fn.__name__
        _LIBRARY.define(self.name + infer_schema(fn, mutates_args=mutates_args))
        _LIBRARY.impl(self.name, fn, "CompositeExplicitAutograd")
        self.__doc__ = fn.__doc__

    def register_kernel(self, device: str):
        def register(kernel):
            _LIBRARY.impl(self.name, kernel, {"cpu": "CPU", "cuda": "CUDA"}[device])
            return kernel
        return register

    def __call__(self, *args, **kwargs):
        return getattr(torch.ops.lsm_gnn, self.name)(*args, **kwargs)


def custom_op(qualname: str, mutates_args=()):
    """Defines ``lsm_gnn::<name>`` from the decorated function (as ``torch.library.custom_op`` does)."""
    def define(fn):
        assert qualname == f"lsm_gnn::{fn.__name__}", qualname
        return _Op(fn, tuple(mutates_args))
    return define


def _no_kernel(op: str, tensor: torch.Tensor) -> RuntimeError:
    # The op's own body runs only for devices with no kernel registered (MPS, XPU, ...).
    return RuntimeError(f"lsm_gnn::{op} has kernels for CPU and CUDA tensors only, got a {tensor.device.type} "
                        "tensor; move the tensors to the CPU or a CUDA device")
_CACHE_STATE = ("tags", "records", "flags", "static_score", "last_use", "rr_pointer")


@custom_op("lsm_gnn::cache_assign", mutates_args=_CACHE_STATE)
def cache_assign(tags: torch.Tensor, records: torch.Tensor, flags: torch.Tensor, static_score: torch.Tensor,
                 last_use: torch.Tensor, rr_pointer: torch.Tensor, ways: int, unique: torch.Tensor,
                 node_static: torch.Tensor | None, policy: int, iteration: int, scan_base: int, threshold: int,
                 level_rank: list[int], queue_room: torch.Tensor | None, first_iteration: torch.Tensor | None,
                 first_position: torch.Tensor | None, first_rank: torch.Tensor | None, front: int, limit: int,
                 bypass: bool, has_misses: bool, num_threads: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hits, victims and installs of one batch of distinct ids (see ``csrc/cache/cpu_cache.cpp``):
    ``(line, hit, evicted_tag, evicted_record, evicted_line, counts)``, ``counts`` an int64 tensor on the ids'
    device of the valid lines evicted, those of them this batch had used, the misses left uncached (bypassed) and
    the misses: left there, so a caller on a GPU reads them back when it reads other things.
    With a window's first occurrences (``first_*``, ``front``, ``limit`` as :func:`cache_scan` takes them),
    hit and installed lines get their next use now; ``bypass`` then leaves uncached a miss the policy would
    evict before its victim. ``has_misses``: the caller knows some id misses (it served the hits first), so the
    GPU kernel installs without first reading back whether any did; the ids may then end with
    :data:`~lsm_gnn.kernels.layout.NO_ID` entries (distinct ids padded to a size the host knew), which take no
    line and count as hits."""
    raise _no_kernel("cache_assign", tags)


@cache_assign.register_kernel("cpu")
def _(tags, records, flags, static_score, last_use, rr_pointer, ways, unique, node_static, policy, iteration,
      scan_base, threshold, level_rank, queue_room, first_iteration, first_position, first_rank, front, limit,
      bypass, has_misses, num_threads):
    args = (tags, records, flags, static_score, last_use, rr_pointer, ways, unique, node_static, policy, iteration,
            scan_base, threshold, level_rank, queue_room, first_iteration, first_position, first_rank, front, limit,
            bypass)
    if kernel_mode() == "triton":
        return triton_module("cache_assign", on_cpu=True).cache_assign(*args, has_misses=has_misses)
    return native_cache_assign(*args, num_threads)


def native_cache_assign(*args):
    """``_C.cache_assign`` (the op's arguments but ``has_misses``) as the op returns it: its three counts and the
    misses as one int64 tensor."""
    from lsm_gnn import _C

    *assigned, evictions, in_use, bypassed = _C.cache_assign(*args)
    misses = assigned[1].numel() - int(torch.count_nonzero(assigned[1]))
    return (*assigned, torch.tensor([evictions, in_use, bypassed, misses]))


@cache_assign.register_kernel("cuda")
def _(tags, records, flags, static_score, last_use, rr_pointer, ways, unique, node_static, policy, iteration,
      scan_base, threshold, level_rank, queue_room, first_iteration, first_position, first_rank, front, limit,
      bypass, has_misses, num_threads):
    return triton_module("cache_assign", on_cpu=False).cache_assign(
        tags, records, flags, static_score, last_use, rr_pointer, ways, unique, node_static, policy, iteration,
        scan_base, threshold, level_rank, queue_room, first_iteration, first_position, first_rank, front, limit,
        bypass, has_misses=has_misses)


@custom_op("lsm_gnn::cache_serve_hits", mutates_args=("records", "flags", "last_use", "touched", "rows", "hit",
                                                    "counts"))
def cache_serve_hits(tags: torch.Tensor, records: torch.Tensor, flags: torch.Tensor, last_use: torch.Tensor,
                     touched: torch.Tensor, stamp: int, ways: int, ids: torch.Tensor, num_rows: int,
                     data: torch.Tensor, rows: torch.Tensor, hit: torch.Tensor, counts: torch.Tensor, iteration: int,
                     scan_base: int, first_iteration: torch.Tensor | None, first_position: torch.Tensor | None,
                     first_rank: torch.Tensor | None, front: int, limit: int,
                     scalars: torch.Tensor | None = None) -> None:
    """A request's hits served in one kernel, before any other work: each hit's line marked as
    :func:`cache_assign` marks it and its row copied to its position; ``counts`` gets the positions that missed,
    the ids out of range and the distinct ids that hit (:func:`lsm_gnn.kernels.cache_assign.cache_serve_hits`).
    A device op (the C++ core assigns a whole batch faster than it would probe): on CPU tensors it runs the
    Triton kernel under the interpreter (``kernels=triton``), as tests do."""
    raise _no_kernel("cache_serve_hits", tags)


def _serve_hits_kernel(on_cpu: bool):
    def kernel(*args):
        return triton_module("cache_assign", on_cpu=on_cpu).cache_serve_hits(*args)
    return kernel


@cache_serve_hits.register_kernel("cpu")
def _(*args):
    if kernel_mode() != "triton":
        raise RuntimeError("lsm_gnn::cache_serve_hits runs on CUDA tensors, or on CPU tensors under Triton's "
                           "interpreter (lsm_gnn.kernels.using('triton')); a CPU cache assigns whole batches")
    return _serve_hits_kernel(on_cpu=True)(*args)


cache_serve_hits.register_kernel("cuda")(_serve_hits_kernel(on_cpu=False))


@custom_op("lsm_gnn::distinct_ids", mutates_args=())
def distinct_ids(ids: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch.unique(ids, return_inverse=True)`` without reading its size back: the sorted distinct ids padded
    with ``NO_ID`` to ``len(ids)`` (an assign gives padding no line), the inverse, and int64 ``[their number, the
    smallest id, the largest]``, all on the ids' device. Where an id lies outside ``[0, num_rows)`` every entry
    is ``NO_ID``, so an assign changes nothing before the caller reads the range and refuses the batch. ``ids``
    (int64) must not be empty (:func:`lsm_gnn.kernels.compact.distinct_ids`)."""
    raise _no_kernel("distinct_ids", ids)


def check_distinct_ids_input(ids: torch.Tensor) -> None:
    if ids.dtype != torch.int64 or ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(f"distinct_ids takes a non-empty 1-d int64 tensor of ids, got {ids.dtype} of shape "
                         f"{tuple(ids.shape)} (an empty batch has no distinct ids to pad: serve it without)")


@distinct_ids.register_kernel("cpu")
def _(ids, num_rows):
    if kernel_mode() == "triton":
        return triton_module("compact", on_cpu=True).distinct_ids(ids, num_rows)
    check_distinct_ids_input(ids)
    ordered, order = torch.sort(ids)
    first = torch.ones(ids.numel(), dtype=torch.bool)  # of each run of equal ids
    torch.ne(ordered[1:], ordered[:-1], out=first[1:])
    rank = torch.cumsum(first, 0) - 1
    unique = torch.full_like(ids, NO_ID)
    unique.scatter_(0, rank, ordered)  # a run's ids all write the same value to its slot
    facts = torch.stack([rank[-1] + 1, ordered[0], ordered[-1]])
    if facts[1] < 0 or facts[2] >= num_rows:
        unique.fill_(NO_ID)
    inverse = torch.empty_like(rank)
    inverse.scatter_(0, order, rank)
    return unique, inverse, facts


@distinct_ids.register_kernel("cuda")
def _(ids, num_rows):
    return triton_module("compact", on_cpu=False).distinct_ids(ids, num_rows)


@custom_op("lsm_gnn::pack_misses", mutates_args=())
def pack_misses(hit: torch.Tensor, unique: torch.Tensor, line: torch.Tensor, counts: torch.Tensor,
                facts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An assigned batch's misses packed for one read back: int64 ``[counts (4), facts (3 or 4), the missed ids
    (n), their lines (n)]``, each list's first entries the misses in ascending position (the rest undefined),
    and the misses' positions in ``unique`` first (:func:`lsm_gnn.kernels.compact.pack_misses`)."""
    raise _no_kernel("pack_misses", hit)


@pack_misses.register_kernel("cpu")
def _(hit, unique, line, counts, facts):
    if kernel_mode() == "triton":
        return triton_module("compact", on_cpu=True).pack_misses(hit, unique, line, counts, facts)
    order = torch.argsort(hit, stable=True)  # the misses first, in order
    return torch.cat([counts, facts, unique[order], line[order]]), order


@pack_misses.register_kernel("cuda")
def _(hit, unique, line, counts, facts):
    return triton_module("compact", on_cpu=False).pack_misses(hit, unique, line, counts, facts)


@custom_op("lsm_gnn::rows_by_line", mutates_args=("rows",))
def rows_by_line(data: torch.Tensor, line: torch.Tensor, hit: torch.Tensor, inverse: torch.Tensor,
                 rows: torch.Tensor) -> torch.Tensor:
    """A lookup's rows in request order: ``rows[i] = data[line[inverse[i]]]`` (line 0's row where that line is
    -1: the caller overwrites it), and the returned ``hit[inverse]``
    (:func:`lsm_gnn.kernels.row_gather.rows_by_line`)."""
    raise _no_kernel("rows_by_line", data)


@rows_by_line.register_kernel("cpu")
def _(data, line, hit, inverse, rows):
    if kernel_mode() == "triton":
        return triton_module("row_gather", on_cpu=True).rows_by_line(data, line, hit, inverse, rows)
    return native_rows_by_line(data, line, hit, inverse, rows)


def native_rows_by_line(data, line, hit, inverse, rows):
    """The op in torch's CPU ops (four of them)."""
    torch.index_select(data, 0, line[inverse].clamp_min_(0), out=rows)
    return hit[inverse]


@rows_by_line.register_kernel("cuda")
def _(data, line, hit, inverse, rows):
    return triton_module("row_gather", on_cpu=False).rows_by_line(data, line, hit, inverse, rows)


@custom_op("lsm_gnn::cache_scan", mutates_args=("records", "flags"))
def cache_scan(tags: torch.Tensor, records: torch.Tensor, flags: torch.Tensor, first_iteration: torch.Tensor,
               first_position: torch.Tensor, first_rank: torch.Tensor, front: int, limit: int,
               num_threads: int) -> None:
    """The window scan: every valid line's PVP record from a window's per-node first occurrences
    (:meth:`lsm_gnn.cache.WindowBuffer.first_occurrence`), and its fresh mark cleared."""
    raise _no_kernel("cache_scan", tags)


@cache_scan.register_kernel("cpu")
def _(tags, records, flags, first_iteration, first_position, first_rank, front, limit, num_threads):
    args = (tags, records, flags, first_iteration, first_position, first_rank, front, limit)
    if kernel_mode() == "triton":
        return triton_module("window_scan", on_cpu=True).cache_scan(*args)
    from lsm_gnn import _C

    _C.cache_scan(*args, num_threads)


@cache_scan.register_kernel("cuda")
def _(tags, records, flags, first_iteration, first_position, first_rank, front, limit, num_threads):
    triton_module("window_scan", on_cpu=False).cache_scan(tags, records, flags, first_iteration, first_position,
                                                          first_rank, front, limit)


@custom_op("lsm_gnn::victim_enqueue", mutates_args=("count", "node", "record", "data", "tallies"))
def victim_enqueue(count: torch.Tensor, queue_iteration: torch.Tensor, node: torch.Tensor, record: torch.Tensor,
                   data: torch.Tensor, evicted_tag: torch.Tensor, evicted_record: torch.Tensor,
                   evicted_line: torch.Tensor, cache_data: torch.Tensor, iteration: int, scan_base: int,
                   tallies: torch.Tensor, num_threads: int, check: bool = True) -> None:
    """PVP: one batch's victims join the queue of their next use; ``tallies`` (int64 on ``count``'s device)
    gains ``[enqueued, dropped_no_reuse, dropped_full]``, so a GPU cache reads nothing back. ``check``: refuse
    an evicted line outside the cache (on a GPU a read back; a cache passing its own assign's lines skips it)."""
    raise _no_kernel("victim_enqueue", count)


def check_tallies(tallies: torch.Tensor, count: torch.Tensor) -> None:
    """``tallies`` must be where the enqueue adds its outcomes: 3 int64 counters on the queue counts' device."""
    if tallies.dtype != torch.int64 or tuple(tallies.shape) != (3,) or tallies.device != count.device:
        raise ValueError(f"tallies must be an int64 tensor of 3 counters on {count.device} (enqueued, dropped "
                         f"without a next use, dropped by a full queue), got {tallies.dtype} "
                         f"{tuple(tallies.shape)} on {tallies.device}")


def native_victim_enqueue(count, queue_iteration, node, record, data, evicted_tag, evicted_record, evicted_line,
                          cache_data, iteration, scan_base, tallies, num_threads, check=True) -> None:
    """The op on CPU tensors by the C++ core, which always checks (on the host it costs no read back)."""
    from lsm_gnn import _C

    check_tallies(tallies, count)
    outcomes = _C.victim_enqueue(count, queue_iteration, node, record, data, evicted_tag, evicted_record,
                                 evicted_line, cache_data, iteration, scan_base, num_threads)
    tallies.add_(torch.tensor(outcomes, dtype=torch.int64))


@victim_enqueue.register_kernel("cpu")
def _(count, queue_iteration, node, record, data, evicted_tag, evicted_record, evicted_line, cache_data, iteration,
      scan_base, tallies, num_threads, check=True):
    args = (count, queue_iteration, node, record, data, evicted_tag, evicted_record, evicted_line, cache_data,
            iteration, scan_base, tallies)
    if kernel_mode() == "triton":
        return triton_module("victim_enqueue", on_cpu=True).victim_enqueue(*args, check=check)
    native_victim_enqueue(*args, num_threads)


@victim_enqueue.register_kernel("cuda")
def _(count, queue_iteration, node, record, data, evicted_tag, evicted_record, evicted_line, cache_data, iteration,
      scan_base, tallies, num_threads, check=True):
    triton_module("victim_enqueue", on_cpu=False).victim_enqueue(
        count, queue_iteration, node, record, data, evicted_tag, evicted_record, evicted_line, cache_data, iteration,
        scan_base, tallies, check)


@custom_op("lsm_gnn::pvp_match", mutates_args=())
def pvp_match(ids: torch.Tensor, inverse: torch.Tensor, num_unique: int, node: torch.Tensor, record: torch.Tensor,
              check: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PVP serve: which prefetched lines (``node``, ``record``) serve a batch (``ids``, ``inverse`` into its
    ``num_unique`` distinct ids): ``(served, entry, position)`` per distinct id
    (:func:`lsm_gnn.cache.pvp.match_prefetched`). ``check``: refuse an ``inverse`` outside the distinct ids (on a
    GPU a read back; the C++ core always checks)."""
    raise _no_kernel("pvp_match", ids)


@pvp_match.register_kernel("cpu")
def _(ids, inverse, num_unique, node, record, check=True):
    if kernel_mode() == "triton":
        return triton_module("victim_serve", on_cpu=True).pvp_match(ids, inverse, num_unique, node, record,
                                                                    check=check)
    from lsm_gnn import _C

    return _C.pvp_match(ids, inverse, num_unique, node, record)


@pvp_match.register_kernel("cuda")
def _(ids, inverse, num_unique, node, record, check=True):
    return triton_module("victim_serve", on_cpu=False).pvp_match(ids, inverse, num_unique, node, record, check)


@custom_op("lsm_gnn::pvp_install", mutates_args=("cache_data",))
def pvp_install(cache_data: torch.Tensor, pf_rows: torch.Tensor, from_pvp: torch.Tensor, entry: torch.Tensor,
                line: torch.Tensor, check: bool = True) -> None:
    """PVP with reinstall, the matched rows into their new lines: ``cache_data[line[u]] = pf_rows[entry[u]]``
    for each distinct id ``u`` with ``from_pvp[u]`` and a line (``line[u] >= 0``). ``check``: refuse an entry
    outside ``pf_rows`` or a line outside the cache (on a GPU a read back)."""
    raise _no_kernel("pvp_install", cache_data)


def native_pvp_install(cache_data, pf_rows, from_pvp, entry, line, check=True) -> None:
    """The op in torch's CPU ops."""
    filled = torch.nonzero(from_pvp & (line >= 0)).reshape(-1)
    source, target = entry[filled], line[filled]
    if filled.numel() and (source.min() < 0 or source.max() >= pf_rows.shape[0] or target.max() >= cache_data.shape[0]):
        raise ValueError("a served id names an entry outside the prefetch buffer or a line outside the cache")
    cache_data.index_copy_(0, target, pf_rows[source])


@pvp_install.register_kernel("cpu")
def _(cache_data, pf_rows, from_pvp, entry, line, check=True):
    if kernel_mode() == "triton":
        return triton_module("victim_serve", on_cpu=True).pvp_install(cache_data, pf_rows, from_pvp, entry, line,
                                                                      check=check)
    native_pvp_install(cache_data, pf_rows, from_pvp, entry, line)


@pvp_install.register_kernel("cuda")
def _(cache_data, pf_rows, from_pvp, entry, line, check=True):
    triton_module("victim_serve", on_cpu=False).pvp_install(cache_data, pf_rows, from_pvp, entry, line, check)


@custom_op("lsm_gnn::pvp_fill", mutates_args=("cache_data",))
def pvp_fill(ids: torch.Tensor, inverse: torch.Tensor, hit: torch.Tensor, line: torch.Tensor, node: torch.Tensor,
             record: torch.Tensor, pf_rows: torch.Tensor, cache_data: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """PVP with reinstall, after the cache's assign: the prefetched rows of the ids the cache missed
    into their new lines; ``(from_pvp, entry)`` per distinct id (:func:`lsm_gnn.cache.pvp.fill_prefetched`)."""
    raise _no_kernel("pvp_fill", ids)


@pvp_fill.register_kernel("cpu")
def _(ids, inverse, hit, line, node, record, pf_rows, cache_data):
    args = (ids, inverse, hit, line, node, record, pf_rows, cache_data)
    if kernel_mode() == "triton":
        return triton_module("victim_serve", on_cpu=True).pvp_fill(*args)
    from lsm_gnn import _C

    return _C.pvp_fill(*args)


@pvp_fill.register_kernel("cuda")
def _(ids, inverse, hit, line, node, record, pf_rows, cache_data):
    return triton_module("victim_serve", on_cpu=False).pvp_fill(ids, inverse, hit, line, node, record, pf_rows,
                                                                cache_data)


@custom_op("lsm_gnn::pvp_scatter", mutates_args=("rows", "cache_data"))
def pvp_scatter(rows: torch.Tensor, cache_data: torch.Tensor, pf_rows: torch.Tensor, inverse: torch.Tensor,
                from_pvp: torch.Tensor, entry: torch.Tensor, line: torch.Tensor | None, check: bool = True) -> None:
    """PVP scatter: the prefetched rows of the ids served from the victim buffer to all their positions in
    ``rows`` and, with ``line`` (reinstalling), into their new cache lines
    (:func:`lsm_gnn.cache.pvp.scatter_prefetched`). ``check``: refuse a bad index (on a GPU a read back)."""
    raise _no_kernel("pvp_scatter", rows)


@pvp_scatter.register_kernel("cpu")
def _(rows, cache_data, pf_rows, inverse, from_pvp, entry, line, check=True):
    args = (rows, cache_data, pf_rows, inverse, from_pvp, entry, line)
    if kernel_mode() == "triton":
        return triton_module("victim_serve", on_cpu=True).pvp_scatter(*args, check=check)
    from lsm_gnn import _C

    _C.pvp_scatter(*args)


@pvp_scatter.register_kernel("cuda")
def _(rows, cache_data, pf_rows, inverse, from_pvp, entry, line, check=True):
    triton_module("victim_serve", on_cpu=False).pvp_scatter(rows, cache_data, pf_rows, inverse, from_pvp, entry, line,
                                                            check)


@custom_op("lsm_gnn::sample_hops", mutates_args=())
def sample_hops(indptr: torch.Tensor, indices: torch.Tensor, seeds: torch.Tensor, fanouts: list[int], seed: int,
                iteration: int, num_threads: int, num_ids: int = -1) -> list[torch.Tensor]:
    """The sampled hops, flattened: ``[nodes, src, dst]`` per hop (a hop's destinations are the nodes before it).
    ``seed`` is the sampler's 64-bit seed as a signed int64 (torch's int); the kernels read it modulo 2**64.
    Neighbor ids lie in ``[0, num_ids)``: -1 for the CSR's own rows; the source type's count for one hop
    over a relation between two node types."""
    raise _no_kernel("sample_hops", seeds)


def _flatten(hops) -> list[torch.Tensor]:
    return [t for nodes, _, src, dst in hops for t in (nodes, src, dst)]


@sample_hops.register_kernel("cpu")
def _(indptr, indices, seeds, fanouts, seed, iteration, num_threads, num_ids=-1):
    if kernel_mode() == "triton":
        return _flatten(triton_module("sampler", on_cpu=True).sample_hops(indptr, indices, seeds, fanouts, seed,
                                                                     iteration, num_ids))
    from lsm_gnn import _C

    return _flatten(_C.sample_hops(indptr, indices, seeds, fanouts, seed & _MASK64, iteration, num_threads, num_ids))


@sample_hops.register_kernel("cuda")
def _(indptr, indices, seeds, fanouts, seed, iteration, num_threads, num_ids=-1):
    sampler = triton_module("sampler", on_cpu=False)
    return _flatten(sampler.sample_hops(indptr, indices, seeds, fanouts, seed, iteration, num_ids))


def hops_of(flat: list[torch.Tensor], num_seeds: int) -> list[tuple[torch.Tensor, int, torch.Tensor, torch.Tensor]]:
    """``sample_hops``'s flat list as ``(nodes, num_dst, src, dst)`` per hop."""
    hops, num_dst = [], num_seeds
    for k in range(0, len(flat), 3):
        nodes, src, dst = flat[k:k + 3]
        hops.append((nodes, num_dst, src, dst))
        num_dst = nodes.numel()
    return hops
