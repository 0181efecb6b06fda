"""A durable on-disk table of fixed-size rows that training writes in place: trainable embeddings on SSD.

A table is a directory::

    table.json     format name and version, num_rows, row_bytes, row_stride, file_bytes, the
                   committed ``generation`` and the caller's ``layout`` (an opaque JSON object)
    table.bin      num_rows rows of ``row_stride`` bytes (:func:`~lsm_gnn.data.format.row_stride_for`:
                   packed small rows or 512-aligned large ones), zero padded, padded to a whole page
    undo.<rank>.log   one undo journal per writing rank (:mod:`lsm_gnn.storage.journal`)

Rows are opaque bytes here (``dtype="uint8"``, ``dim=row_bytes``); only the embedding layer knows what
they hold. Reads are :class:`~lsm_gnn.storage.native.NativeStorage`'s (the ``pread`` reader, buffered by
default so that it sees the writes, which go through the page cache).

**Generations.** The table between two checkpoints is one generation. A checkpoint ends generation ``g``
and starts ``g + 1`` in this order: every rank writes its dirty rows and calls :meth:`EmbeddingTable.sync`;
the caller writes its checkpoint, recording ``g + 1``; rank 0 calls :meth:`~EmbeddingTable.set_generation`
``(g + 1)``; every rank calls :meth:`~EmbeddingTable.reset_journal` ``(g + 1)``. A rank writes nothing
between its ``sync`` and its ``reset_journal``.

**Undo journal and recovery.** Before the first overwrite of a row in a generation, :meth:`~EmbeddingTable.write`
journals the row's before-image; opening with ``recover=True`` rolls the table back to the checkpoint's
generation with every rank's journal; ranks write disjoint rows within a generation. The journal's format
and the recovery are :mod:`lsm_gnn.storage.journal`'s.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import time
import types
import zlib
from dataclasses import asdict, dataclass

import numpy as np
import torch

from lsm_gnn.data.format import PAGE_SIZE, FeatureLayout, feature_file_bytes, row_stride_for, row_stride_problem
from lsm_gnn.storage.journal import (
    HEADER, JOURNAL_NAME, RowSet, journal_header, read_journal_header, record_crcs, record_dtype, recover_table,
)
from lsm_gnn.storage.native import NativeStorage
from lsm_gnn.storage.table_files import DATA_FILE, FRESH_FIX, META_FILE, TableError, pwrite_all, write_runs
from lsm_gnn.utils.fileio import (
    CheckedFile, RunLock, atomic_write_bytes, contained_path, fsync_path, remove_stale_temporaries,
    make_temporary, reporting_disk_full,
)
from lsm_gnn.utils.ids import as_id_tensor

FORMAT_NAME = "lsm-gnn-embedding-table"
FORMAT_VERSION = 1

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
    for name in (META_FILE, DATA_FILE, *(n for n in os.listdir(path) if JOURNAL_NAME.fullmatch(n))):
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
    under an undo journal (:mod:`lsm_gnn.storage.journal`). Make one with :meth:`create`, open one with
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
        self._record_dtype = record_dtype(self.row_bytes)
        self._journaled = RowSet(self.num_rows)
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
        tmp = make_temporary(path, directory=True)
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
        (None: the generation table.json records), see :mod:`lsm_gnn.storage.journal`. With several ranks,
        rank 0 opens with ``recover=True`` and ``world_size`` (the ranks that will write: each gets its journal
        now), the others, after a barrier, with ``recover=False``. Rank 0 holds the table's lock until :meth:`close`.
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
                target = meta["generation"] if expect_generation is None else expect_generation
                meta = recover_table(path, meta, target, _positive_int(world_size, "world_size"))
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
        records["crc"] = record_crcs(records)
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
        header = journal_header(self.row_bytes, self.generation, self._journal_count, self._journal_chain)
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
            header = read_journal_header(self.journal_path, self.row_bytes)
            if header.generation >= self.generation and header.count:
                raise TableError(f"{self.journal_path} still holds before-images of generation "
                                 f"{header.generation} that were never rolled back; open the table on rank 0 with recover=True (before the "
                                 f"barrier) first")
        if self._journal_fd is not None:
            os.close(self._journal_fd)
            self._journal_fd = None
        atomic_write_bytes(journal_header(self.row_bytes, self.generation), self.journal_path)
        self._journal_fd = os.open(self.journal_path, os.O_WRONLY | os.O_NOFOLLOW)
        self._journal_end = HEADER.size
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


def snapshot_table(source: str, path: str, generation: int) -> None:
    """Copies the table directory ``source`` (its rows on disk, no writer's dirty lines left) to a new
    directory ``path``, recorded at ``generation``: a table of its own, opened like any other, that later
    training of ``source`` leaves alone (``best.pt``'s table). It appears whole or not at all; the bytes go
    by ``copy_file_range``, which a file system that shares extents (XFS, btrfs) does without copying."""
    meta = _load_meta(source)
    # as a new table's: no rank has written it yet, so no journal is expected
    meta = {k: v for k, v in meta.items() if k != "writers"} | {"generation": int(generation)}
    meta_bytes = json.dumps(meta, indent=1).encode()
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.lexists(path):
        raise TableError(f"{path} already exists; a snapshot is written to a new directory")
    tmp = make_temporary(path, directory=True)
    try:
        data = os.path.join(tmp, DATA_FILE)
        with open(os.path.join(source, DATA_FILE), "rb") as src, open(data, "wb") as dst:
            with reporting_disk_full(data):
                _copy_bytes(src.fileno(), dst.fileno(), os.fstat(src.fileno()).st_size)
                os.fsync(dst.fileno())
        with CheckedFile(os.path.join(tmp, META_FILE), size=len(meta_bytes)) as fh:
            fh.write(meta_bytes)
            fh.close(sync=True)
        fsync_path(tmp)
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_path(parent)


def _copy_bytes(src: int, dst: int, size: int) -> None:
    """``size`` bytes from the start of one file descriptor to the other: copy_file_range where the platform
    has it (in the kernel, or as shared extents), else a buffered copy."""
    done = 0
    if hasattr(os, "copy_file_range"):
        try:
            while done < size:
                n = os.copy_file_range(src, dst, size - done, done, done)
                if n == 0:
                    break
                done += n
        except OSError as exc:  # EXDEV on old kernels, ENOSYS, EINVAL on some file systems: copy by hand
            if done or exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
    if done < size:
        os.lseek(src, done, os.SEEK_SET)
        os.lseek(dst, done, os.SEEK_SET)
        while done < size:
            chunk = os.read(src, min(64 << 20, size - done))
            if not chunk:
                raise TableError(f"the table file ended {size - done} bytes early while it was copied")
            pwrite_all(dst, chunk, done)
            done += len(chunk)


def _write_rows_file(path: str, meta: dict, init, chunk_rows: int, progress: bool) -> None:
    """Writes table.bin of a new table: the rows from ``init`` in chunks, zero padded, fsynced."""
    from lsm_gnn.utils.progress import progress_bar

    num_rows, row_bytes, stride = meta["num_rows"], meta["row_bytes"], meta["row_stride"]
    with CheckedFile(path, size=meta["file_bytes"]) as fh, \
            progress_bar(progress, total=num_rows, desc="table rows", unit="row", unit_scale=True) as bar:
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
