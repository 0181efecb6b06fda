"""A durable on-disk table of fixed-size rows that training writes in place: trainable embeddings on SSD.

A table is a directory::

    table.json     format name and version, num_rows, row_bytes, row_stride, file_bytes, the
                   committed ``generation`` and the caller's ``layout`` (an opaque JSON object)
    table.bin      num_rows rows of ``row_stride`` bytes (:func:`~lsm_gnn.data.format.row_stride_for`:
                   packed small rows or 512-aligned large ones), zero padded, padded to a whole page
    undo.<rank>.log   one undo journal per writing rank (below)

Rows are opaque bytes here (``dtype="uint8"``, ``dim=row_bytes``); only the embedding layer knows what
they hold. Reads are :class:`~lsm_gnn.storage.native.NativeStorage`'s (the ``pread`` reader, buffered by
default so that it sees the writes, which go through the page cache).

**Generations.** The table between two checkpoints is one generation. A checkpoint ends generation ``g``
and starts ``g + 1`` in this order: every rank writes its dirty rows and calls :meth:`EmbeddingTable.sync`;
the caller writes its checkpoint, recording ``g + 1``; rank 0 calls :meth:`~EmbeddingTable.set_generation`
``(g + 1)``; every rank calls :meth:`~EmbeddingTable.reset_journal` ``(g + 1)``. A rank writes nothing
between its ``sync`` and its ``reset_journal``.

**Undo journal.** Before the first overwrite of a row in a generation, :meth:`~EmbeddingTable.write`
appends the row's before-image (its committed bytes) to the rank's journal and commits it, then
overwrites the row with ``pwrite``. Format (little endian)::

    header (40 bytes): magic b"LSMUNDO1", uint32 format version (2), uint32 row_bytes, int64 generation,
                       int64 records committed, uint32 crc32 chained over the committed records' bytes,
                       uint32 crc32 of the 36 bytes before it
    record (12 + row_bytes bytes each): int64 row id, uint32 crc32 of (id bytes + row bytes), row bytes

A commit fsyncs the appended records, then rewrites the header with the new count and chained crc and
fsyncs again; only then is any row they protect overwritten. So every committed record is needed and
must be intact, and a record after the committed ones (a crash before its commit) protects no
overwritten row. A journal is made whole (temporary file, fsync, rename), so one on disk always has a
header. table.json's ``writers`` counts the ranks that write the table; each has its journal from the
moment it opens the table until the next recovery replaces it.

**Recovery** to generation ``E`` (the checkpoint's; by default the one table.json records), by the rank
that opens with ``recover=True``, over every ``undo.*.log``. First everything is checked, and any damage is
refused with a :class:`TableError` naming the file (a partly valid journal is never applied): a missing
journal of a rank below ``writers``; a damaged header; fewer records than the header commits; a committed
record whose crc does not match; committed records whose chained crc does not; a row outside the table.
Then:

- journal generation == E: the generation's rows were being overwritten. Every committed record's
  before-image is written back; table.bin is fsynced.
- journal generation < E: stale (the table was synced and the checkpoint for E written after it).
- journal generation > E, or table.json generation > E: the table is newer than the checkpoint and
  cannot be rolled back that far: :class:`TableError`.

Then every journal is replaced by an empty one of generation ``E`` (one for each rank about to write), and
table.json records ``E`` and the new ``writers``; journals of ranks beyond them are deleted last. Each step is
idempotent, so a crash during recovery is recovered by the next open.

Ranks write disjoint rows within a generation (each row has one owner); a row in two journals of one
generation cannot be ordered, and recovery refuses it with a :class:`TableError`.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import struct
import tempfile
import time
import types
import zlib
from dataclasses import asdict, dataclass

import numpy as np
import torch

from lsm_gnn.data.format import PAGE_SIZE, FeatureLayout, feature_file_bytes, row_stride_for, row_stride_problem
from lsm_gnn.fileio import (
    CheckedFile, RunLock, atomic_write_bytes, contained_path, fsync_path, remove_stale_temporaries,
    reporting_disk_full, temp_prefix,
)
from lsm_gnn.ids import as_id_tensor
from lsm_gnn.storage.native import NativeStorage
from lsm_gnn.storage.table_files import DATA_FILE, FRESH_FIX, META_FILE, TableError, pwrite_all, write_runs

FORMAT_NAME = "lsm-gnn-embedding-table"
FORMAT_VERSION = 1
JOURNAL_MAGIC = b"LSMUNDO1"
JOURNAL_VERSION = 2
# magic, version, row_bytes, generation, records committed, crc32 chained over their bytes, crc32 of the fields before
_HEADER = struct.Struct("<8sIIqqII")
_HEADER_CRC_SPAN = _HEADER.size - 4
_V1_HEADER = struct.Struct("<8sIIqI4x")  # version 1: no count, no chained crc (read only to replace an empty one)
_RECORD_PREFIX = 12                   # int64 id + uint32 crc32, then the row
_JOURNAL_NAME = re.compile(r"undo\.(\d+)\.log")
_RECOVER_CHUNK_BYTES = 16 << 20       # journal bytes read per step of recovery
assert _HEADER.size == 40 and _V1_HEADER.size == 32

__all__ = ["EmbeddingTable", "TableError", "WriteStats"]


@dataclass
class WriteStats:
    """Write counters since open (or the last ``reset_stats``).

    ``bytes_written`` counts what went to table.bin (a run of consecutive packed rows includes the
    padding between them); ``journal_bytes`` the records appended to the journal. ``journal_seconds``
    covers reading the before-images, appending and fsyncing them; ``write_seconds`` the row writes.
    The before-image reads also count in ``stats()``, as reads of the file.
    """

    rows_written: int = 0
    bytes_written: int = 0
    journal_rows: int = 0
    journal_bytes: int = 0
    write_seconds: float = 0.0
    journal_seconds: float = 0.0


class _RowSet:
    """A set of row ids in [0, num_rows) as one bit per row."""

    def __init__(self, num_rows: int):
        self._bits = np.zeros((num_rows + 7) // 8, dtype=np.uint8)

    def contains(self, ids: np.ndarray) -> np.ndarray:
        return ((self._bits[ids >> 3] >> (ids & 7).astype(np.uint8)) & 1).astype(bool)

    def add(self, ids: np.ndarray) -> None:
        np.bitwise_or.at(self._bits, ids >> 3, np.left_shift(1, ids & 7).astype(np.uint8))

    def update(self, other: "_RowSet") -> None:
        self._bits |= other._bits

    def intersects(self, other: "_RowSet") -> bool:
        return bool((self._bits & other._bits).any())

    def clear(self) -> None:
        self._bits.fill(0)


def _record_dtype(row_bytes: int) -> np.dtype:
    return np.dtype([("id", "<i8"), ("crc", "<u4"), ("row", np.uint8, (row_bytes,))])  # packed: 12 + row_bytes


def _record_crcs(records: np.ndarray) -> np.ndarray:
    """crc32 of (id bytes + row bytes) of every record."""
    raw = records.view(np.uint8).reshape(len(records), records.dtype.itemsize)
    return np.fromiter((zlib.crc32(r[_RECORD_PREFIX:], zlib.crc32(r[:8])) for r in raw), dtype=np.uint32,
                       count=len(records))


def _journal_header(row_bytes: int, generation: int, count: int = 0, chain: int = 0) -> bytes:
    fields = _HEADER.pack(JOURNAL_MAGIC, JOURNAL_VERSION, row_bytes, generation, count, chain, 0)[:_HEADER_CRC_SPAN]
    return fields + struct.pack("<I", zlib.crc32(fields))


@dataclass(frozen=True)
class _JournalHeader:
    generation: int
    count: int  # records committed: their rows may have been overwritten
    chain: int  # crc32 over the committed records' bytes, in order


def _read_journal_header(path: str, row_bytes: int) -> _JournalHeader:
    """A journal's header; TableError naming the file when it is damaged or no journal of this table."""
    with open(path, "rb") as fh:
        raw = fh.read(_HEADER.size + 1)
    lost = f"the rows it protects cannot be rolled back: {FRESH_FIX}"
    if len(raw) < 12 or raw[:8] != JOURNAL_MAGIC:
        what = "is shorter than its header" if len(raw) < 12 else "is not an undo journal (bad magic)"
        raise TableError(f"{path}: the undo journal {what}; {lost}")
    version = struct.unpack_from("<I", raw, 8)[0]
    if version == 1 and len(raw) == _V1_HEADER.size:  # an empty journal of lsm-gnn before 0.3: nothing to undo
        _, _, journal_row_bytes, generation, crc = _V1_HEADER.unpack(raw)
        if crc == zlib.crc32(raw[:_V1_HEADER.size - 8]) and journal_row_bytes == row_bytes:
            return _JournalHeader(generation, 0, 0)
    if version != JOURNAL_VERSION:
        raise TableError(f"{path}: undo journal format version {version}, this lsm-gnn reads version "
                         f"{JOURNAL_VERSION}; open the table with the lsm-gnn that wrote it")
    if len(raw) < _HEADER.size:
        raise TableError(f"{path}: the undo journal is shorter than its {_HEADER.size}-byte header; {lost}")
    raw = raw[:_HEADER.size]
    _, _, journal_row_bytes, generation, count, chain, crc = _HEADER.unpack(raw)
    if crc != zlib.crc32(raw[:_HEADER_CRC_SPAN]) or count < 0:
        raise TableError(f"{path}: the undo journal's header is damaged (its checksum does not match); {lost}")
    if journal_row_bytes != row_bytes:
        raise TableError(f"{path}: the undo journal holds rows of {journal_row_bytes} bytes, the table rows of "
                         f"{row_bytes}; it belongs to another table: {FRESH_FIX}")
    return _JournalHeader(generation, count, chain)


