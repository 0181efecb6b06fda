"""Builds a CSR from a stream of edges in memory bounded by the node count, never by the edge count.

:func:`build_csr_files` is an external bucket sort:

1. **Bucket.** Every (dst, src) pair goes to the bucket file of its
   destination's row range (rows ``[b * rows_per_bucket, ...)``), appended in
   arrival order; a per-row count is kept (8 bytes a row, the one array that
   grows with the graph). Pairs are stored as int32 where both id spaces fit
   (8 bytes a pair), else int64.
2. **Sort and write.** Bucket by bucket, in row order, the pairs are read
   back, sorted by row (and by neighbor, for ``dedup``), duplicates dropped,
   and the neighbor ids appended to ``indices.npy`` by plain sequential
   writes. A bucket holding more than ``BUCKET_EDGES`` pairs is read in row
   groups that each hold at most that many (one row more only when a single
   row is larger), so memory stays bounded whatever the degree distribution.

Nothing is written through a memory map: pages written at random through a
map stay dirty and resident (counted in the process's memory, and in a memory
cgroup's) until the kernel writes them back, which for a 10^8-node graph is
gigabytes. The output is byte for byte what sorting all edges at once would
give: rows in order, each row's neighbors sorted and unique with ``dedup``,
else in arrival order.
"""
from __future__ import annotations

import io
import os
from typing import Callable, Iterable

import numpy as np

from lsm_gnn.utils.fileio import CheckedFile

EDGE_CHUNK = 1 << 22     # edges per chunk when passing over edges; bounds memory to ~100 MB
BUCKET_EDGES = 1 << 23   # CSR entries sorted in memory at once (~50 bytes each while sorting: ~400 MB)
MAX_BUCKETS = 256        # bucket files open at once while bucketing
_GUESSED_DEGREE = 16     # CSR entries per row assumed when the caller gives no expected edge count


def index_dtype_for(num_nodes: int) -> np.dtype:
    """int32 neighbor ids while they fit (halves the topology), else int64."""
    return np.dtype(np.int32) if num_nodes < 2**31 else np.dtype(np.int64)


