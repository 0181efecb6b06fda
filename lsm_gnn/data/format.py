"""The on-disk dataset format: a directory with a versioned ``meta.json``.

Layout (every name is recorded in ``meta.json``; these are the defaults)::

    meta.json              schema, counts, feature layout, file names, checksums
    features.bin           num_nodes rows of ``row_stride`` bytes, zero padded,
                           the file padded to a multiple of ``page_size``
    indptr.npy, indices.npy   CSR: row v lists the nodes v aggregates from,
                           i.e. the neighbors that sampling visits from v
    labels.npy             int64 class per node, -1 where unlabeled (optional)
    train_idx.npy, val_idx.npy, test_idx.npy   int64 node ids (optional)
    scores/<name>.npy      float32 per node static scores (optional)
    val_edges.npy, test_edges.npy   int64 ``(E, 2)`` held-out node pairs for
                           link prediction, absent from the CSR (optional)

A user-item (bipartite) dataset also records ``num_users`` and
``num_items``: nodes ``[0, num_users)`` are users, the rest items, and every
held-out pair is ``(user, item)``.

Rows sit at a fixed stride, in one of two layouts (see :func:`row_stride_for`):
a row of 512 bytes or more is padded to a multiple of 512, so it starts on an
``O_DIRECT`` boundary; a smaller row is padded to the next power of two and
``512 / stride`` rows share each 512-byte block, so no row straddles a block
and one aligned read of a block serves all its rows. Datasets written before
packing (every stride a multiple of 512) are one case of the same rule.

A schema-2 dataset (several node types and typed relations; layout in :mod:`lsm_gnn.data.hetero`) is checked
by the same typed core: a schema-1 dataset is the typed graph of one node type and one relation
(:func:`typed_entries`), so both schemas' files go through :func:`_check_typed_files`.

Opening validates everything up to O(num_nodes) work (see :func:`open_dataset`;
``check="full"`` adds the neighbor ids, which the native code also bounds-checks
as it reads them); a problem raises :class:`DatasetError` naming the file and the fix.
"""
from __future__ import annotations

import json
import os
import re
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from lsm_gnn.utils.fileio import contained_path

FORMAT_NAME = "lsm-gnn-dataset"
SCHEMA_VERSION = 1         # one node type (this module)
HETERO_SCHEMA_VERSION = 2  # several node types and typed relations (lsm_gnn/data/hetero.py)
META_FILE = "meta.json"
PAGE_SIZE = 4096
ROW_ALIGNMENT = 512
FEATURE_DTYPES = ("float32", "float16", "int8", "uint8")
INDEX_DTYPES = ("int32", "int64")
SPLITS = ("train", "val", "test")
EDGE_SPLITS = ("val", "test")  # training edges are the CSR itself
CHECKSUM_CHUNK = 64 << 20
#: meta.json ``block_checksums``: the CRC-32 of every ``BLOCK_BYTES`` block of a data file, kept in this file, so
#: ``data.verify=sampled`` can check the rows and neighbor lists a run reads without re-reading whole files
BLOCK_SUMS_FILE = "block_crc32.bin"
BLOCK_BYTES = 64 << 10  # 4 bytes of sums per 64 KiB of data


class DatasetError(ValueError):
    """A dataset directory is missing, malformed or inconsistent."""