def _journal_chunks(journal: str, header: _JournalHeader, meta: dict):
    """The committed records of ``journal`` in chunks of at most :data:`_RECOVER_CHUNK_BYTES`."""
    dtype = _record_dtype(meta["row_bytes"])
    per_chunk = max(1, _RECOVER_CHUNK_BYTES // dtype.itemsize)
    with open(journal, "rb") as fh:
        fh.seek(_HEADER.size)
        for start in range(0, header.count, per_chunk):
            n = min(per_chunk, header.count - start)
            yield start, np.frombuffer(fh.read(n * dtype.itemsize), dtype=dtype)


def _check_journal(journal: str, header: _JournalHeader, meta: dict) -> _RowSet:
    """Proves every committed record of ``journal`` intact (each record's crc, the chained crc over all of them,
    ids inside the table) before any is applied; returns the rows they hold. A record appended after the last
    commit is ignored: the journal is committed before any row it protects is overwritten."""
    rows, chain = _RowSet(meta["num_rows"]), 0
    if header.count == 0:
        return rows
    lost = f"the rows it protects cannot be rolled back: {FRESH_FIX}"
    record_bytes = _record_dtype(meta["row_bytes"]).itemsize
    have = (os.path.getsize(journal) - _HEADER.size) // record_bytes
    if have < header.count:
        raise TableError(f"{journal}: the undo journal was cut short: its header commits {header.count} records, "
                         f"the file holds {have}; {lost}")
    for start, records in _journal_chunks(journal, header, meta):
        bad = np.flatnonzero(_record_crcs(records) != records["crc"])
        if len(bad):
            raise TableError(f"{journal}: record {start + int(bad[0])} of {header.count} is damaged (its checksum "
                             f"does not match); {lost}")
        ids = records["id"].astype(np.int64)
        outside = ids[(ids < 0) | (ids >= meta["num_rows"])]
        if len(outside):
            raise TableError(f"{journal}: a record names row {int(outside[0])}, outside the table's "
                             f"{meta['num_rows']} rows; the journal is not this table's: {FRESH_FIX}")
        chain = zlib.crc32(records.tobytes(), chain)
        rows.add(ids)
    if chain != header.chain:
        raise TableError(f"{journal}: the undo journal's records do not match the checksum its header commits "
                         f"(a record was changed, reordered or replaced); {lost}")
    return rows


def _check_init_rows(rows, start: int, stop: int, row_bytes: int) -> np.ndarray:
    if isinstance(rows, torch.Tensor):
        rows = rows.cpu().numpy()
    rows = np.asarray(rows)
    if rows.dtype != np.uint8 or rows.shape != (stop - start, row_bytes):
        raise ValueError(f"init({start}, {stop}) must return a uint8 array of shape ({stop - start}, {row_bytes}) "
                         f"(one row of row_bytes per table row), got {rows.dtype} {tuple(rows.shape)}")
    return np.ascontiguousarray(rows)


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _load_meta(path: str) -> dict:
    """table.json of table directory ``path``, validated against table.bin; TableError naming the problem."""
    if not os.path.isdir(path):
        raise TableError(f"{path}: no embedding table here (no such directory); check the path, or "
                         f"create the table with EmbeddingTable.create")
    fix = f"{FRESH_FIX} (delete {path} and create it again)"
    for name in (META_FILE, DATA_FILE, *(n for n in os.listdir(path) if _JOURNAL_NAME.fullmatch(n))):
        contained_path(path, name, TableError, fix="a table's files must be in its directory, not links out of it")
    meta_path = os.path.join(path, META_FILE)
    try:
        with open(meta_path) as fh:
            meta = json.load(fh)
    except FileNotFoundError:
        raise TableError(f"{meta_path} is missing: {path} is no embedding table (or a copy of one lost it); "
                         f"{fix}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TableError(f"{meta_path} is not valid JSON ({exc}); {fix}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise TableError(f"{meta_path}: format is {found!r}, expected {FORMAT_NAME!r}; this is no embedding "
                         f"table's metadata; {fix}")
    if meta.get("version") != FORMAT_VERSION:
        raise TableError(f"{meta_path}: format version {meta.get('version')!r}, this lsm-gnn reads version "
                         f"{FORMAT_VERSION}; open the table with the lsm-gnn that wrote it")
    for key, low in (("num_rows", 1), ("row_bytes", 1), ("row_stride", 1), ("file_bytes", 1), ("generation", 0)):
        value = meta.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise TableError(f"{meta_path}: {key} must be an integer >= {low}, got {value!r}; {fix}")
    writers = meta.get("writers", 1)
    if isinstance(writers, bool) or not isinstance(writers, int) or writers < 1:
        raise TableError(f"{meta_path}: writers must be an integer >= 1, got {writers!r}; {fix}")
    if not isinstance(meta.get("layout"), dict):
        raise TableError(f"{meta_path}: layout must be a JSON object, got {meta.get('layout')!r}; {fix}")
    problem = row_stride_problem(meta["row_bytes"], meta["row_stride"])
    if problem:
        raise TableError(f"{meta_path}: {problem}; {fix}")
    expected = feature_file_bytes(meta["num_rows"], meta["row_stride"])
    if meta["file_bytes"] != expected:
        raise TableError(f"{meta_path}: file_bytes={meta['file_bytes']} disagrees with num_rows={meta['num_rows']} "
                         f"rows of row_stride={meta['row_stride']} ({expected} bytes with page padding); {fix}")
    data_path = os.path.join(path, DATA_FILE)
    try:
        size = os.path.getsize(data_path)
    except FileNotFoundError:
        raise TableError(f"{data_path} is missing: the table's rows are gone; {fix}") from None
    if size != expected:
        what = "truncated" if size < expected else "longer than its metadata says"
        raise TableError(f"{data_path} is {what}: {size} bytes, but {meta_path} records {meta['num_rows']} rows of "
                         f"{meta['row_stride']} bytes ({expected} bytes); {fix}")
    return meta


class EmbeddingTable(NativeStorage):
    """A table of ``num_rows`` rows of ``row_bytes`` raw bytes, read like features and written in place
    under an undo journal (see the module docstring). Make one with :meth:`create`, open one with
    :meth:`open`.

    ``read(ids)`` / ``read_into`` are :class:`~lsm_gnn.storage.base.FeatureStorage`'s: ``read(ids)[i]``
    equals the bytes of row ``ids[i]`` as last written. One thread writes; reads of rows not being written
    may run beside it.
    """

    writable = True

    def __init__(self, path: str, meta: dict, *, rank: int, direct: bool):
        """Internal: :meth:`open` validates ``meta`` and recovers first."""
        self.rank = rank
        self.layout = meta["layout"]
        self.generation = meta["generation"]
        self.row_stride = meta["row_stride"]
        data_path = os.path.join(path, DATA_FILE)
        features = FeatureLayout(file=DATA_FILE, dtype="uint8", dim=meta["row_bytes"], row_bytes=meta["row_bytes"],
                                 row_stride=meta["row_stride"], page_size=PAGE_SIZE, file_bytes=meta["file_bytes"])
        view = types.SimpleNamespace(num_nodes=meta["num_rows"], features=features, feature_path=data_path)
        super().__init__(view, "pread", direct=direct)
        self.backend = "table"
        self.path = path  # NativeStorage names its file `path`; here it is the table's directory
        self.data_path = data_path
        self.journal_path = os.path.join(path, f"undo.{rank}.log")
        self._record_dtype = _record_dtype(self.row_bytes)
        self._journaled = _RowSet(self.num_rows)
        self._writes = WriteStats()
        self._journal_fd: int | None = None
        self._journal_end = 0
        self._journal_count = 0  # records appended this generation
        self._journal_chain = 0  # crc32 chained over their bytes
        self._journal_unsynced = False  # records appended and not yet committed
        self._fd = os.open(data_path, os.O_RDWR)  # _load_meta proved it inside the directory
        self._run_lock = None  # rank 0's RunLock, set by open

    # -- making and opening --------------------------------------------------------------------------------

    @classmethod
    def create(cls, path, num_rows: int, row_bytes: int, init, *, layout: dict, chunk_rows: int = 1 << 16,
               progress: bool = False) -> "EmbeddingTable":
        """Creates table directory ``path`` with rows ``init(start, stop)`` (a uint8 ``[stop - start,
        row_bytes]`` array, asked for in chunks of ``chunk_rows``) at generation 0, and opens it as rank 0.

        The directory appears whole or not at all (built in a temporary sibling, then renamed). ``layout`` is
        stored as given, for callers to compare when they open the table.
        """
        path = os.path.abspath(os.fspath(path))
        num_rows, row_bytes = _positive_int(num_rows, "num_rows"), _positive_int(row_bytes, "row_bytes")
        chunk_rows = _positive_int(chunk_rows, "chunk_rows")
        if row_bytes >= 1 << 32:  # the journal header holds it in 32 bits
            raise ValueError(f"row_bytes must be below 4 GiB, got {row_bytes}")
        if not isinstance(layout, dict):
            raise ValueError(f"layout must be a dict (stored in {META_FILE}), got {type(layout).__name__}")
        if os.path.lexists(path):
            raise TableError(f"{path} already exists; open it with EmbeddingTable.open, or delete it or choose "
                             f"another path to create a new table")
        stride = row_stride_for(row_bytes)
        meta = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "num_rows": num_rows, "row_bytes": row_bytes,
                "row_stride": stride, "file_bytes": feature_file_bytes(num_rows, stride), "generation": 0,
                "layout": layout}
        try:
            meta_bytes = json.dumps(meta, indent=1).encode()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"layout must be JSON serializable (it is stored in {META_FILE}): {exc}") from None
        parent = os.path.dirname(path)
        os.makedirs(parent, exist_ok=True)
        remove_stale_temporaries(path)
        tmp = tempfile.mkdtemp(prefix=temp_prefix(path), dir=parent)
        try:
            _write_rows_file(os.path.join(tmp, DATA_FILE), meta, init, chunk_rows, progress)
            with CheckedFile(os.path.join(tmp, META_FILE), size=len(meta_bytes)) as fh:
                fh.write(meta_bytes)
                fh.close(sync=True)
            fsync_path(tmp)
            if os.path.lexists(path):
                raise TableError(f"{path} appeared while the table was being created (another writer?); delete "
                                 f"it or choose another path")
            os.rename(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_path(parent)
        return cls.open(path)

    @classmethod
    def open(cls, path, *, rank: int = 0, expect_generation: int | None = None, recover: bool = True,
             direct: bool = False, world_size: int = 1) -> "EmbeddingTable":
        """Opens table directory ``path`` as ``rank`` (whose journal is ``undo.<rank>.log``).

        With ``recover=True`` every journal in the directory is first rolled back to ``expect_generation``
        (None: the generation table.json records), see the module docstring. With several ranks, rank 0
        opens with ``recover=True`` and ``world_size`` (the ranks that will write: each gets its journal now),
        the others, after a barrier, with ``recover=False``. Rank 0 holds the table's lock until :meth:`close`.
        Every problem raises :class:`TableError` naming the file and the fix.
        """
        path = os.path.abspath(os.fspath(path))
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank must be a non-negative integer, got {rank!r}")
        if expect_generation is not None and (isinstance(expect_generation, bool)
                                              or not isinstance(expect_generation, int) or expect_generation < 0):
            raise ValueError(f"expect_generation must be None or a non-negative integer, got {expect_generation!r}")
        meta = _load_meta(path)
        # Rank 0 holds the table for its run (the other ranks open it after rank 0, inside the same run): a second
        # run's rank 0 is refused before it rolls back or writes anything.
        lock = RunLock(path, "the embedding table") if rank == 0 else None
        try:
            if recover:
                meta = _recover(path, meta, meta["generation"] if expect_generation is None else expect_generation,
                                _positive_int(world_size, "world_size"))
            elif expect_generation is not None and meta["generation"] != expect_generation:
                raise TableError(f"{os.path.join(path, META_FILE)} records generation {meta['generation']}, the "
                                 f"checkpoint generation {expect_generation}; open the table on rank 0 with "
                                 f"recover=True (before the barrier) so it is rolled to the checkpoint first")
            table = cls(path, meta, rank=rank, direct=direct)
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        table._run_lock = lock
        try:
            table._start_journal(check_existing=not recover)
        except BaseException:
            table.close()
            raise
        return table

    # -- writing -------------------------------------------------------------------------------------------

    def write(self, ids, rows) -> None:
        """Writes ``rows[i]`` (uint8 ``[len(ids), row_bytes]``, a CPU tensor or array) as row ``ids[i]``
        (distinct ids). Rows not yet overwritten in this generation are journaled first (one fsync)."""
        if self._closed:
            raise RuntimeError("EmbeddingTable is closed")
        ids = as_id_tensor(ids).numpy()
        if isinstance(rows, torch.Tensor):
            if rows.device.type != "cpu":
                raise ValueError(f"rows must be on the CPU, got a tensor on {rows.device}; pass rows.cpu()")
            rows = rows.detach().numpy()
        rows = np.asarray(rows)
        if rows.dtype != np.uint8 or rows.shape != (len(ids), self.row_bytes):
            raise ValueError(f"rows must be uint8 of shape ({len(ids)}, {self.row_bytes}) (one row of row_bytes "
                             f"per id), got {rows.dtype} {tuple(rows.shape)}")
        if not len(ids):
            return
        order = np.argsort(ids, kind="stable")
        ids = ids[order]
        if ids[0] < 0 or ids[-1] >= self.num_rows:
            bad = int(ids[0] if ids[0] < 0 else ids[-1])
            raise IndexError(f"row id {bad} is out of range: the table has {self.num_rows} rows")
        repeated = np.flatnonzero(ids[1:] == ids[:-1])
        if len(repeated):
            raise ValueError(f"row id {int(ids[repeated[0]])} appears more than once; write each row once per call")
        rows = rows[order]
        new = ids[~self._journaled.contains(ids)]
        if len(new):
            self._journal(new)
        elif self._journal_unsynced:  # before-images kept by before_change protect these rows: durable first
            self._sync_journal()
        start = time.perf_counter()
        written = write_runs(self._fd, self.data_path, ids, rows, self.row_stride)
        w = self._writes
        w.rows_written += len(ids)
        w.bytes_written += written
        w.write_seconds += time.perf_counter() - start

    def _journal(self, ids: np.ndarray) -> None:
        """Appends the before-images of sorted ``ids`` (read from the file) to the journal and fsyncs it."""
        before = torch.empty((len(ids), self.row_bytes), dtype=torch.uint8)
        self._read(torch.from_numpy(ids), before)
        self._append_journal(ids, before.numpy())
        self._sync_journal()  # before any row it protects is overwritten

    def before_change(self, ids, rows) -> None:
        """A cache is about to change the rows of distinct ``ids`` in memory; ``rows`` (uint8) are their bytes
        as stored now. Those not journaled in this generation are journaled from these bytes (synced before
        any overwrite), so writing them back later reads nothing first."""
        ids = as_id_tensor(ids).numpy()
        rows = rows.numpy() if isinstance(rows, torch.Tensor) else np.asarray(rows)
        new = ~self._journaled.contains(ids)
        if new.any():
            self._append_journal(ids[new], rows[new])
            self._journal_unsynced = True

    def _append_journal(self, ids: np.ndarray, before: np.ndarray) -> None:
        start = time.perf_counter()
        records = np.empty(len(ids), dtype=self._record_dtype)
        records["id"] = ids
        records["row"] = before
        records["crc"] = _record_crcs(records)
        with reporting_disk_full(self.journal_path, self._journal_end + records.nbytes):
            pwrite_all(self._journal_fd, records, self._journal_end)
        self._journal_end += records.nbytes
        self._journal_count += len(records)
        self._journal_chain = zlib.crc32(records.tobytes(), self._journal_chain)
        self._journaled.add(ids)
        w = self._writes
        w.journal_rows += len(ids)
        w.journal_bytes += records.nbytes
        w.journal_seconds += time.perf_counter() - start

    def _sync_journal(self) -> None:
        """Commits the appended records: fsyncs them, then the header that counts them and checksums their bytes.
        Recovery applies exactly the committed records and refuses a journal whose committed part is damaged."""
        start = time.perf_counter()
        header = _journal_header(self.row_bytes, self.generation, self._journal_count, self._journal_chain)
        with reporting_disk_full(self.journal_path):
            os.fsync(self._journal_fd)  # the records first: a header never commits records that are not on disk
            pwrite_all(self._journal_fd, header, 0)
            os.fsync(self._journal_fd)
        self._journal_unsynced = False
        self._writes.journal_seconds += time.perf_counter() - start

    def sync(self) -> None:
        """fsyncs table.bin: every row written so far is durable (a checkpoint's last step on each rank)."""
        if self._closed:
            raise RuntimeError("EmbeddingTable is closed")
        with reporting_disk_full(self.data_path):
            os.fsync(self._fd)

    def set_generation(self, generation: int) -> None:
        """Rank 0, after every rank's :meth:`sync` and the checkpoint: records ``generation`` in table.json."""
        if self.rank != 0:
            raise RuntimeError(f"set_generation runs on rank 0 only (this is rank {self.rank}); the other ranks "
                               f"call reset_journal after it")
        if isinstance(generation, bool) or not isinstance(generation, int) or generation < self.generation:
            raise ValueError(f"generation must be an integer >= the current generation {self.generation}, got "
                             f"{generation!r}")
        meta = _load_meta(self.path)
        meta["generation"] = generation
        atomic_write_bytes(json.dumps(meta, indent=1).encode(), os.path.join(self.path, META_FILE))
        self.generation = generation

    def reset_journal(self, generation: int) -> None:
        """Every rank, after rank 0's :meth:`set_generation`: starts this rank's journal for ``generation``."""
        if self._closed:
            raise RuntimeError("EmbeddingTable is closed")
        recorded = _load_meta(self.path)["generation"]
        if generation != recorded:
            raise TableError(f"reset_journal({generation!r}), but {os.path.join(self.path, META_FILE)} records "
                             f"generation {recorded}; call set_generation({generation!r}) on rank 0 first (after "
                             f"every rank's sync)")
        self.generation = generation
        self._start_journal(check_existing=False)

    def _start_journal(self, check_existing: bool) -> None:
        """Replaces this rank's journal with an empty one for the current generation. With ``check_existing``
        (a rank that did not recover), a journal that still protects rows of this generation is refused."""
        remove_stale_temporaries(self.journal_path, kind="file")
        if check_existing and os.path.exists(self.journal_path):
            header = _read_journal_header(self.journal_path, self.row_bytes)
            if header.generation >= self.generation and header.count:
                raise TableError(f"{self.journal_path} still holds before-images of generation "
                                 f"{header.generation} that were never rolled back; open the table on rank 0 with recover=True (before the "
                                 f"barrier) first")
        if self._journal_fd is not None:
            os.close(self._journal_fd)
            self._journal_fd = None
        atomic_write_bytes(_journal_header(self.row_bytes, self.generation), self.journal_path)
        self._journal_fd = os.open(self.journal_path, os.O_WRONLY | os.O_NOFOLLOW)
        self._journal_end = _HEADER.size
        self._journal_count = self._journal_chain = 0
        self._journal_unsynced = False
        self._journaled.clear()

    # -- counters and closing ------------------------------------------------------------------------------

    def write_counters(self) -> dict:
        """Cumulative write counters (:class:`WriteStats` as a dict)."""
        return asdict(self._writes)

    def reset_stats(self) -> None:
        super().reset_stats()
        self._writes = WriteStats()

    def close(self) -> None:
        """Closes the files; syncs nothing (a checkpoint's :meth:`sync` does)."""
        if self._closed:
            return
        super().close()
        if self._run_lock is not None:
            self._run_lock.release()
        for name in ("_fd", "_journal_fd"):
            fd = getattr(self, name, None)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)

    def __repr__(self) -> str:
        return (f"EmbeddingTable({self.path!r}, rows={self.num_rows}, row_bytes={self.row_bytes}, "
                f"generation={self.generation}, rank={self.rank})")


