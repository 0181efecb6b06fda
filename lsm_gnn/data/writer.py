"""Writes datasets atomically and in bounded memory.

Everything is written into a hidden temporary directory beside the target,
``.<name>.tmp-<host>-<pid>-<random>``; :meth:`DatasetWriter.commit` fsyncs
every file, writes ``meta.json`` last and renames the directory into place,
so a reader sees either the old dataset, or the complete new one, never a
half-written one. An exception inside a ``with DatasetWriter(...)`` block
(or in ``commit``) removes the temporary directory; one left by a killed
writer is removed by the next writer of the same target, once no process
of that pid runs on this host.

Only an lsm-gnn dataset (with ``overwrite``) or an empty directory is ever
replaced: any other existing path is refused, never deleted. A full disk
(or quota) raises :class:`DiskFullError`, which names the file.

Both schemas are written by one typed core, :class:`TypedDatasetWriter` (node types with their feature
files, labels, splits and scores; relations with their CSRs): :class:`DatasetWriter` is the core with one
type and one relation laid out at the top (schema 1), :class:`~lsm_gnn.data.hetero_writer.HeteroDatasetWriter`
the core with schema 2's ``nodes/`` and ``relations/``.
"""
from __future__ import annotations

import abc
import errno
import json
import os
import shutil
import tempfile
from contextlib import contextmanager, nullcontext
from typing import Iterable, Iterator

import numpy as np

from lsm_gnn.data.dataset import Dataset, Relation, parse_relation
from lsm_gnn.data.format import (
    BLOCK_BYTES, BLOCK_SUMS_FILE, EDGE_SPLITS, FEATURE_DTYPES, FORMAT_NAME, META_FILE, ONE_RELATION, ONE_TYPE,
    PAGE_SIZE, SCHEMA_VERSION, SPLITS, BlockSums, DatasetError, block_sums_of_file, check_name, crc32_file,
    feature_file_bytes, relation_key, row_stride_for,
)
# EDGE_CHUNK, build_csr_files and index_dtype_for are re-exported: the CSR builder lives in csr_build.
from lsm_gnn.data.csr_build import EDGE_CHUNK, build_csr_files, index_dtype_for  # noqa: F401
from lsm_gnn.data.opening import open_dataset
from lsm_gnn.data.scores import SCORE_NAMES, check_score_names, compute_scores
# DiskFullError and remove_stale_temporaries are re-exported: the writer's errors and clean-up.
from lsm_gnn.utils.fileio import (  # noqa: F401
    CheckedFile, DiskFullError, fsync_path, make_temporary, remove_stale_temporaries, reporting_disk_full,
    temp_prefix,
)
from lsm_gnn.version import __version__


def save_npy(path: str, array: np.ndarray) -> None:
    """``np.save`` to ``path``, reporting a full disk by name."""
    with CheckedFile(path) as f:
        np.save(f, array)