def relation_key(relation: tuple[str, str, str]) -> str:
    """``src__name__dst``: a relation as one string (directory names, config keys)."""
    return "__".join(relation)


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def check_name(name: Any, what: str) -> str:
    """Node type and relation names: letters, digits, '_' and '-'; no '__' (it joins relation keys) and no
    '.' (PyG and torch module names cannot hold one)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or "__" in name:
        raise ValueError(f"{what} {name!r} is not a valid name: use letters, digits, '_' and '-', starting "
                         "with a letter or digit, without '__'")
    return name


def row_stride_for(row_bytes: int, alignment: int | None = None) -> int:
    """Bytes between rows.

    By default (``alignment`` None) rows are packed: a row under 512 bytes gets the smallest power of two that
    holds it, so ``512 / stride`` rows share each aligned 512-byte block and none straddles a block; a larger
    row is rounded up to a multiple of 512. An explicit ``alignment`` (a positive multiple of 512) pads every
    row to a multiple of it: the unpacked layout, one aligned read per row (and the only layout before packing).
    """
    if row_bytes <= 0:
        raise ValueError(f"row_bytes must be positive, got {row_bytes}")
    if alignment is None:
        if row_bytes < ROW_ALIGNMENT:
            return 1 << (row_bytes - 1).bit_length()
        alignment = ROW_ALIGNMENT
    if alignment <= 0 or alignment % ROW_ALIGNMENT:
        raise ValueError(f"row alignment must be a positive multiple of {ROW_ALIGNMENT} (or None: packed rows), "
                         f"got {alignment}")
    return -(-row_bytes // alignment) * alignment


def row_stride_problem(row_bytes: int, row_stride: int) -> str | None:
    """Why ``row_stride`` is no valid stride for rows of ``row_bytes``, or None when it is.

    Valid strides hold the row and either are a multiple of 512 (the row starts on an aligned block) or a power
    of two below 512 (whole rows pack each block). Any other stride lets rows straddle blocks.
    """
    if row_stride < row_bytes:
        return f"row_stride={row_stride} is smaller than row_bytes={row_bytes}"
    if row_stride % ROW_ALIGNMENT and not (row_stride < ROW_ALIGNMENT and row_stride & (row_stride - 1) == 0):
        return (f"row_stride={row_stride} is neither a multiple of {ROW_ALIGNMENT} nor a power of two below "
                f"{ROW_ALIGNMENT}, so rows would straddle {ROW_ALIGNMENT}-byte blocks")
    return None


def feature_file_bytes(num_nodes: int, row_stride: int, page_size: int = PAGE_SIZE) -> int:
    """Size of the feature file: all rows, padded to a whole page."""
    return -(-num_nodes * row_stride // page_size) * page_size


def crc32_file(path: str, chunk: int = CHECKSUM_CHUNK, on_chunk=None) -> str | None:
    """CRC-32 of a file, streamed, as ``"crc32:xxxxxxxx"``. ``on_chunk(nbytes)``, if given, is called after each
    chunk read; returning False stops the sum, and the result is None."""
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            crc = zlib.crc32(block, crc)
            if on_chunk is not None and on_chunk(len(block)) is False:
                return None
    return f"crc32:{crc:08x}"


class BlockSums:
    """The CRC-32 of a byte stream, whole (meta.json ``checksums``) and per ``block_bytes`` block
    (``block_checksums``), summed as the bytes go by: a writer that streams a file sums it without reading it
    back."""

    def __init__(self, block_bytes: int = BLOCK_BYTES):
        self.block_bytes = block_bytes
        self.whole = 0
        self.sums: list[int] = []
        self._crc = 0
        self._fill = 0

    def update(self, data) -> None:
        view = memoryview(data).cast("B")
        self.whole = zlib.crc32(view, self.whole)
        pos = 0
        while pos < len(view):
            take = min(self.block_bytes - self._fill, len(view) - pos)
            self._crc = zlib.crc32(view[pos:pos + take], self._crc)
            self._fill += take
            pos += take
            if self._fill == self.block_bytes:
                self.sums.append(self._crc)
                self._crc, self._fill = 0, 0

    def finish(self) -> tuple[str, np.ndarray]:
        """(the whole stream's checksum as meta.json writes it, the blocks' CRC-32s; the last may be short)."""
        if self._fill:
            self.sums.append(self._crc)
            self._crc, self._fill = 0, 0
        return f"crc32:{self.whole:08x}", np.array(self.sums, dtype="<u4")


def block_sums_of_file(path: str) -> tuple[str, np.ndarray]:
    """:meth:`BlockSums.finish` of a file's bytes, in one read."""
    sums = BlockSums()
    with open(path, "rb") as f:
        while chunk := f.read(CHECKSUM_CHUNK):
            sums.update(chunk)
    return sums.finish()


