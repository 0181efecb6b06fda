"""A cache's shape: the sets and ways a capacity buys, the sets that hold a whole file, and the error a batch
larger than the cache raises."""
from __future__ import annotations

import numpy as np

from lsm_gnn.utils.hashing import splitmix64
from lsm_gnn.utils.units import parse_bytes, suggest_bytes

#: a suggested cache holds this many times the distinct ids of the batch it was sized for: batches vary
HEADROOM = 1.25


def set_of(ids, num_sets: int) -> np.ndarray:
    """The set of each id: ``splitmix64(id) % num_sets``, as the C++ and CUDA caches hash ids
    (``csrc/cache/line_state.h``); the reference model and the capacity planner use it to agree with them."""
    return (splitmix64(np.asarray(ids, dtype=np.int64)) % np.uint64(num_sets)).astype(np.int64)


class CacheTooSmall(ValueError):
    """A batch has more distinct ids than the cache has lines (and the cache was not built to oversubscribe).

    ``distinct`` and ``lines`` are the two numbers; ``row_bytes`` sizes a fix; ``key`` is the config key of the
    cache's size (``cache.capacity``, a node embedding table's ``...capacity``), None for a cache built by hand.
    The trainer catches it to name that key instead of this Python API's keywords.
    """

    def __init__(self, distinct: int, lines: int, row_bytes: int, key: str | None = None):
        self.distinct, self.lines, self.row_bytes, self.key = int(distinct), int(lines), int(row_bytes), key
        super().__init__(
            f"this batch has {self.distinct} distinct ids but the cache holds {self.lines} lines "
            f"({self.lines * self.row_bytes} bytes); batches vary, so give it room: capacity="
            f"{suggest_bytes(self.distinct * HEADROOM * self.row_bytes)!r} or more ({HEADROOM:g}x this batch), or "
            "pass oversubscribe=True to run it smaller than a batch (it thrashes)")


def cache_geometry(capacity, row_bytes: int, ways: int, num_rows: int | None = None) -> tuple[int, int]:
    """(num_sets, ways) for a capacity in bytes (or "4G"); lines hold one row each (:func:`cache_sets`).
    Raises ValueError below one set."""
    capacity = parse_bytes(capacity)
    if ways < 1:
        raise ValueError(f"ways must be >= 1, got {ways}")
    num_sets = cache_sets(capacity, row_bytes, ways, num_rows)
    if num_sets < 1:
        raise ValueError(f"a cache of {capacity} bytes holds {capacity // row_bytes} rows of {row_bytes} bytes, fewer "
                         f"than one set of {ways} ways; give it at least {ways * row_bytes} bytes")
    return num_sets, ways


def cache_sets(capacity_bytes: int, row_bytes: int, ways: int, num_rows: int | None = None,
               every_row: bool = False) -> int:
    """The sets of ``ways`` lines a cache of ``capacity_bytes`` over ``num_rows`` rows of ``row_bytes`` gets: the one
    rule every cache is sized by. 0 below :func:`one_set_lines` (the floor): the caller refuses it.

    ``every_row`` (a cache asked for every row, ``100%``) gets :func:`every_row_sets`. A capacity of as many lines
    as rows or more is cut to the fewest sets in which every row has a way of its own (sets are chosen by hash, so
    a little more than ``num_rows`` lines; never more than asked): a cache larger than its file then holds all of
    it without allocating lines that could never be used.
    """
    if every_row:
        return every_row_sets(num_rows, ways)
    lines = capacity_bytes // row_bytes
    if lines < one_set_lines(num_rows, ways):
        return 0
    if num_rows is not None and lines >= num_rows:
        return _sets_holding_every_row(num_rows, ways, max_sets=max(1, lines // ways))
    return lines // ways


def one_set_lines(num_rows: int | None, ways: int) -> int:
    """The fewest lines a cache has: one set of ``ways``, or every row of a file of fewer rows."""
    return ways if num_rows is None else min(ways, num_rows)


#: a cache of the whole file gets at most this many times the file's lines (with few ways, hashed sets need more)
EVERY_ROW_LIMIT = 8


def every_row_sets(num_rows: int, ways: int) -> int:
    """The fewest sets in which every one of ``num_rows`` rows has a way of its own: a cache that holds the
    whole file. Sets are chosen by hash and fill unevenly, so it has more lines than the file has rows
    (1.6x for 10^4 rows, 2.6x for 10^6 with 32 ways: ``docs/cache.md``), at most :data:`EVERY_ROW_LIMIT` x."""
    return _sets_holding_every_row(num_rows, ways, max_sets=EVERY_ROW_LIMIT * max(1, -(-num_rows // ways)))


def _sets_holding_every_row(num_rows: int, ways: int, max_sets: int, chunk: int = 1 << 22) -> int:
    """The fewest sets, from ceil(num_rows / ways) up to ``max_sets``, that no row overflows (or ``max_sets``)."""
    num_sets = max(1, -(-num_rows // ways))
    while num_sets < max_sets:
        occupancy = np.zeros(num_sets, dtype=np.int64)
        for start in range(0, num_rows, chunk):
            occupancy += np.bincount(set_of(np.arange(start, min(start + chunk, num_rows)), num_sets),
                                     minlength=num_sets)
        if occupancy.max() <= ways:
            break
        num_sets = min(max_sets, num_sets + max(1, num_sets // 8))
    return min(num_sets, max_sets)