def create_npy(path: str, dtype, shape) -> np.memmap:
    """A new ``.npy`` memory map with its blocks allocated now.

    Stores into a sparse mapping on a full disk kill the process with SIGBUS;
    allocating first turns that into a :class:`DiskFullError` here.
    """
    with reporting_disk_full(path):
        array = np.lib.format.open_memmap(path, "w+", dtype, shape)
    fd = os.open(path, os.O_RDWR)
    try:
        allocate(fd, path, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    return array


def allocate(fd: int, path: str, size: int) -> None:
    """Reserves ``size`` bytes of the open file ``fd`` on disk, or raises :class:`DiskFullError`."""
    if not hasattr(os, "posix_fallocate"):  # not on macOS: a full disk then shows on write
        return
    try:
        with reporting_disk_full(path, size):
            os.posix_fallocate(fd, 0, size)
    except DiskFullError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without it: learn on write
            raise


def _check_count(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


class FeatureFileWriter:
    """Streams one feature file: ``num_rows`` rows in order, each at a fixed stride and zero padded, the file
    padded to a whole page; its CRC-32 is computed on the way. ``row_alignment`` None (the default) packs rows
    under 512 bytes several per aligned 512-byte block; a multiple of 512 pads every row to a multiple of it
    (see :func:`~lsm_gnn.data.format.row_stride_for`). ``what`` names the rows in errors (e.g. "node type
    'author'")."""

    def __init__(self, path: str, num_rows: int, dim: int, dtype, row_alignment: int | None = None,
                 what: str = "the dataset"):
        self.num_rows = _check_count(num_rows, "num_nodes")
        self.dim = _check_count(dim, f"feature_dim of {what}")
        self.dtype = np.dtype(dtype)
        if self.dtype.name not in FEATURE_DTYPES:
            raise ValueError(f"feature dtype {self.dtype} of {what} is not supported; use one of "
                             f"{', '.join(FEATURE_DTYPES)}")
        self.what = what
        self.row_bytes = self.dim * self.dtype.itemsize
        self.row_stride = row_stride_for(self.row_bytes, row_alignment)
        self.file_bytes = feature_file_bytes(self.num_rows, self.row_stride)
        self.path = path
        self._file = CheckedFile(path, self.file_bytes)
        try:
            # Reserved up front: a disk too small for the features fails now, not hours into the rows.
            allocate(self._file.fileno(), path, self.file_bytes)
        except BaseException:
            self._file.close()
            raise
        self._sums = BlockSums()
        #: the CRC-32 of each block of the file, set by :meth:`finish`
        self.block_sums: np.ndarray | None = None
        self.rows_written = 0

    def layout(self, file_name: str) -> dict:
        """The file's entry in meta.json."""
        return {"file": file_name, "dtype": self.dtype.name, "dim": self.dim, "row_bytes": self.row_bytes,
                "row_stride": self.row_stride, "page_size": PAGE_SIZE, "file_bytes": self.file_bytes}

    def write(self, rows: np.ndarray) -> None:
        """Appends the next ``len(rows)`` rows (shape ``[k, dim]``)."""
        rows = np.asarray(rows)
        if rows.ndim != 2 or rows.shape[1] != self.dim:
            raise ValueError(f"feature rows of {self.what} must have shape [k, {self.dim}], got {rows.shape}")
        if self.rows_written + rows.shape[0] > self.num_rows:
            raise ValueError(f"too many feature rows for {self.what}: {self.rows_written} written + "
                             f"{rows.shape[0]} new > num_nodes={self.num_rows}")
        if rows.dtype != self.dtype:
            if np.issubdtype(rows.dtype, np.floating) != np.issubdtype(self.dtype, np.floating):
                raise ValueError(f"feature rows of {self.what} have dtype {rows.dtype} but the dataset stores "
                                 f"{self.dtype}; convert them explicitly")
            if np.issubdtype(self.dtype, np.integer) and rows.size:
                info = np.iinfo(self.dtype)
                if rows.min() < info.min or rows.max() > info.max:
                    raise ValueError(f"feature values [{rows.min()}, {rows.max()}] of {self.what} do not fit "
                                     f"{self.dtype} [{info.min}, {info.max}]; rescale them or store a wider dtype")
            rows = rows.astype(self.dtype)
        if rows.shape[0] == 0:
            return
        if self.row_stride == self.row_bytes:
            block = np.ascontiguousarray(rows).view(np.uint8).reshape(-1)
        else:
            block = np.zeros((rows.shape[0], self.row_stride), dtype=np.uint8)
            block[:, :self.row_bytes] = np.ascontiguousarray(rows).view(np.uint8).reshape(rows.shape[0], -1)
            block = block.reshape(-1)
        self._file.write(block.data)
        self._sums.update(block.data)
        self.rows_written += rows.shape[0]

    def finish(self, dataset_path: str) -> str:
        """Pads and syncs the file; returns its checksum for meta.json."""
        if self.rows_written != self.num_rows:
            raise DatasetError(f"{dataset_path}: only {self.rows_written} of {self.num_rows} feature rows of "
                               f"{self.what} were written; write every row before commit()")
        pad = self.file_bytes - self.num_rows * self.row_stride
        if pad:
            zeros = bytes(pad)
            self._file.write(zeros)
            self._sums.update(zeros)
        self._file.close(sync=True)
        whole, self.block_sums = self._sums.finish()
        return whole

    def close(self) -> None:
        self._file.close()


def write_csr_files(directory: str, prefix: str, indptr: np.ndarray, indices: np.ndarray, num_rows: int,
                    num_cols: int) -> int:
    """Stores a CSR as given (``<prefix>indptr.npy``, ``<prefix>indices.npy``): ``num_rows`` rows of ids in
    ``[0, num_cols)``. Returns the number of edges."""
    indptr = np.asarray(indptr)
    if indptr.shape != (num_rows + 1,):
        raise ValueError(f"indptr must have {num_rows + 1} entries, got shape {indptr.shape}")
    num_edges = int(indptr[-1])
    if int(indptr[0]) != 0 or np.any(np.diff(indptr) < 0):
        raise ValueError("indptr must start at 0 and never decrease (row v spans indptr[v]:indptr[v+1])")
    if indices.shape != (num_edges,):
        raise ValueError(f"indices must have indptr[-1]={num_edges} entries, got shape {indices.shape}")
    ip = create_npy(os.path.join(directory, prefix + "indptr.npy"), np.int64, indptr.shape)
    ip[:] = indptr
    ip.flush()
    del ip
    out = create_npy(os.path.join(directory, prefix + "indices.npy"), index_dtype_for(num_cols), (num_edges,))
    for start in range(0, num_edges, EDGE_CHUNK):
        block = np.asarray(indices[start:start + EDGE_CHUNK])
        if block.size and (block.min() < 0 or block.max() >= num_cols):
            raise ValueError(f"indices contain ids outside [0, {num_cols})")
        out[start:start + EDGE_CHUNK] = block
    out.flush()
    del out
    return num_edges


def row_blocks(indptr: np.ndarray) -> Iterator[tuple[int, int]]:
    """``(first, end)`` row ranges of a CSR, each of whole rows holding about ``EDGE_CHUNK`` edges (at least one
    row, so a hub's row is one block): what bounds the memory of a pass over the edges."""
    n = indptr.shape[0] - 1
    row = 0
    while row < n:
        end_row = int(np.searchsorted(indptr, indptr[row] + EDGE_CHUNK, side="right")) - 1
        end_row = min(max(end_row, row + 1), n)
        yield row, end_row
        row = end_row


def csr_edge_chunks(indptr: np.ndarray, indices: np.ndarray, *, src_offset: int = 0, dst_offset: int = 0
                    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The edges of a CSR (row v lists the sources of v) as (src, dst) int64 chunks in row order, each id
    shifted by its offset (to place a relation in a global id space): what :func:`build_csr_files` takes."""
    for row, end_row in row_blocks(indptr):
        dst = np.repeat(np.arange(row + dst_offset, end_row + dst_offset, dtype=np.int64),
                        np.diff(np.asarray(indptr[row:end_row + 1])))
        src = np.asarray(indices[int(indptr[row]):int(indptr[end_row])]).astype(np.int64) + src_offset
        yield src, dst


def label_array(labels, num_nodes: int, num_classes: int | None, what: str = "labels") -> tuple[np.ndarray, int]:
    """Labels as int64 (class per node, -1 unlabeled) and the number of classes, checked."""
    labels = np.asarray(labels)
    if labels.shape != (num_nodes,):
        raise ValueError(f"{what} must have shape ({num_nodes},), got {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{what} must be integers (class ids), got dtype {labels.dtype}")
    labels = labels.astype(np.int64)
    if num_classes is None:
        num_classes = int(labels.max()) + 1 if labels.size else 0
    if labels.size and (labels.min() < -1 or labels.max() >= num_classes):
        raise ValueError(f"{what} must lie in [-1, {num_classes}), got [{labels.min()}, {labels.max()}]")
    return labels, int(num_classes)


def split_ids(name: str, ids, num_nodes: int, what: str = "") -> np.ndarray:
    """A split's node ids (from ids or a boolean mask) as int64, checked."""
    if name not in SPLITS:
        raise ValueError(f"unknown split {name!r}; splits are {', '.join(SPLITS)}")
    ids = np.asarray(ids)
    if ids.dtype == bool:
        if ids.shape != (num_nodes,):
            raise ValueError(f"a boolean {name} mask{what} must have shape ({num_nodes},), got {ids.shape}")
        ids = np.flatnonzero(ids)
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{name} split{what} must hold integer node ids or a boolean mask, got dtype {ids.dtype}")
    ids = ids.astype(np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= num_nodes):
        raise ValueError(f"{name} split{what} has node ids outside [0, {num_nodes})")
    return ids


def score_array(name: str, scores, num_nodes: int, what: str = "") -> np.ndarray:
    scores = np.asarray(scores, dtype=np.float32)
    if scores.shape != (num_nodes,):
        raise ValueError(f"score {name!r}{what} must have shape ({num_nodes},), got {scores.shape}")
    return scores


class AtomicDatasetWriter:
    """What every dataset writer shares: a hidden temporary directory beside ``path``, removed on error, and
    :meth:`commit`, which checksums, fsyncs and validates it, then renames it into place atomically.
    Subclasses fill ``self.meta`` and the directory and implement :meth:`_finish` and :meth:`_close_files`."""

    def __init__(self, path: str | os.PathLike, overwrite: bool):
        self.path = os.path.abspath(os.fspath(path))
        check_replaceable(self.path, overwrite)
        parent = os.path.dirname(self.path)
        os.makedirs(parent, exist_ok=True)
        remove_stale_temporaries(self.path)
        self.overwrite = overwrite
        self.tmp = make_temporary(self.path, directory=True)
        self.meta: dict = {}
        self._block_sums: dict[str, np.ndarray] = {}  # files summed as they were written
        self._done = False

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or not self._done:
            self.abort()

    def abort(self) -> None:
        """Removes everything written so far; the target is untouched."""
        self._close_files()
        shutil.rmtree(self.tmp, ignore_errors=True)
        self._done = True

    def _close_files(self) -> None:
        """Closes files still open for writing."""

    def _finish(self) -> None:
        """Completes the files (all that commit needs before checksums)."""

    def commit(self):
        """Makes the dataset visible atomically and returns it opened.

        Any failure before the switch (invalid data, a full disk, a path that
        may not be replaced) removes the temporary directory and leaves the
        target as it was.
        """
        if self._done:
            raise RuntimeError("this writer has already committed or aborted")
        try:
            self._prepare_commit()
            check_replaceable(self.path, self.overwrite)  # again: something may have appeared while writing
        except BaseException:
            self.abort()
            raise
        if os.path.lexists(self.path):
            if not _exchange(self.tmp, self.path):
                # No atomic exchange (old kernel or file system): move the old one aside first.
                old = tempfile.mkdtemp(prefix=f".{os.path.basename(self.path)}.old-", dir=os.path.dirname(self.path))
                os.rmdir(old)
                os.rename(self.path, old)
                os.rename(self.tmp, self.path)
                self.tmp = old
            fsync_path(os.path.dirname(self.path))
            shutil.rmtree(self.tmp, ignore_errors=True)  # after an exchange, tmp holds the old dataset
        else:
            os.rename(self.tmp, self.path)
            fsync_path(os.path.dirname(self.path))
        self._done = True
        return open_dataset(self.path)

    def _finish_feature_file(self, rel: str, writer: FeatureFileWriter) -> None:
        """Completes a feature file and records the checksums summed while it was written."""
        self.meta.setdefault("checksums", {})[rel] = writer.finish(self.path)
        self._block_sums[rel] = writer.block_sums

    def _prepare_commit(self) -> None:
        """Completes, checksums, fsyncs and validates the temporary directory."""
        self._finish()
        checksums = self.meta.setdefault("checksums", {})
        block_sums = dict(self._block_sums)
        for root, _, files in os.walk(self.tmp):
            for file_name in files:
                full = os.path.join(root, file_name)
                rel = os.path.relpath(full, self.tmp).replace(os.sep, "/")
                if rel not in block_sums:  # feature files were summed as they were written
                    checksums[rel], block_sums[rel] = block_sums_of_file(full)
                with reporting_disk_full(full):
                    fsync_path(full)
        self._write_block_sums(block_sums)
        with CheckedFile(os.path.join(self.tmp, META_FILE)) as meta:
            meta.write(json.dumps(self.meta, indent=2, sort_keys=True).encode())
            meta.close(sync=True)
        fsync_path(self.tmp)
        try:
            open_dataset(self.tmp)  # full validation before anything becomes visible
        except DatasetError as exc:
            raise DatasetError(f"{self.path}: the dataset being written is invalid, nothing was replaced: {exc}") \
                from exc


    def _write_block_sums(self, block_sums: dict[str, np.ndarray]) -> None:
        """One file of every data file's block CRC-32s, in name order; meta.json says where each file's lie."""
        spans, first = {}, 0
        path = os.path.join(self.tmp, BLOCK_SUMS_FILE)
        with CheckedFile(path) as out:
            for rel in sorted(block_sums):
                sums = block_sums[rel]
                out.write(sums.astype("<u4", copy=False).tobytes())
                spans[rel] = [first, int(sums.size)]
                first += int(sums.size)
            out.close(sync=True)
        self.meta["block_checksums"] = {"file": BLOCK_SUMS_FILE, "block_bytes": BLOCK_BYTES, "files": spans}
        self.meta["checksums"][BLOCK_SUMS_FILE] = crc32_file(path)


class TypedDatasetWriter(AtomicDatasetWriter, abc.ABC):
    """The typed core of both writers: node types with their own feature file, labels, splits and scores, and
    relations with their own CSR. Where files lie and where their entries go in meta.json is the schema's
    (:class:`DatasetWriter`: one type and one relation, files at the top; :class:`HeteroDatasetWriter
    <lsm_gnn.data.hetero_writer.HeteroDatasetWriter>`: ``nodes/<type>/`` and ``relations/<key>/``); a
    subclass gives :meth:`_type_dir`, :meth:`_relation_dir`, :meth:`_record_relation` and :meth:`_of`,
    and fills ``self.meta`` around the entries :meth:`_add_types` makes."""

    def __init__(self, path: str | os.PathLike, overwrite: bool):
        super().__init__(path, overwrite)
        self.type_sizes: dict[str, int] = {}  # node count per type
        self._features: dict[str, FeatureFileWriter] = {}
        self._relations: dict[Relation, dict] = {}
        self._entries: dict[str, dict] = {}

    # -- where a schema puts things (each schema's writer says; this core cannot be made without one) ----------
    @abc.abstractmethod
    def _type_dir(self, node_type: str) -> str:
        """The folder, inside the dataset, of ``node_type``'s files ("" or ``nodes/<type>/``)."""

    @abc.abstractmethod
    def _relation_dir(self, relation: Relation) -> str:
        """The folder, inside the dataset, of ``relation``'s CSR files."""

    @abc.abstractmethod
    def _record_relation(self, relation: Relation, prefix: str, num_edges: int) -> None:
        """Puts ``relation``'s entry where the schema keeps it in meta.json."""

    @abc.abstractmethod
    def _of(self, node_type: str) -> str:
        """How errors name a node type's data (after 'labels', 'train split', ...)."""

    def _add_types(self, entries: dict[str, dict], specs: dict[str, dict], row_alignment: int | None,
                   what) -> None:
        """Opens each type's feature file; ``entries`` are the types' meta.json entries (a subclass's), ``what``
        names a type in feature errors."""
        try:
            for t, spec in specs.items():
                self.type_sizes[t] = int(spec["num_nodes"])
                entry = entries[t]
                os.makedirs(os.path.join(self.tmp, self._type_dir(t)), exist_ok=True)  # featureless types' too
                if spec.get("feature_dim") is not None:
                    file_name = self._type_dir(t) + "features.bin"
                    self._features[t] = FeatureFileWriter(os.path.join(self.tmp, file_name), self.type_sizes[t],
                                                          spec["feature_dim"], spec.get("feature_dtype", "float32"),
                                                          row_alignment, what=what(t))
                    entry["features"] = self._features[t].layout(file_name)
                elif "feature_dtype" in spec:
                    raise ValueError(f"node type '{t}' has a feature_dtype but no feature_dim")
                self._entries[t] = entry
        except BaseException:
            self.abort()
            raise

    def _close_files(self) -> None:
        for writer in self._features.values():
            writer.close()

    def _entry(self, node_type: str) -> dict:
        if node_type not in self._entries:
            raise KeyError(f"no node type {node_type!r}; the node types are {', '.join(self._entries)}")
        return self._entries[node_type]

    # -- features ------------------------------------------------------------
    def rows_written(self, node_type: str) -> int:
        self._entry(node_type)
        return self._features[node_type].rows_written if node_type in self._features else 0

    def write_type_features(self, node_type: str, rows: np.ndarray) -> None:
        """Appends the next ``len(rows)`` feature rows of ``node_type``."""
        self._entry(node_type)
        if node_type not in self._features:
            raise ValueError(f"node type '{node_type}' was declared without features (give it a feature_dim)")
        self._features[node_type].write(rows)

    def _finish_features(self) -> None:
        for t, writer in self._features.items():
            self._finish_feature_file(self._type_dir(t) + "features.bin", writer)

    # -- relations -----------------------------------------------------------
    def _relation(self, relation) -> tuple[Relation, str]:
        relation = parse_relation(relation)
        src, name, dst = relation
        key = relation_key(relation)
        for role, t in (("source", src), ("destination", dst)):
            if t not in self._entries:
                raise ValueError(f"relation '{key}': its {role} type '{t}' is not a node type "
                                 f"({', '.join(self._entries)})")
        check_name(name, f"relation '{key}': name")
        if relation in self._relations:
            raise ValueError(f"relation '{key}' was already written")
        return relation, self._relation_dir(relation)

    def _add_relation(self, relation: Relation, prefix: str, num_edges: int) -> None:
        self._relations[relation] = {"src": relation[0], "name": relation[1], "dst": relation[2],
                                     "num_edges": num_edges, "indptr": prefix + "indptr.npy",
                                     "indices": prefix + "indices.npy"}
        self._record_relation(relation, prefix, num_edges)

    def _about_relation(self, relation: Relation):
        """Names the relation in a ValueError raised inside (a one-relation schema has nothing to name)."""
        return errors_about(f"relation '{relation_key(relation)}'")

    def write_relation_edges(self, relation, chunks: Iterable[tuple[np.ndarray, np.ndarray]], *, undirected: bool = False,
                    dedup: bool = True, self_loops: bool = True, expected_edges: int | None = None,
                    note=None) -> None:
        """Builds the CSR of ``relation`` (``(src, name, dst)`` or ``'src__name__dst'``) from (src ids,
        dst ids) chunks in bounded memory (:func:`build_csr_files`): dst's row lists src. ``undirected``
        (a relation from a type to itself) adds the reverse of every edge; ``dedup`` removes parallel edges;
        ``self_loops=False`` drops edges v -> v; ``expected_edges``, if known, sizes the sort's buckets;
        ``note`` is told when the sort starts."""
        relation, prefix = self._relation(relation)
        src, _, dst = relation
        with self._about_relation(relation):
            num_edges = build_csr_files(self.tmp, prefix, chunks, self.type_sizes[dst], self.type_sizes[src],
                                        undirected=undirected, dedup=dedup, self_loops=self_loops or src != dst,
                                        expected_edges=expected_edges, note=note)
        self._add_relation(relation, prefix, num_edges)

    def write_relation_csr(self, relation, indptr: np.ndarray, indices: np.ndarray) -> None:
        """Stores the CSR of ``relation`` as given: ``num_nodes[dst] + 1`` indptr entries, src ids."""
        relation, prefix = self._relation(relation)
        src, _, dst = relation
        with self._about_relation(relation):
            num_edges = write_csr_files(self.tmp, prefix, indptr, indices, self.type_sizes[dst], self.type_sizes[src])
        self._add_relation(relation, prefix, num_edges)

    def csr(self, relation) -> tuple[np.ndarray, np.ndarray]:
        """A relation's CSR written so far (memory-mapped), e.g. to compute scores before commit."""
        relation = parse_relation(relation)
        if relation not in self._relations:
            raise KeyError(f"relation '{relation_key(relation)}' has not been written")
        entry = self._relations[relation]
        return (np.load(os.path.join(self.tmp, entry["indptr"]), mmap_mode="r"),
                np.load(os.path.join(self.tmp, entry["indices"]), mmap_mode="r"))

    # -- labels, splits, scores ----------------------------------------------
    def write_type_labels(self, node_type: str, labels: np.ndarray, num_classes: int | None = None) -> None:
        """Class per node of ``node_type``, -1 for unlabeled nodes."""
        entry = self._entry(node_type)
        labels, num_classes = label_array(labels, self.type_sizes[node_type], num_classes,
                                          "labels" + self._of(node_type))
        file_name = self._type_dir(node_type) + "labels.npy"
        save_npy(os.path.join(self.tmp, file_name), labels)
        entry["labels"], entry["num_classes"] = file_name, num_classes

    def write_type_split(self, node_type: str, name: str, ids: np.ndarray) -> None:
        entry = self._entry(node_type)
        ids = split_ids(name, ids, self.type_sizes[node_type], self._of(node_type))
        file_name = self._type_dir(node_type) + f"{name}_idx.npy"
        save_npy(os.path.join(self.tmp, file_name), ids)
        entry["splits"][name] = file_name

    def write_type_score(self, node_type: str, name: str, scores: np.ndarray) -> None:
        entry = self._entry(node_type)
        scores = score_array(name, scores, self.type_sizes[node_type], self._of(node_type))
        os.makedirs(os.path.join(self.tmp, self._type_dir(node_type), "scores"), exist_ok=True)
        file_name = self._type_dir(node_type) + f"scores/{name}.npy"
        save_npy(os.path.join(self.tmp, file_name), scores)
        entry["scores"][name] = file_name


    # The calls under their typed names, which the converters' and generators' typed core uses whatever a schema
    # names its own shortcuts (a one-type writer's take no node type); under the plain names for typed schemas.
    write_features, write_edges, write_csr = write_type_features, write_relation_edges, write_relation_csr
    write_labels, write_split, write_score = write_type_labels, write_type_split, write_type_score


@contextmanager
def errors_about(what: str):
    """Prefixes a ValueError raised inside with ``what``: the node type or relation it concerns."""
    try:
        yield
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


class DatasetWriter(TypedDatasetWriter):
    """Builds one dataset directory: the typed writer with one node type and one relation, files at the top
    of the directory and their entries at the top of meta.json (schema 1).

    Call :meth:`write_features` with consecutive row chunks, one of
    :meth:`write_edges` / :meth:`write_csr`, optionally :meth:`write_labels`,
    :meth:`write_split` and :meth:`write_score`, then :meth:`commit`. A
    user-item dataset also calls :meth:`set_bipartite` and
    :meth:`write_edge_split` for its held-out interactions.

    ``scores`` names the static scores :meth:`commit` computes from the
    topology, those not already given with :meth:`write_score` (default:
    ``reverse_pagerank`` and ``degree``, which the trainer's cache uses by
    default; ``()`` for none).

    Rows under 512 bytes are packed several per aligned 512-byte block
    (``row_alignment=None``, the default); ``row_alignment=512`` (or a larger
    multiple) writes one row per aligned slot, the layout before packing.
    """

    def __init__(self, path: str | os.PathLike, *, num_nodes: int, feature_dim: int, feature_dtype: str = "float32",
                 name: str | None = None, overwrite: bool = False, row_alignment: int | None = None,
                 extra_meta: dict | None = None, scores=SCORE_NAMES):
        self.scores = check_score_names(scores)
        if num_nodes <= 0:
            raise ValueError(f"num_nodes must be positive, got {num_nodes}")
        if feature_dim <= 0:
            raise ValueError(f"feature_dim must be positive, got {feature_dim}")
        dtype = np.dtype(feature_dtype)
        if dtype.name not in FEATURE_DTYPES:
            raise ValueError(f"feature dtype {dtype} is not supported; use one of {', '.join(FEATURE_DTYPES)}")
        super().__init__(path, overwrite)
        self.num_nodes = int(num_nodes)
        self.feature_dim = int(feature_dim)
        self.dtype = dtype
        # The one type's entry is meta.json's top level.
        self.meta = {
            "format": FORMAT_NAME, "version": SCHEMA_VERSION, "name": name or os.path.basename(self.path),
            "num_nodes": self.num_nodes, "num_edges": None, "num_classes": None, "features": None,
            "graph": None, "labels": None, "splits": {}, "scores": {}, "checksums": {},
            "created_by": "lsm-gnn " + __version__,
        }
        spec = {"num_nodes": self.num_nodes, "feature_dim": self.feature_dim, "feature_dtype": dtype.name}
        self._add_types({ONE_TYPE: self.meta}, {ONE_TYPE: spec}, row_alignment, lambda t: "the dataset")
        self.meta.update(extra_meta or {})
        self.row_bytes, self.row_stride = self._features[ONE_TYPE].row_bytes, self._features[ONE_TYPE].row_stride

    def _type_dir(self, node_type: str) -> str:
        return ""

    def _relation_dir(self, relation: Relation) -> str:
        return ""

    def _record_relation(self, relation: Relation, prefix: str, num_edges: int) -> None:
        self.meta["num_edges"] = num_edges
        self.meta["graph"] = {"indptr": "indptr.npy", "indices": "indices.npy", "orientation": "in"}

    def _of(self, node_type: str) -> str:
        return ""

    def _about_relation(self, relation: Relation):
        return nullcontext()

    # -- the one type and relation -------------------------------------------
    @property
    def rows_written(self) -> int:
        return self._features[ONE_TYPE].rows_written

    def write_features(self, rows: np.ndarray) -> None:
        """Appends the next ``len(rows)`` feature rows (shape ``[k, feature_dim]``)."""
        super().write_features(ONE_TYPE, rows)

    def _finish(self) -> None:
        if self.meta["graph"] is None:
            raise DatasetError(f"{self.path}: no topology was written; call write_edges() or write_csr()")
        self.write_scores()
        self._finish_features()

    def write_csr(self, indptr: np.ndarray, indices: np.ndarray) -> None:
        """Stores CSR topology as given (row v lists the nodes v aggregates from)."""
        super().write_csr(ONE_RELATION, indptr, indices)

    def write_edges(self, chunks: Iterable[tuple[np.ndarray, np.ndarray]], **options) -> None:
        """Builds CSR from (src, dst) edge chunks in bounded memory (:meth:`TypedDatasetWriter.write_edges`:
        ``undirected``, ``dedup``, ``self_loops``, ``expected_edges``, ``note``). Messages flow src -> dst, so
        dst's row lists src."""
        super().write_edges(ONE_RELATION, chunks, **options)

    def write_labels(self, labels: np.ndarray, num_classes: int | None = None) -> None:
        """Class per node (int), -1 for unlabeled nodes."""
        super().write_labels(ONE_TYPE, labels, num_classes)

    def write_split(self, name: str, ids: np.ndarray) -> None:
        super().write_split(ONE_TYPE, name, ids)

    def write_scores(self, note=None) -> None:
        """Computes the static scores named by ``scores=`` that are not written yet, from the topology written
        (:meth:`commit` calls it); ``note`` is told ``"computing scores: <name>"`` before each."""
        for name in self.scores:  # one at a time, so each one's memory is freed before the next
            if name not in self.meta["scores"]:
                if note is not None:
                    note(f"computing scores: {name}")
                self.write_score(name, compute_scores(*self.csr(), names=(name,))[name])

    def write_score(self, name: str, scores: np.ndarray) -> None:
        super().write_score(ONE_TYPE, name, scores)

    # -- user-item datasets (link prediction) --------------------------------
    def set_bipartite(self, num_users: int, num_items: int) -> None:
        """Marks nodes ``[0, num_users)`` as users and the remaining ``num_items`` as items."""
        if num_users <= 0 or num_items <= 0 or num_users + num_items != self.num_nodes:
            raise ValueError(f"num_users={num_users} and num_items={num_items} must be positive and sum to "
                             f"num_nodes={self.num_nodes}")
        self.meta["num_users"], self.meta["num_items"] = int(num_users), int(num_items)

    def write_edge_split(self, name: str, edges) -> None:
        """Stores held-out node pairs (``(user, item)`` in a user-item dataset) as ``<name>_edges.npy``.

        ``edges`` is an ``(E, 2)`` integer array (a memory map is read in
        chunks) or an iterable of ``(k, 2)`` chunks. The pairs must not be
        in the CSR: they are what link prediction is evaluated on.
        """
        if name not in EDGE_SPLITS:
            raise ValueError(f"unknown edge split {name!r}; edge splits are {', '.join(EDGE_SPLITS)} "
                             "(training edges are the CSR)")
        if hasattr(edges, "shape"):
            array = edges
            edges = (array[start:start + EDGE_CHUNK] for start in range(0, max(len(array), 1), EDGE_CHUNK))
        users = self.meta.get("num_users")
        first_end, second_start = (self.num_nodes, 0) if users is None else (users, users)
        spill_path = os.path.join(self.tmp, f"{name}_edges.spill")
        count = 0
        with CheckedFile(spill_path) as spill:
            for chunk in edges:
                chunk = np.asarray(chunk)
                if chunk.ndim != 2 or chunk.shape[1] != 2 or chunk.size and not np.issubdtype(chunk.dtype, np.integer):
                    raise ValueError(f"{name} edges must be integer node pairs of shape (E, 2), got {chunk.dtype} "
                                     f"{chunk.shape}")
                chunk = chunk.astype(np.int64)
                if chunk.size and (chunk[:, 0].min() < 0 or chunk[:, 0].max() >= first_end
                                   or chunk[:, 1].min() < second_start or chunk[:, 1].max() >= self.num_nodes):
                    raise ValueError(f"{name} edges must pair a node in [0, {first_end}) with one in "
                                     f"[{second_start}, {self.num_nodes}); call set_bipartite() first for users "
                                     "and items")
                spill.write(np.ascontiguousarray(chunk))
                count += chunk.shape[0]
        file_name = f"{name}_edges.npy"
        out = create_npy(os.path.join(self.tmp, file_name), np.int64, (count, 2))
        if count:
            out[:] = np.memmap(spill_path, dtype=np.int64, mode="r", shape=(count, 2))
        out.flush()
        del out
        os.remove(spill_path)
        self.meta.setdefault("edge_splits", {})[name] = file_name

    def csr(self) -> tuple[np.ndarray, np.ndarray]:
        """The topology written so far (memory-mapped), e.g. to compute scores before commit."""
        if self.meta["graph"] is None:
            raise RuntimeError("write the topology (write_edges or write_csr) first")
        return super().csr(ONE_RELATION)


# -- what may be replaced, and stale temporaries --------------------------------

def _dataset_meta(path: str) -> dict | None:
    """The meta.json of the lsm-gnn dataset at ``path``, or None when it is none."""
    try:
        with open(os.path.join(path, META_FILE)) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == FORMAT_NAME else None


def _foreign_files(path: str, meta: dict) -> list[str]:
    """Files in dataset directory ``path`` that its meta.json does not list (checksums name every file a writer
    made): something put there since, which replacing the dataset would delete. None is known of a dataset
    without checksums."""
    listed = meta.get("checksums")
    if not isinstance(listed, dict):
        return []
    found = []
    for root, _, files in os.walk(path):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), path).replace(os.sep, "/")
            if rel != META_FILE and rel not in listed:
                found.append(rel)
    return sorted(found)


def check_replaceable(path: str, overwrite: bool) -> None:
    """Raises FileExistsError unless writing a dataset to ``path`` destroys nothing but an old dataset.

    Nothing there or an empty directory is fine; an lsm-gnn dataset only
    with ``overwrite``; anything else (a file, a link, a directory of other
    things) never, since replacing it would delete data that is not ours.
    """
    if not os.path.lexists(path):
        return
    if os.path.isdir(path) and not os.path.islink(path):
        if not os.listdir(path):
            return
        meta = _dataset_meta(path)
        if meta is not None:
            if not overwrite:
                raise FileExistsError(f"{path} already exists; pass overwrite=True (CLI: --overwrite) to replace it")
            foreign = _foreign_files(path, meta)
            if not foreign:
                return
            raise FileExistsError(f"{path} is an lsm-gnn dataset that also holds files it did not write ("
                                  f"{', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''}); replacing it "
                                  "would delete them: move them out first, or choose another output path (--out)")
    raise FileExistsError(f"{path} exists and is not an lsm-gnn dataset (no {META_FILE} of format {FORMAT_NAME!r}); "
                          "refusing to replace it: choose another output path (--out) or remove it yourself")


def _exchange(a: str, b: str) -> bool:
    """Atomically swaps two paths with renameat2(RENAME_EXCHANGE); False where unsupported."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    rc = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    return rc == 0