def npy_header(dtype, length: int) -> bytes:
    """The header ``np.save`` writes before a 1-D array of ``length`` items of ``dtype``."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        out, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": (length,)})
    return out.getvalue()


class NpyAppender:
    """Writes a 1-D ``.npy`` file of a length learnt only at the end, by appending: the header's room is
    reserved first and filled by :meth:`finish` (a 1-D header has the same size for every length)."""

    def __init__(self, path: str, dtype):
        self.path, self.dtype, self.length = path, np.dtype(dtype), 0
        self._reserved = len(npy_header(self.dtype, 0))
        self._file = CheckedFile(path)
        self._file.write(bytes(self._reserved))

    def append(self, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=self.dtype)
        self._file.write(values.data)
        self.length += values.size

    def finish(self) -> int:
        """Writes the header; returns the length."""
        header = npy_header(self.dtype, self.length)
        if len(header) != self._reserved:  # numpy pads 1-D headers to 128 bytes for any length below 10**50
            raise RuntimeError(f"{self.path}: the .npy header of length {self.length} takes {len(header)} bytes, "
                               f"not the {self._reserved} reserved; this numpy version pads headers differently")
        os.pwrite(self._file.fileno(), header, 0)
        self._file.close()
        return self.length

    def close(self) -> None:
        self._file.close()


def build_csr_files(directory: str, prefix: str, chunks: Iterable[tuple[np.ndarray, np.ndarray]], num_rows: int,
                    num_cols: int, *, undirected: bool = False, dedup: bool = True, self_loops: bool = True,
                    expected_edges: int | None = None, note: Callable[[str], None] | None = None) -> int:
    """Builds a CSR from (src, dst) edge chunks in bounded memory; returns the number of edges.

    Messages flow src -> dst, so dst's row lists src: destinations lie in ``[0, num_rows)``, sources in
    ``[0, num_cols)``. ``undirected`` adds the reverse of every edge (only where both ends share one id
    space); ``dedup`` removes parallel edges; ``self_loops=False`` drops edges v -> v. Writes
    ``<prefix>indptr.npy`` (int64) and ``<prefix>indices.npy`` (:func:`index_dtype_for` ``num_cols``).

    Memory: 8 bytes a row plus ``O(BUCKET_EDGES + EDGE_CHUNK)``. Disk, besides the output: the bucket
    files, 8 bytes an entry (16 past 2**31 ids), each removed once written out. ``expected_edges`` (edges in
    ``chunks``, before ``undirected`` doubles them) sizes the buckets; a wrong guess costs time, not memory.
    ``note``, if given, is told when the second pass starts (a progress line).
    """
    if undirected and num_rows != num_cols:
        raise ValueError("undirected edges need sources and destinations of one node type")
    pair_dtype = np.dtype(np.int32) if max(num_rows, num_cols) < 2**31 else np.dtype(np.int64)
    entries = (expected_edges * (2 if undirected else 1) if expected_edges is not None
               else num_rows * _GUESSED_DEGREE)
    num_buckets = int(max(1, min(MAX_BUCKETS, -(-entries // BUCKET_EDGES), num_rows)))
    rows_per_bucket = max(1, -(-num_rows // num_buckets))
    bucket_path = [os.path.join(directory, f"{prefix}edges.{b:04d}.spill") for b in range(num_buckets)]
    counts = np.zeros(num_rows, dtype=np.int64)
    files: dict[int, CheckedFile] = {}
    try:
        for dst, src in _checked_pairs(chunks, num_rows, num_cols, undirected, self_loops):
            uniq, cnt = np.unique(dst, return_counts=True)
            counts[uniq] += cnt
            pairs = np.stack([dst, src], axis=1).astype(pair_dtype)
            if num_buckets == 1:
                _bucket_file(files, 0, bucket_path).write(pairs)
                continue
            bucket = dst // rows_per_bucket
            order = np.argsort(bucket, kind="stable")  # stable: each bucket keeps the arrival order
            bounds = np.searchsorted(bucket[order], np.arange(num_buckets + 1))
            for b in np.flatnonzero(np.diff(bounds)):
                _bucket_file(files, int(b), bucket_path).write(pairs[order[bounds[b]:bounds[b + 1]]])
    finally:
        for f in files.values():
            f.close()
    if note is not None:
        note(f"sorting {int(counts.sum()):,} CSR entries into rows ({len(files)} buckets)")
    indices = NpyAppender(os.path.join(directory, prefix + "indices.npy"), index_dtype_for(num_cols))
    try:
        for b in range(num_buckets):
            first, end = b * rows_per_bucket, min((b + 1) * rows_per_bucket, num_rows)
            if b not in files:
                continue  # no edge ends in these rows: their counts are zero
            for group_first, group_end in _row_groups(counts, first, end):
                rows, cols = _read_rows(bucket_path[b], pair_dtype, group_first, group_end,
                                        whole=(group_first, group_end) == (first, end))
                cols, per_row = _sorted_row_lists(rows - group_first, cols, group_end - group_first, dedup)
                indices.append(cols)
                counts[group_first:group_end] = per_row
            os.remove(bucket_path[b])
        num_edges = indices.finish()
    finally:
        indices.close()
    with CheckedFile(os.path.join(directory, prefix + "indptr.npy")) as out:
        out.write(npy_header(np.int64, num_rows + 1))
        out.write(np.zeros(1, dtype=np.int64))
        out.write(np.cumsum(counts, out=counts))
    return num_edges


def _checked_pairs(chunks, num_rows: int, num_cols: int, undirected: bool, self_loops: bool):
    """(dst, src) int64 arrays of each non-empty chunk, ids checked, self loops dropped and reverses added
    as asked."""
    for src, dst in chunks:
        src = np.asarray(src, dtype=np.int64).reshape(-1)
        dst = np.asarray(dst, dtype=np.int64).reshape(-1)
        if src.shape != dst.shape:
            raise ValueError(f"edge chunk has {src.size} sources but {dst.size} destinations")
        if src.size == 0:
            continue
        for ends, bound, side in ((src, num_cols, "source"), (dst, num_rows, "destination")):
            lo, hi = int(ends.min()), int(ends.max())
            if lo < 0 or hi >= bound:
                raise ValueError(f"edge {side} {lo if lo < 0 else hi} is outside [0, {bound}); "
                                 "check num_nodes or the edge list")
        if not self_loops:
            keep = src != dst
            src, dst = src[keep], dst[keep]
            if src.size == 0:  # a chunk of self loops only
                continue
        if undirected:
            src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
        yield dst, src


def _bucket_file(files: dict, b: int, paths: list[str]) -> CheckedFile:
    if b not in files:
        files[b] = CheckedFile(paths[b])
    return files[b]


def _row_groups(counts: np.ndarray, first: int, end: int):
    """``(first, end)`` row ranges covering ``[first, end)``, each holding at most ``BUCKET_EDGES`` entries
    (or one row, when that row alone holds more)."""
    if int(counts[first:end].sum()) <= BUCKET_EDGES:
        yield first, end
        return
    cumulative = np.cumsum(counts[first:end])
    start, done = first, 0
    while start < end:
        stop = first + int(np.searchsorted(cumulative, done + BUCKET_EDGES, side="right"))
        stop = min(max(stop, start + 1), end)
        yield start, stop
        done = int(cumulative[stop - first - 1])
        start = stop


def _read_rows(path: str, pair_dtype: np.dtype, first: int, end: int, whole: bool) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) int64 of a bucket file's pairs whose row lies in ``[first, end)``, in file order. ``whole``:
    the file holds only such rows, so read it at once; else scan it in chunks."""
    if whole:
        pairs = np.fromfile(path, dtype=pair_dtype).reshape(-1, 2)
        return pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.int64)
    rows, cols = [], []
    with open(path, "rb") as f:
        while True:
            pairs = np.fromfile(f, dtype=pair_dtype, count=2 * EDGE_CHUNK).reshape(-1, 2)
            if pairs.size == 0:
                break
            keep = (pairs[:, 0] >= first) & (pairs[:, 0] < end)
            rows.append(pairs[keep, 0].astype(np.int64))
            cols.append(pairs[keep, 1].astype(np.int64))
    return np.concatenate(rows), np.concatenate(cols)


def _sorted_row_lists(rows: np.ndarray, cols: np.ndarray, num_rows: int, dedup: bool) -> tuple[np.ndarray, np.ndarray]:
    """The neighbor lists of rows ``[0, num_rows)`` concatenated in row order, and their lengths: each
    list sorted and unique with ``dedup``, else in the given order."""
    if not dedup:
        order = np.argsort(rows, kind="stable")
        return cols[order], np.bincount(rows, minlength=num_rows)
    span = int(cols.max()) + 1 if cols.size else 1
    if num_rows <= (2**63 - 1) // span:
        keys = np.sort(rows * span + cols)  # one key sorts by (row, neighbor)
        keep = np.ones(keys.size, dtype=bool)
        keep[1:] = keys[1:] != keys[:-1]
        keys = keys[keep]
        rows, cols = keys // span, keys % span
    else:
        order = np.lexsort((cols, rows))
        rows, cols = rows[order], cols[order]
        keep = np.ones(cols.size, dtype=bool)
        keep[1:] = (cols[1:] != cols[:-1]) | (rows[1:] != rows[:-1])
        rows, cols = rows[keep], cols[keep]
    return cols, np.bincount(rows, minlength=num_rows)
