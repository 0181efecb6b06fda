"""The undo journal of an embedding table (:mod:`lsm_gnn.storage.table`): its format, the check that
refuses a damaged one, and the recovery that rolls the table back with it.

**Undo journal.** Before the first overwrite of a row in a generation,
:meth:`~lsm_gnn.storage.table.EmbeddingTable.write` appends the row's before-image (its committed bytes) to
the rank's journal and commits it, then overwrites the row with ``pwrite``. Format (little endian)::

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
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from lsm_gnn.storage.table_files import DATA_FILE, FRESH_FIX, META_FILE, TableError, write_runs
from lsm_gnn.utils.fileio import atomic_write_bytes, fsync_path

JOURNAL_MAGIC = b"LSMUNDO1"
JOURNAL_VERSION = 2
# magic, version, row_bytes, generation, records committed, crc32 chained over their bytes, crc32 of the fields before
HEADER = struct.Struct("<8sIIqqII")
_HEADER_CRC_SPAN = HEADER.size - 4
_V1_HEADER = struct.Struct("<8sIIqI4x")  # version 1: no count, no chained crc (read only to replace an empty one)
_RECORD_PREFIX = 12                   # int64 id + uint32 crc32, then the row
JOURNAL_NAME = re.compile(r"undo\.(\d+)\.log")
_RECOVER_CHUNK_BYTES = 16 << 20       # journal bytes read per step of recovery
assert HEADER.size == 40 and _V1_HEADER.size == 32


class RowSet:
    """A set of row ids in [0, num_rows) as one bit per row."""

    def __init__(self, num_rows: int):
        self._bits = np.zeros((num_rows + 7) // 8, dtype=np.uint8)

    def contains(self, ids: np.ndarray) -> np.ndarray:
        return ((self._bits[ids >> 3] >> (ids & 7).astype(np.uint8)) & 1).astype(bool)

    def add(self, ids: np.ndarray) -> None:
        np.bitwise_or.at(self._bits, ids >> 3, np.left_shift(1, ids & 7).astype(np.uint8))

    def update(self, other: "RowSet") -> None:
        self._bits |= other._bits

    def intersects(self, other: "RowSet") -> bool:
        return bool((self._bits & other._bits).any())

    def clear(self) -> None:
        self._bits.fill(0)


def record_dtype(row_bytes: int) -> np.dtype:
    return np.dtype([("id", "<i8"), ("crc", "<u4"), ("row", np.uint8, (row_bytes,))])  # packed: 12 + row_bytes


def record_crcs(records: np.ndarray) -> np.ndarray:
    """crc32 of (id bytes + row bytes) of every record."""
    raw = records.view(np.uint8).reshape(len(records), records.dtype.itemsize)
    return np.fromiter((zlib.crc32(r[_RECORD_PREFIX:], zlib.crc32(r[:8])) for r in raw), dtype=np.uint32,
                       count=len(records))


def journal_header(row_bytes: int, generation: int, count: int = 0, chain: int = 0) -> bytes:
    fields = HEADER.pack(JOURNAL_MAGIC, JOURNAL_VERSION, row_bytes, generation, count, chain, 0)[:_HEADER_CRC_SPAN]
    return fields + struct.pack("<I", zlib.crc32(fields))


@dataclass(frozen=True)
class _JournalHeader:
    generation: int
    count: int  # records committed: their rows may have been overwritten
    chain: int  # crc32 over the committed records' bytes, in order


def read_journal_header(path: str, row_bytes: int) -> _JournalHeader:
    """A journal's header; TableError naming the file when it is damaged or no journal of this table."""
    with open(path, "rb") as fh:
        raw = fh.read(HEADER.size + 1)
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
    if len(raw) < HEADER.size:
        raise TableError(f"{path}: the undo journal is shorter than its {HEADER.size}-byte header; {lost}")
    raw = raw[:HEADER.size]
    _, _, journal_row_bytes, generation, count, chain, crc = HEADER.unpack(raw)
    if crc != zlib.crc32(raw[:_HEADER_CRC_SPAN]) or count < 0:
        raise TableError(f"{path}: the undo journal's header is damaged (its checksum does not match); {lost}")
    if journal_row_bytes != row_bytes:
        raise TableError(f"{path}: the undo journal holds rows of {journal_row_bytes} bytes, the table rows of "
                         f"{row_bytes}; it belongs to another table: {FRESH_FIX}")
    return _JournalHeader(generation, count, chain)


def _journal_chunks(journal: str, header: _JournalHeader, meta: dict):
    """The committed records of ``journal`` in chunks of at most :data:`_RECOVER_CHUNK_BYTES`."""
    dtype = record_dtype(meta["row_bytes"])
    per_chunk = max(1, _RECOVER_CHUNK_BYTES // dtype.itemsize)
    with open(journal, "rb") as fh:
        fh.seek(HEADER.size)
        for start in range(0, header.count, per_chunk):
            n = min(per_chunk, header.count - start)
            yield start, np.frombuffer(fh.read(n * dtype.itemsize), dtype=dtype)


def _check_journal(journal: str, header: _JournalHeader, meta: dict) -> RowSet:
    """Proves every committed record of ``journal`` intact (each record's crc, the chained crc over all of them,
    ids inside the table) before any is applied; returns the rows they hold. A record appended after the last
    commit is ignored: the journal is committed before any row it protects is overwritten."""
    rows, chain = RowSet(meta["num_rows"]), 0
    if header.count == 0:
        return rows
    lost = f"the rows it protects cannot be rolled back: {FRESH_FIX}"
    record_bytes = record_dtype(meta["row_bytes"]).itemsize
    have = (os.path.getsize(journal) - HEADER.size) // record_bytes
    if have < header.count:
        raise TableError(f"{journal}: the undo journal was cut short: its header commits {header.count} records, "
                         f"the file holds {have}; {lost}")
    for start, records in _journal_chunks(journal, header, meta):
        bad = np.flatnonzero(record_crcs(records) != records["crc"])
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


def recover_table(path: str, meta: dict, target: int, writers: int) -> dict:
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
        match = JOURNAL_NAME.fullmatch(name)
        if match:
            journal = os.path.join(path, name)
            header = read_journal_header(journal, meta["row_bytes"])
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
    restored = RowSet(meta["num_rows"])
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
    empty = journal_header(meta["row_bytes"], target)
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
    restored = RowSet(meta["num_rows"])
    for _, records in _journal_chunks(journal, header, meta):
        # write() journals a row once per generation; were one there twice, its first image is the committed one
        ids, first = np.unique(records["id"].astype(np.int64), return_index=True)
        keep = ~restored.contains(ids)
        ids, first = ids[keep], first[keep]
        if len(ids):
            write_runs(fd, os.path.join(os.path.dirname(journal), DATA_FILE), ids,
                        np.ascontiguousarray(records["row"][first]), meta["row_stride"])
            restored.add(ids)