def block_count(file_bytes: int, block_bytes: int) -> int:
    return -(-file_bytes // block_bytes)


@dataclass(frozen=True)
class FeatureLayout:
    file: str
    dtype: str
    dim: int
    row_bytes: int
    row_stride: int
    page_size: int
    file_bytes: int

    @property
    def numpy_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    @property
    def rows_per_block(self) -> int:
        """Rows that share one aligned 512-byte block: above 1 for packed small rows."""
        return max(1, ROW_ALIGNMENT // self.row_stride)


def read_rows_direct(path: str, layout: FeatureLayout, num_rows: int, ids) -> np.ndarray:
    """Rows ``ids`` of a feature file, by plain buffered reads."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    out = np.empty((ids.size, layout.dim), dtype=layout.numpy_dtype)
    with open(path, "rb") as f:
        for i, node in enumerate(ids):
            if not 0 <= node < num_rows:
                raise IndexError(f"node id {node} is out of range [0, {num_rows})")
            f.seek(int(node) * layout.row_stride)
            out[i] = np.frombuffer(f.read(layout.row_bytes), dtype=layout.numpy_dtype)
    return out


def verify_checksums(path: str, meta: dict) -> None:
    """Re-reads every file of a dataset directory and compares it to the checksum in its meta.json."""
    for name, expected in meta.get("checksums", {}).items():
        actual = crc32_file(os.path.join(path, name))
        if actual != expected:
            raise DatasetError(f"{os.path.join(path, name)}: checksum {actual} does not match {expected} recorded "
                               f"in {META_FILE}; the file is corrupt or was changed - re-create the dataset, or, if "
                               f"you changed it on purpose, record its new checksums: lsm-gnn prepare checksums {path}")


# -- validation --------------------------------------------------------------
#
# Opening always runs the checks that cost O(num_nodes) or less: every key of
# meta.json, file sizes, dtypes and shapes, indptr (endpoints and order),
# labels, split ids, held-out pairs and scores. check="full" adds the
# O(num_edges) scan of the neighbor ids; without it the native code bounds-
# checks every neighbor id it reads (csrc/graph/csr_check.h).

CHECKS = ("fast", "full")
CHECK_ALIASES = {"shape": "fast"}  # the former name of "fast"
MAX_CLASSES = 1 << 24  # an output layer this wide is already far beyond any real dataset
MAX_COUNT = 1 << 62    # node and edge counts must fit int64 arithmetic with room to spare
SCAN_CHUNK = 1 << 24
VERIFY_FIX = "run 'lsm-gnn inspect {dir} --verify' to check the whole dataset, and re-create the dataset"
_REDO = "Fix the value or re-create the dataset with 'lsm-gnn prepare'"
ID_FIX = "The ids do not match this dataset's node count; re-create the dataset"


def _fail(path: str, problem: str, fix: str) -> DatasetError:
    return DatasetError(f"{path}: {problem}. {fix}")


def _name(key: str) -> str:
    """A meta.json key as messages show it: escaped, so every error stays one line."""
    return json.dumps(key)[1:-1]


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_KINDS = {int: "an integer", str: "a string", dict: "an object", bool: "true or false"}


def _get(obj: dict, key: str, kind: type, meta_path: str, prefix: str = "", optional: bool = False,
         nullable: bool = False) -> Any:
    """``obj[key]`` of JSON type ``kind`` (bool is no integer); None when optional and absent, or nullable and null.
    Readers use ``meta.get(key, default)``, so null is refused unless the writer itself writes it."""
    if obj.get(key) is None:
        if optional and key not in obj or nullable:
            return None
        problem = f"missing key '{prefix}{key}'" if key not in obj else f"key '{prefix}{key}' is null"
        raise _fail(meta_path, problem, _REDO)
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise _fail(meta_path, f"key '{prefix}{key}' has the wrong type: it must be {_KINDS[kind]}, got "
                    f"{_show(value)}", _REDO)
    return value


def _get_int(obj: dict, key: str, meta_path: str, low: int, high: int = MAX_COUNT, prefix: str = "",
             nullable: bool = False) -> int | None:
    value = _get(obj, key, int, meta_path, prefix, nullable=nullable)
    if value is not None and not low <= value <= high:
        raise _fail(meta_path, f"key '{prefix}{key}' is {value}, outside [{low}, {high}]", _REDO)
    return value


def _check_file_name(value: Any, key: str, meta_path: str) -> str:
    """A file name must stay inside the dataset directory: relative, without '..'."""
    if not isinstance(value, str) or not value:
        raise _fail(meta_path, f"key '{key}' must be a file name, got {_show(value)}", _REDO)
    parts = value.replace("\\", "/").split("/")
    if os.path.isabs(value) or ".." in parts or any(c < " " for c in value):  # control characters: NUL, newline
        raise _fail(meta_path, f"key '{key}' is {_show(value)}, which is not a file inside the dataset directory",
                    "File names in meta.json are relative to the directory, without '..' or control characters. "
                    + _REDO)
    return value


def _get_files(meta: dict, key: str, meta_path: str, allowed: tuple[str, ...] | None = None,
               what: str = "") -> dict[str, str]:
    """An optional ``{name: file}`` object; names (of kind ``what``) limited to ``allowed`` unless None."""
    files = _get(meta, key, dict, meta_path, optional=True) or {}
    for name, file_name in files.items():
        if allowed is not None and name not in allowed:
            raise _fail(meta_path, f"unknown {what} '{_name(name)}' in key '{key}'",
                        f"{what.capitalize()}s are {', '.join(allowed)}. " + _REDO)
        _check_file_name(file_name, f"{key}.{_name(name)}", meta_path)
    return files


def check_format(meta: Any, meta_path: str) -> None:
    """meta.json describes an lsm-gnn dataset of a schema version this code reads."""
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise _fail(meta_path, f"not an lsm-gnn dataset description (format is {_show(found)})",
                    f"Expected format '{FORMAT_NAME}'; create the dataset with 'lsm-gnn prepare'")
    version = _get(meta, "version", int, meta_path)
    if version > HETERO_SCHEMA_VERSION:
        raise _fail(meta_path, f"schema version {version} is newer than this lsm-gnn understands "
                    f"({HETERO_SCHEMA_VERSION})", "Upgrade lsm-gnn (pip install -U lsm-gnn)")
    if version < 1:
        raise _fail(meta_path, f"unknown schema version {version}", "Re-create the dataset with 'lsm-gnn prepare'")


def check_feature_meta(feats: dict, meta_path: str, key: str) -> None:
    """The keys of a feature layout entry (``key``: its place in meta.json, e.g. ``features.``)."""
    _check_file_name(_get(feats, "file", str, meta_path, key), f"{key}file", meta_path)
    if _get(feats, "dtype", str, meta_path, key) not in FEATURE_DTYPES:
        raise _fail(meta_path, f"feature dtype '{feats['dtype']}' of '{key}dtype' is not supported",
                    f"Use one of {', '.join(FEATURE_DTYPES)}")
    for name in ("dim", "row_bytes", "row_stride", "page_size", "file_bytes"):
        _get_int(feats, name, meta_path, 1, prefix=key)


def check_checksums_meta(meta: dict, meta_path: str) -> None:
    checksums = _get(meta, "checksums", dict, meta_path, optional=True) or {}
    for file_name, value in checksums.items():
        _check_file_name(file_name, f"checksums.{_name(file_name)}", meta_path)
        if not isinstance(value, str) or not value.startswith("crc32:"):
            raise _fail(meta_path, f"key 'checksums.{_name(file_name)}' must be a string 'crc32:<8 hex digits>', got "
                        f"{_show(value)}", _REDO)
    blocks = _get(meta, "block_checksums", dict, meta_path, optional=True)
    if blocks is None:  # written before block checksums: data.verify=sampled refuses it, the rest works
        return
    _check_file_name(_get(blocks, "file", str, meta_path, "block_checksums."), "block_checksums.file", meta_path)
    block_bytes = _get_int(blocks, "block_bytes", meta_path, 4096, prefix="block_checksums.")
    if block_bytes % 4096:
        raise _fail(meta_path, f"key 'block_checksums.block_bytes' must be a multiple of 4096, got {block_bytes}",
                    _REDO)
    for file_name, span in _get(blocks, "files", dict, meta_path, "block_checksums.").items():
        key = f"block_checksums.files.{_name(file_name)}"
        _check_file_name(file_name, key, meta_path)
        if (not isinstance(span, list) or len(span) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in span)):
            raise _fail(meta_path, f"key '{key}' must be [first, count], two integers >= 0 (where the file's "
                        f"block sums lie in {blocks['file']}), got {_show(span)}", _REDO)


def check_block_sums_file(path: str, meta: dict, meta_path: str) -> None:
    """The block-checksum file holds every block of the files it covers, as their sizes are now."""
    blocks = meta.get("block_checksums")
    if blocks is None:
        return
    sums_path = contained_path(path, blocks["file"], DatasetError)
    if not os.path.isfile(sums_path):
        raise _fail(sums_path, "the block checksum file named by 'block_checksums.file' is missing", _REDO)
    entries = os.path.getsize(sums_path) // 4
    for file_name, (first, count) in blocks["files"].items():
        file_path = contained_path(path, file_name, DatasetError)
        if first + count > entries:
            raise _fail(meta_path, f"'block_checksums.files.{_name(file_name)}' = [{first}, {count}] lies beyond "
                        f"the {entries} sums in {blocks['file']}", _REDO)
        if os.path.isfile(file_path) and block_count(os.path.getsize(file_path), blocks["block_bytes"]) != count:
            raise _fail(file_path, f"the file has {os.path.getsize(file_path)} bytes, which is not the {count} "
                        f"blocks of {blocks['block_bytes']} bytes that {META_FILE} records for it (it was cut "
                        "short, grew, or is not this dataset's)", _REDO)


def _check_meta(meta: Any, meta_path: str) -> None:
    """Every known key of a schema-1 meta.json: JSON type, range and file names. Unknown keys are free-form."""
    for key in ("name", "created_by"):
        _get(meta, key, str, meta_path, optional=True)
    _get(meta, "generator", dict, meta_path, optional=True)
    num_nodes = _get_int(meta, "num_nodes", meta_path, 1)
    _get_int(meta, "num_edges", meta_path, 0)

    check_feature_meta(_get(meta, "features", dict, meta_path), meta_path, "features.")

    graph = _get(meta, "graph", dict, meta_path)
    for key in ("indptr", "indices"):
        _check_file_name(_get(graph, key, str, meta_path, "graph."), f"graph.{key}", meta_path)
    _get(graph, "orientation", str, meta_path, "graph.", optional=True)

    labels = _get(meta, "labels", str, meta_path, nullable=True)  # the writer records "no labels" as null
    if labels is not None:
        _check_file_name(labels, "labels", meta_path)
    num_classes = _get_int(meta, "num_classes", meta_path, 1, MAX_CLASSES, nullable=True)
    if labels is not None and num_classes is None:
        raise _fail(meta_path, "key 'labels' names a file but 'num_classes' is missing",
                    "Set num_classes to the number of classes (labels lie in [-1, num_classes)) or re-create the "
                    "dataset")
    _get_files(meta, "splits", meta_path, SPLITS, "split")
    _get_files(meta, "scores", meta_path)
    _get_files(meta, "edge_splits", meta_path, EDGE_SPLITS, "edge split")
    check_checksums_meta(meta, meta_path)
    if "num_users" in meta or "num_items" in meta:
        num_users = _get_int(meta, "num_users", meta_path, 1)
        num_items = _get_int(meta, "num_items", meta_path, 1)
        if num_users + num_items != num_nodes:
            raise _fail(meta_path, f"num_users={num_users} and num_items={num_items} must be positive and sum to "
                        f"num_nodes={num_nodes}",
                        "Users are nodes [0, num_users), items the rest; re-create the dataset")


def _load_npy(ds_path: str, name: str, dtype_choices: tuple[str, ...], length: int | None, what: str,
              width: int | None = None) -> np.ndarray:
    """A .npy of ``length`` entries (any if None), one-dimensional or, with ``width``, of shape (length, width)."""
    path = contained_path(ds_path, name, DatasetError)
    if not os.path.isfile(path):
        raise _fail(path, f"the {what} file is missing", "Re-create the dataset with 'lsm-gnn prepare'")
    try:
        array = np.load(path, mmap_mode="r")
    except Exception as exc:  # numpy raises ValueError/OSError/EOFError for bad headers and short files
        raise _fail(path, f"cannot read the {what} array ({exc})",
                    "The file is truncated or not a .npy file; re-create the dataset") from exc
    expected = "one dimension" if width is None else f"shape (n, {width})"
    if array.ndim != (1 if width is None else 2) or width is not None and array.shape[1] != width:
        raise _fail(path, f"the {what} array has shape {array.shape}, expected {expected}", "Re-create the dataset")
    if array.dtype.name not in dtype_choices:
        raise _fail(path, f"the {what} array has dtype {array.dtype}, expected one of {', '.join(dtype_choices)}",
                    "Convert it to a supported dtype and re-create the dataset")
    if not array.dtype.isnative:
        raise _fail(path, f"the {what} array is stored in non-native byte order ({array.dtype.str})",
                    "Re-save it as a.astype(a.dtype.newbyteorder('=')) or re-create the dataset")
    if length is not None and array.shape[0] != length:
        raise _fail(path, f"the {what} array has {array.shape[0]} entries, expected {length}",
                    "The file does not belong to this dataset or is truncated; re-create the dataset")
    return array


def _chunks(array: np.ndarray, overlap: int = 0):
    """(start, block) over the first axis, ``overlap`` extra entries per block; memory stays bounded."""
    for start in range(0, array.shape[0], SCAN_CHUNK):
        block = np.asarray(array[start:start + SCAN_CHUNK + overlap])
        if block.size:
            yield start, block


def _check_range(path: str, array: np.ndarray, low: int, high: int, what: str, fix: str) -> None:
    """Every value in [low, high)."""
    for start, block in _chunks(array):
        if int(block.min()) < low or int(block.max()) >= high:
            bad = start + int(np.flatnonzero((block < low) | (block >= high))[0])
            raise _fail(path, f"{what} at position {bad} is {int(array[bad])}, outside [{low}, {high})", fix)


def _check_indptr(path: str, indptr: np.ndarray, num_edges: int, fix: str) -> None:
    """Starts at 0, ends at num_edges, never decreases: every row is an ordered range of positions."""
    if int(indptr[0]) != 0 or int(indptr[-1]) != num_edges:
        raise _fail(path, f"indptr starts at {int(indptr[0])} and ends at {int(indptr[-1])}; expected 0 and "
                    f"num_edges={num_edges}", fix)
    for start, block in _chunks(indptr, overlap=1):
        drops = np.flatnonzero(np.diff(block) < 0)
        if drops.size:
            v = start + int(drops[0])
            raise _fail(path, f"indptr decreases at node {v} (indptr[{v}]={int(block[drops[0]])} > "
                        f"indptr[{v + 1}]={int(block[drops[0] + 1])}), so its row has a negative length", fix)


def _check_finite(path: str, array: np.ndarray, what: str) -> None:
    for start, block in _chunks(array):
        bad = np.flatnonzero(~np.isfinite(block))
        if bad.size:
            raise _fail(path, f"{what} at position {start + int(bad[0])} is {block[bad[0]]}, not a finite number",
                        "Recompute the scores with 'lsm-gnn prepare scores <dataset>'")


def _read_meta(meta_path: str) -> Any:
    try:
        with open(meta_path, encoding="utf-8") as f:
            return json.load(f)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, absurd nesting
        raise _fail(meta_path, f"not valid JSON ({str(exc)[:120]})",
                    "The file is damaged; re-create the dataset") from exc


def check_feature_file(path: str, meta_path: str, feats: dict, num_nodes: int, key: str) -> None:
    """A feature layout (its meta.json entry ``key``, e.g. ``features.``) is consistent and its file has
    exactly the size it describes."""
    itemsize = np.dtype(feats["dtype"]).itemsize
    if feats["row_bytes"] != feats["dim"] * itemsize:
        raise _fail(meta_path, f"{key}row_bytes={feats['row_bytes']} does not equal dim ({feats['dim']}) x "
                    f"{feats['dtype']} size ({itemsize})", "The description is inconsistent; re-create the dataset")
    stride_problem = row_stride_problem(feats["row_bytes"], feats["row_stride"])
    if stride_problem is not None:
        raise _fail(meta_path, f"{key}{stride_problem}",
                    f"Valid strides are multiples of {ROW_ALIGNMENT} or, for rows under {ROW_ALIGNMENT} bytes, a "
                    "power of two that holds the row; re-create the dataset with lsm-gnn prepare")
    if feats["page_size"] % ROW_ALIGNMENT:
        raise _fail(meta_path, f"{key}page_size={feats['page_size']} is not a multiple of {ROW_ALIGNMENT}",
                    "Re-create the dataset")
    expected_bytes = feature_file_bytes(num_nodes, feats["row_stride"], feats["page_size"])
    if feats["file_bytes"] != expected_bytes:
        raise _fail(meta_path, f"{key}file_bytes={feats['file_bytes']} but {num_nodes} rows of stride "
                    f"{feats['row_stride']} padded to {feats['page_size']} take {expected_bytes}",
                    "The description is inconsistent; re-create the dataset")
    feature_path = contained_path(path, feats["file"], DatasetError)
    if not os.path.isfile(feature_path):
        raise _fail(feature_path, "the feature file is missing", "Re-create the dataset with 'lsm-gnn prepare'")
    actual = os.path.getsize(feature_path)
    if actual != expected_bytes:
        problem = "truncated" if actual < expected_bytes else "larger than described"
        owner = "" if key == "features." else f" of {key[:-len('features.') - 1]}"  # schema 2: name the type
        raise _fail(feature_path, f"the feature file{owner} is {problem}: {actual} bytes, expected {expected_bytes} "
                    f"({num_nodes} rows x {feats['row_stride']} bytes, padded to {feats['page_size']})",
                    "Re-create the dataset; an interrupted copy is the usual cause")


def check_csr(path: str, indptr_file: str, indices_file: str, num_rows: int, num_cols: int, num_edges: int,
              check: str) -> None:
    """A CSR of ``num_rows`` rows whose ids lie in ``[0, num_cols)``: shapes, dtypes, indptr endpoints and
    order; with ``check="full"`` every neighbor id too."""
    indptr = _load_npy(path, indptr_file, ("int64",), num_rows + 1, "CSR indptr")
    indices = _load_npy(path, indices_file, INDEX_DTYPES, num_edges, "CSR indices")
    _check_indptr(os.path.join(path, indptr_file), indptr, num_edges,
                  "The topology is corrupt; " + VERIFY_FIX.format(dir=path))
    if check == "full":
        check_neighbor_ids(indices, num_cols, os.path.join(path, indices_file))


def check_node_arrays(path: str, part: dict, num_nodes: int, num_classes: int | None) -> None:
    """Labels, split ids and scores named in ``part`` (meta.json, or one node type's entry of it)."""
    if part.get("labels") is not None:
        labels = _load_npy(path, part["labels"], ("int64",), num_nodes, "labels")
        _check_range(os.path.join(path, part["labels"]), labels, -1, num_classes, "label",
                     "Labels lie in [-1, num_classes) (-1: unlabeled); fix num_classes in meta.json or re-create "
                     "the dataset")
    for split_name, file_name in (part.get("splits") or {}).items():
        ids = _load_npy(path, file_name, ("int64",), None, f"{split_name} split")
        _check_range(os.path.join(path, file_name), ids, 0, num_nodes, f"{split_name} node id", ID_FIX)
    for score_name, file_name in (part.get("scores") or {}).items():
        scores = _load_npy(path, file_name, ("float32",), num_nodes, f"'{score_name}' score")
        _check_finite(os.path.join(path, file_name), scores, f"'{score_name}' score")


def _check_schema2_meta(meta: dict, meta_path: str) -> None:
    """Every known key of a schema-2 meta.json; each error names the node type or relation."""
    for key in ("name", "created_by"):
        _get(meta, key, str, meta_path, optional=True)
    entries = meta.get("node_types")
    if not isinstance(entries, list) or not entries:
        raise _fail(meta_path, f"key 'node_types' must be a non-empty list, got {_show(entries)}", _REDO)
    seen: set[str] = set()
    for k, entry in enumerate(entries):
        _check_listed(entry, f"node_types[{k}]", meta_path)
        name = _get(entry, "name", str, meta_path, f"node_types[{k}].")
        _check_meta_name(name, "node type", f"node_types[{k}]", meta_path)
        if name in seen:
            raise _fail(meta_path, f"node type '{name}' is listed twice in 'node_types'", _REDO)
        seen.add(name)
        prefix = f"node_types.{name}."
        _get_int(entry, "num_nodes", meta_path, 1, prefix=prefix)
        feats = _get(entry, "features", dict, meta_path, prefix, nullable=True)
        if feats is not None:
            check_feature_meta(feats, meta_path, prefix + "features.")
        labels = _get(entry, "labels", str, meta_path, prefix, optional=True, nullable=True)
        if labels is not None:
            _check_file_name(labels, prefix + "labels", meta_path)
            if _get_int(entry, "num_classes", meta_path, 1, MAX_CLASSES, prefix=prefix, nullable=True) is None:
                raise _fail(meta_path, f"key '{prefix}labels' names a file but '{prefix}num_classes' is missing",
                            "Set num_classes to the number of classes or re-create the dataset")
        _get_files(entry, "splits", meta_path, SPLITS, "split")
        _get_files(entry, "scores", meta_path)
    relations = meta.get("relations")
    if not isinstance(relations, list):
        raise _fail(meta_path, f"key 'relations' must be a list, got {_show(relations)}", _REDO)
    seen_relations: set[tuple] = set()
    for k, entry in enumerate(relations):
        _check_listed(entry, f"relations[{k}]", meta_path)
        parts = tuple(_get(entry, key, str, meta_path, f"relations[{k}].") for key in ("src", "name", "dst"))
        key = relation_key(parts)
        for role, type_name in (("src", parts[0]), ("dst", parts[2])):
            if type_name not in seen:
                raise _fail(meta_path, f"relation '{key}' names {role} type '{_name(type_name)}', which is not in "
                            f"'node_types' ({', '.join(sorted(seen))})", _REDO)
        _check_meta_name(parts[1], "relation name", f"relation '{key}'", meta_path)
        if parts in seen_relations:
            raise _fail(meta_path, f"relation '{key}' is listed twice in 'relations'", _REDO)
        seen_relations.add(parts)
        _get_int(entry, "num_edges", meta_path, 0, prefix=f"relations.{key}.")
        for file_key in ("indptr", "indices"):
            _check_file_name(_get(entry, file_key, str, meta_path, f"relations.{key}."),
                             f"relations.{key}.{file_key}", meta_path)
    target = _get(meta, "target", str, meta_path, optional=True, nullable=True)
    if target is not None and target not in seen:
        raise _fail(meta_path, f"target type '{_name(target)}' is not in 'node_types' ({', '.join(sorted(seen))})",
                    _REDO)
    check_checksums_meta(meta, meta_path)


def _check_meta_name(name: str, what: str, where: str, meta_path: str) -> None:
    try:
        check_name(name, what)
    except ValueError as exc:
        raise _fail(meta_path, f"{where}: {exc}", _REDO) from None


def _check_listed(entry: Any, where: str, meta_path: str) -> None:
    if not isinstance(entry, dict):
        raise _fail(meta_path, f"{where} must be an object, got {_show(entry)}", _REDO)


def _check_typed_files(path: str, meta: dict, meta_path: str, node_types: list[dict], relations: list[dict],
                       check: str) -> None:
    """The files of a graph of typed nodes and relations, either schema's (its meta.json checked already):
    each type's feature file, the block sums, each relation's CSR, each type's labels, splits and scores.
    Entries are :func:`typed_entries`'."""
    num_nodes = {e["name"]: e["num_nodes"] for e in node_types}
    for entry in node_types:
        if entry.get("features") is not None:
            where = "features." if "node_types" not in meta else f"node_types.{entry['name']}.features."
            check_feature_file(path, meta_path, entry["features"], entry["num_nodes"], where)
    check_block_sums_file(path, meta, meta_path)
    for entry in relations:
        check_csr(path, entry["indptr"], entry["indices"], num_nodes[entry["dst"]], num_nodes[entry["src"]],
                  entry["num_edges"], check)
    for entry in node_types:
        check_node_arrays(path, entry, entry["num_nodes"], entry.get("num_classes"))


#: the node type and relation a schema-1 dataset is: a typed graph of one type and one relation
ONE_TYPE = "node"
ONE_RELATION = (ONE_TYPE, "to", ONE_TYPE)


def typed_entries(meta: dict) -> tuple[list[dict], list[dict], str | None]:
    """(node type entries, relation entries, target) of either schema's meta.json, in schema 2's shape."""
    if "node_types" in meta:
        return meta["node_types"], meta["relations"], meta.get("target")
    node = {"name": ONE_TYPE, "num_nodes": meta["num_nodes"], "features": meta["features"],
            "labels": meta.get("labels"), "num_classes": meta.get("num_classes"),
            "splits": meta.get("splits") or {}, "scores": meta.get("scores") or {}}
    src, name, dst = ONE_RELATION
    graph = meta["graph"]
    relation = {"src": src, "name": name, "dst": dst, "num_edges": meta["num_edges"],
                "indptr": graph["indptr"], "indices": graph["indices"]}
    return [node], [relation], ONE_TYPE


def check_schema1(path: str, meta: dict, meta_path: str, check: str) -> None:
    """Validates a schema-1 dataset: the checks of a typed graph of one type and one relation, plus held-out
    pairs."""
    _check_meta(meta, meta_path)
    _check_typed_files(path, meta, meta_path, *typed_entries(meta)[:2], check)
    num_nodes, num_users = meta["num_nodes"], meta.get("num_users")
    for split_name, file_name in (meta.get("edge_splits") or {}).items():
        pairs = _load_npy(path, file_name, ("int64",), None, f"{split_name} edge split", width=2)
        # Pairs are (user, item) in a user-item dataset, any two nodes otherwise.
        first_end, second_start = (num_nodes, 0) if num_users is None else (num_users, num_users)
        edge_path = os.path.join(path, file_name)
        _check_range(edge_path, pairs[:, 0], 0, first_end, f"{split_name} pair's first node", ID_FIX)
        _check_range(edge_path, pairs[:, 1], second_start, num_nodes, f"{split_name} pair's second node", ID_FIX)


def check_schema2(path: str, meta: dict, meta_path: str, check: str) -> None:
    """Validates a schema-2 dataset: the same checks as schema 1, per node type and per relation."""
    if check not in CHECKS:
        raise ValueError(f"check must be one of {CHECKS}, got {check!r}")
    _check_schema2_meta(meta, meta_path)
    _check_typed_files(path, meta, meta_path, *typed_entries(meta)[:2], check)
    target = meta.get("target")
    if target is not None and next(e for e in meta["node_types"] if e["name"] == target).get("labels") is None:
        raise _fail(meta_path, f"target type '{target}' has no labels",
                    "Write labels for it or name another target; " + _REDO)


def read_dataset_meta(path: str) -> dict:
    """The meta.json of dataset directory ``path``: present, JSON, of the format and a schema version this code
    reads (its keys and files are :func:`check_dataset`'s)."""
    if not os.path.isdir(path):
        raise _fail(path, "no such dataset directory",
                    "Create one with 'lsm-gnn prepare synthetic --out <dir>' or a converter")
    meta_path = os.path.join(path, META_FILE)
    if not os.path.isfile(meta_path):
        raise _fail(meta_path, "missing", "The directory is not an lsm-gnn dataset; create one with 'lsm-gnn prepare'")
    meta = _read_meta(meta_path)
    check_format(meta, meta_path)
    return meta


def check_dataset(path: str, meta: dict, check: str) -> None:
    """Validates the dataset at ``path`` whose meta.json :func:`read_dataset_meta` read, by its schema."""
    meta_path = os.path.join(path, META_FILE)
    (check_schema2 if meta["version"] == HETERO_SCHEMA_VERSION else check_schema1)(path, meta, meta_path, check)


def source_file(array: Any) -> str | None:
    """The file an array was memory-mapped from (``np.load(..., mmap_mode="r")``), else None."""
    path = getattr(array, "filename", None)
    return None if path is None else os.fspath(path)


def check_neighbor_ids(indices: np.ndarray, num_nodes: int, path: str | None = None) -> None:
    """Every neighbor id in [0, num_nodes): the O(num_edges) scan that check="full" adds."""
    path = path or source_file(indices)
    directory = os.path.dirname(path) if path else "<dataset>"
    _check_range(path or "the CSR indices array", indices, 0, num_nodes, "neighbor id",
                 "The topology is corrupt; " + VERIFY_FIX.format(dir=directory))


def topology_error(exc: Exception, indptr_file: str | None, indices_file: str | None) -> DatasetError:
    """The DatasetError for a CSR fault found by the native code: ``exc`` is an
    ``lsm_gnn._C.CorruptGraphError`` whose args are (message, "indptr" or "indices")."""
    message, array = exc.args
    path = indptr_file if array == "indptr" else indices_file
    where = path or f"the CSR {array} array"
    directory = os.path.dirname(path) if path else "<dataset>"
    return _fail(where, message, "The topology is corrupt - " + VERIFY_FIX.format(dir=directory))