def _write_rows_file(path: str, meta: dict, init, chunk_rows: int, progress: bool) -> None:
    """Writes table.bin of a new table: the rows from ``init`` in chunks, zero padded, fsynced."""
    from tqdm.auto import tqdm

    num_rows, row_bytes, stride = meta["num_rows"], meta["row_bytes"], meta["row_stride"]
    with CheckedFile(path, size=meta["file_bytes"]) as fh, \
            tqdm(total=num_rows, desc="table rows", unit="row", unit_scale=True, disable=not progress) as bar:
        for start in range(0, num_rows, chunk_rows):
            stop = min(start + chunk_rows, num_rows)
            rows = _check_init_rows(init(start, stop), start, stop, row_bytes)
            if stride != row_bytes:
                padded = np.zeros((stop - start, stride), dtype=np.uint8)
                padded[:, :row_bytes] = rows
                rows = padded
            fh.write(rows)
            bar.update(stop - start)
        fh.write(bytes(meta["file_bytes"] - num_rows * stride))
        fh.close(sync=True)


def _recover(path: str, meta: dict, target: int, writers: int) -> dict:
    """Rolls the table directory back to generation ``target`` (see the module docstring) and leaves an empty
    journal of ``target`` for each of the ``writers`` ranks about to write it; returns the metadata as it then
    stands. Every journal is checked whole before any byte of the table changes."""
    meta_path = os.path.join(path, META_FILE)
    if meta["generation"] > target:
        raise TableError(f"{meta_path} records generation {meta['generation']}, newer than the checkpoint's "
                         f"generation {target}: the table cannot be rolled back that far; {FRESH_FIX}, or resume "
                         f"from the checkpoint of generation {meta['generation']}")
    journals = {}  # rank -> (path, header)
    for name in sorted(os.listdir(path)):
        match = _JOURNAL_NAME.fullmatch(name)
        if match:
            journal = os.path.join(path, name)
            header = _read_journal_header(journal, meta["row_bytes"])
            if header.generation > target:
                raise TableError(f"{journal} is a journal of generation {header.generation}, newer than the "
                                 f"checkpoint's generation {target}: the table cannot be rolled back that far; "
                                 f"{FRESH_FIX}")
            journals[int(match.group(1))] = (journal, header)
    recorded = meta.get("writers", 0)  # tables of lsm-gnn before 0.3 do not say
    missing = [rank for rank in range(recorded) if rank not in journals]
    if missing:
        journal = os.path.join(path, f"undo.{missing[0]}.log")
        raise TableError(f"{journal} is missing, but {meta_path} records {recorded} writing rank(s), each with a "
                         f"journal from the moment it opened the table: the rows it protected cannot be rolled back; "
                         f"{FRESH_FIX}")
    live = [(journal, header) for journal, header in journals.values() if header.generation == target]
    restored = _RowSet(meta["num_rows"])
    for journal, header in live:
        rows = _check_journal(journal, header, meta)
        if restored.intersects(rows):
            raise TableError(f"{journal} holds rows that another rank's journal of generation {target} holds too, so "
                             f"which before-image is the committed row is unknown (ranks must write disjoint rows); "
                             f"{FRESH_FIX}")
        restored.update(rows)
    if any(header.count for _, header in live):
        fd = os.open(os.path.join(path, DATA_FILE), os.O_RDWR)
        try:
            for journal, header in live:
                _undo(journal, header, fd, meta)
            os.fsync(fd)
        finally:
            os.close(fd)
    # Every rank that will write has a journal before table.json names it a writer, and no journal is deleted
    # while table.json still names its rank: a crash anywhere here leaves what the next recovery expects.
    empty = _journal_header(meta["row_bytes"], target)
    for rank in sorted(set(journals) | set(range(writers))):
        atomic_write_bytes(empty, os.path.join(path, f"undo.{rank}.log"), sync_directory=False)
    fsync_path(path)
    if (meta["generation"], recorded) != (target, writers):
        meta = dict(meta, generation=target, writers=writers)
        atomic_write_bytes(json.dumps(meta, indent=1).encode(), meta_path)
    for rank in sorted(journals):
        if rank >= writers:
            os.unlink(os.path.join(path, f"undo.{rank}.log"))
    fsync_path(path)
    return meta


def _undo(journal: str, header: _JournalHeader, fd: int, meta: dict) -> None:
    """Writes the committed before-images of ``journal`` (checked by :func:`_check_journal`) back into table.bin
    (file descriptor ``fd``)."""
    restored = _RowSet(meta["num_rows"])
    for _, records in _journal_chunks(journal, header, meta):
        # write() journals a row once per generation; were one there twice, its first image is the committed one
        ids, first = np.unique(records["id"].astype(np.int64), return_index=True)
        keep = ~restored.contains(ids)
        ids, first = ids[keep], first[keep]
        if len(ids):
            write_runs(fd, os.path.join(os.path.dirname(journal), DATA_FILE), ids,
                        np.ascontiguousarray(records["row"][first]), meta["row_stride"])
            restored.add(ids)
