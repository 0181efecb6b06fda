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

One node's feature row is one cache line and one aligned read: the stride is
a multiple of 512 bytes so every row starts on an ``O_DIRECT`` boundary.

Opening validates everything (see :func:`open_dataset`); a problem raises
:class:`DatasetError` naming the file and the fix.
"""
from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

FORMAT_NAME = "lsm-gnn-dataset"
SCHEMA_VERSION = 1
META_FILE = "meta.json"
PAGE_SIZE = 4096
ROW_ALIGNMENT = 512
FEATURE_DTYPES = ("float32", "float16", "int8", "uint8")
INDEX_DTYPES = ("int32", "int64")
SPLITS = ("train", "val", "test")
EDGE_SPLITS = ("val", "test")  # training edges are the CSR itself
CHECKSUM_CHUNK = 64 << 20


class DatasetError(ValueError):
    """A dataset directory is missing, malformed or inconsistent."""


def row_stride_for(row_bytes: int, alignment: int = ROW_ALIGNMENT) -> int:
    """Bytes between rows: ``row_bytes`` rounded up to ``alignment`` (a multiple of 512)."""
    if alignment <= 0 or alignment % ROW_ALIGNMENT:
        raise ValueError(f"row alignment must be a positive multiple of {ROW_ALIGNMENT}, got {alignment}")
    return -(-row_bytes // alignment) * alignment


def feature_file_bytes(num_nodes: int, row_stride: int, page_size: int = PAGE_SIZE) -> int:
    """Size of the feature file: all rows, padded to a whole page."""
    return -(-num_nodes * row_stride // page_size) * page_size


def crc32_file(path: str, chunk: int = CHECKSUM_CHUNK) -> str:
    """CRC-32 of a file, streamed, as ``"crc32:xxxxxxxx"``."""
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            crc = zlib.crc32(block, crc)
    return f"crc32:{crc:08x}"


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


class Dataset:
    """An opened, validated dataset directory.

    Arrays are memory-mapped and loaded on first use, so opening a dataset
    of 10^8 nodes costs only its validation. Use ``Dataset.features`` through
    a storage backend (:func:`lsm_gnn.storage.open_storage`), not directly.
    """

    def __init__(self, path: str, meta: dict[str, Any]):
        self.path = os.path.abspath(path)
        self.meta = meta
        f = meta["features"]
        self.features = FeatureLayout(
            file=f["file"], dtype=f["dtype"], dim=int(f["dim"]), row_bytes=int(f["row_bytes"]),
            row_stride=int(f["row_stride"]), page_size=int(f["page_size"]), file_bytes=int(f["file_bytes"]),
        )
        self.num_nodes = int(meta["num_nodes"])
        self.num_edges = int(meta["num_edges"])
        self.num_classes = meta.get("num_classes")
        self.name = meta.get("name", os.path.basename(self.path))
        self._cache: dict[str, np.ndarray] = {}

    def __repr__(self) -> str:
        return (f"Dataset(name={self.name!r}, num_nodes={self.num_nodes}, num_edges={self.num_edges}, "
                f"feature_dim={self.feature_dim}, feature_dtype={self.features.dtype}, path={self.path!r})")

    # -- paths and layout --------------------------------------------------
    def file_path(self, name: str) -> str:
        return os.path.join(self.path, name)

    @property
    def feature_path(self) -> str:
        return self.file_path(self.features.file)

    @property
    def feature_dim(self) -> int:
        return self.features.dim

    @property
    def feature_dtype(self) -> np.dtype:
        return self.features.numpy_dtype

    # -- arrays ------------------------------------------------------------
    def _array(self, name: str) -> np.ndarray:
        if name not in self._cache:
            self._cache[name] = np.load(self.file_path(name), mmap_mode="r")
        return self._cache[name]

    @property
    def indptr(self) -> np.ndarray:
        return self._array(self.meta["graph"]["indptr"])

    @property
    def indices(self) -> np.ndarray:
        return self._array(self.meta["graph"]["indices"])

    @property
    def labels(self) -> np.ndarray | None:
        name = self.meta.get("labels")
        return None if name is None else self._array(name)

    def split(self, name: str) -> np.ndarray:
        """Node ids of split ``name`` (train, val or test)."""
        splits = self.meta.get("splits", {})
        if name not in splits:
            raise KeyError(f"dataset {self.path} has no '{name}' split; it has: {sorted(splits) or 'none'}")
        return self._array(splits[name])

    @property
    def score_names(self) -> list[str]:
        return sorted(self.meta.get("scores", {}))

    def score(self, name: str) -> np.ndarray:
        """Static per-node score ``name`` (e.g. ``reverse_pagerank``, ``degree``)."""
        scores = self.meta.get("scores", {})
        if name not in scores:
            raise KeyError(f"dataset {self.path} has no '{name}' score; it has: {sorted(scores) or 'none'}. "
                           "Compute it with 'lsm-gnn prepare scores <dataset>'")
        return self._array(scores[name])

    @property
    def num_users(self) -> int | None:
        """Users are nodes ``[0, num_users)`` of a user-item dataset; None for other graphs."""
        return self.meta.get("num_users")

    @property
    def num_items(self) -> int | None:
        """Items are nodes ``[num_users, num_nodes)`` of a user-item dataset; None for other graphs."""
        return self.meta.get("num_items")

    @property
    def edge_split_names(self) -> list[str]:
        return sorted(self.meta.get("edge_splits", {}))

    def edge_split(self, name: str) -> np.ndarray:
        """Held-out node pairs of split ``name`` (val or test): int64, shape ``(E, 2)``, not in the CSR."""
        edge_splits = self.meta.get("edge_splits", {})
        if name not in edge_splits:
            raise KeyError(f"dataset {self.path} has no '{name}' edge split; it has: {sorted(edge_splits) or 'none'}. "
                           "Generate a user-item dataset with lsm_gnn.data.bipartite.generate_bipartite, or write "
                           "held-out pairs with DatasetWriter.write_edge_split")
        return self._array(edge_splits[name])

    def read_features_direct(self, ids: np.ndarray) -> np.ndarray:
        """Reads feature rows with plain buffered file reads: slow, simple,
        the ground truth that tests compare every storage and cache path to."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        out = np.empty((ids.size, self.feature_dim), dtype=self.feature_dtype)
        with open(self.feature_path, "rb") as f:
            for i, node in enumerate(ids):
                if not 0 <= node < self.num_nodes:
                    raise IndexError(f"node id {node} is out of range [0, {self.num_nodes})")
                f.seek(int(node) * self.features.row_stride)
                out[i] = np.frombuffer(f.read(self.features.row_bytes), dtype=self.feature_dtype)
        return out

    def verify_checksums(self) -> None:
        """Re-reads every file and compares it to the checksum in meta.json."""
        for name, expected in self.meta.get("checksums", {}).items():
            actual = crc32_file(self.file_path(name))
            if actual != expected:
                raise DatasetError(f"{self.file_path(name)}: checksum {actual} does not match {expected} recorded in "
                                   f"{META_FILE}; the file is corrupt or was changed - re-create the dataset")


# -- validation --------------------------------------------------------------

def _fail(path: str, problem: str, fix: str) -> DatasetError:
    return DatasetError(f"{path}: {problem}. {fix}")


def _require(meta: dict, key: str, kind: type | tuple, where: str) -> Any:
    if key not in meta:
        raise _fail(where, f"missing key '{key}'", "The file was not written by lsm-gnn or is damaged; re-create it")
    value = meta[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise _fail(where, f"key '{key}' has the wrong type ({type(value).__name__})",
                    "The file is damaged; re-create the dataset")
    return value


def _load_npy(ds_path: str, name: str, dtype_choices: tuple[str, ...], length: int | None, what: str,
              width: int | None = None) -> np.ndarray:
    """A .npy of ``length`` entries (any if None), one-dimensional or, with ``width``, of shape (length, width)."""
    path = os.path.join(ds_path, name)
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
    if length is not None and array.shape[0] != length:
        raise _fail(path, f"the {what} array has {array.shape[0]} entries, expected {length}",
                    "The file does not belong to this dataset or is truncated; re-create the dataset")
    return array


def _check_range(path: str, array: np.ndarray, low: int, high: int, what: str, chunk: int = 1 << 24) -> None:
    """Every value in [low, high); scanned in chunks to keep memory bounded."""
    for start in range(0, array.shape[0], chunk):
        block = np.asarray(array[start:start + chunk])
        if block.size == 0:
            continue
        lo, hi = int(block.min()), int(block.max())
        if lo < low or hi >= high:
            bad = start + int(np.flatnonzero((block < low) | (block >= high))[0])
            raise _fail(path, f"{what} at position {bad} is {int(array[bad])}, outside [{low}, {high})",
                        "The ids do not match this dataset's node count; re-create the dataset")


def _check_bipartite(meta: dict, meta_path: str, num_nodes: int) -> int | None:
    """``num_users`` of a user-item dataset (users first, then items), None for other graphs."""
    if "num_users" not in meta and "num_items" not in meta:
        return None
    num_users = _require(meta, "num_users", int, meta_path)
    num_items = _require(meta, "num_items", int, meta_path)
    if num_users <= 0 or num_items <= 0 or num_users + num_items != num_nodes:
        raise _fail(meta_path, f"num_users={num_users} and num_items={num_items} must be positive and sum to "
                    f"num_nodes={num_nodes}", "Users are nodes [0, num_users), items the rest; re-create the dataset")
    return num_users


def open_dataset(path: str | os.PathLike, check: str = "full") -> Dataset:
    """Opens and validates a dataset directory.

    ``check="full"`` (default) also scans the topology, labels and splits for
    out-of-range values (linear in their size); ``check="shape"`` only checks
    files, sizes and dtypes, for very large graphs opened often. Checksums are
    verified separately by :meth:`Dataset.verify_checksums`.
    """
    if check not in ("full", "shape"):
        raise ValueError(f"check must be 'full' or 'shape', got {check!r}")
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise _fail(path, "no such dataset directory",
                    "Create one with 'lsm-gnn prepare synthetic --out <dir>' or a converter")
    meta_path = os.path.join(path, META_FILE)
    if not os.path.isfile(meta_path):
        raise _fail(meta_path, "missing", "The directory is not an lsm-gnn dataset; create one with 'lsm-gnn prepare'")
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except json.JSONDecodeError as exc:
        raise _fail(meta_path, f"not valid JSON ({exc})", "The file is damaged; re-create the dataset") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise _fail(meta_path, f"not an lsm-gnn dataset description (format is {meta.get('format') if isinstance(meta, dict) else None!r})",
                    f"Expected format '{FORMAT_NAME}'; create the dataset with 'lsm-gnn prepare'")
    version = _require(meta, "version", int, meta_path)
    if version > SCHEMA_VERSION:
        raise _fail(meta_path, f"schema version {version} is newer than this lsm-gnn understands ({SCHEMA_VERSION})",
                    "Upgrade lsm-gnn (pip install -U lsm-gnn)")
    if version < 1:
        raise _fail(meta_path, f"unknown schema version {version}", "Re-create the dataset with 'lsm-gnn prepare'")

    num_nodes = _require(meta, "num_nodes", int, meta_path)
    num_edges = _require(meta, "num_edges", int, meta_path)
    if num_nodes <= 0 or num_edges < 0:
        raise _fail(meta_path, f"num_nodes={num_nodes}, num_edges={num_edges}", "Counts must be positive")
    feats = _require(meta, "features", dict, meta_path)
    for key in ("file", "dtype"):
        _require(feats, key, str, meta_path + " [features]")
    for key in ("dim", "row_bytes", "row_stride", "page_size", "file_bytes"):
        _require(feats, key, int, meta_path + " [features]")
    if feats["dtype"] not in FEATURE_DTYPES:
        raise _fail(meta_path, f"feature dtype '{feats['dtype']}' is not supported",
                    f"Use one of {', '.join(FEATURE_DTYPES)}")
    itemsize = np.dtype(feats["dtype"]).itemsize
    if feats["dim"] <= 0 or feats["row_bytes"] != feats["dim"] * itemsize:
        raise _fail(meta_path, f"feature row_bytes={feats['row_bytes']} does not equal dim ({feats['dim']}) x "
                    f"{feats['dtype']} size ({itemsize})", "The description is inconsistent; re-create the dataset")
    if feats["row_stride"] < feats["row_bytes"] or feats["row_stride"] % ROW_ALIGNMENT:
        raise _fail(meta_path, f"feature row_stride={feats['row_stride']} is not a multiple of {ROW_ALIGNMENT} "
                    f"at least row_bytes={feats['row_bytes']}",
                    "Rows must be O_DIRECT-aligned; re-create the dataset with lsm-gnn prepare")
    if feats["page_size"] % ROW_ALIGNMENT or feats["page_size"] <= 0:
        raise _fail(meta_path, f"page_size={feats['page_size']} is not a multiple of {ROW_ALIGNMENT}",
                    "Re-create the dataset")
    expected_bytes = feature_file_bytes(num_nodes, feats["row_stride"], feats["page_size"])
    if feats["file_bytes"] != expected_bytes:
        raise _fail(meta_path, f"features.file_bytes={feats['file_bytes']} but {num_nodes} rows of stride "
                    f"{feats['row_stride']} padded to {feats['page_size']} take {expected_bytes}",
                    "The description is inconsistent; re-create the dataset")
    feature_path = os.path.join(path, feats["file"])
    if not os.path.isfile(feature_path):
        raise _fail(feature_path, "the feature file is missing", "Re-create the dataset with 'lsm-gnn prepare'")
    actual = os.path.getsize(feature_path)
    if actual != expected_bytes:
        problem = "truncated" if actual < expected_bytes else "larger than described"
        raise _fail(feature_path, f"the feature file is {problem}: {actual} bytes, expected {expected_bytes} "
                    f"({num_nodes} rows x {feats['row_stride']} bytes, padded to {feats['page_size']})",
                    "Re-create the dataset; an interrupted copy is the usual cause")

    graph = _require(meta, "graph", dict, meta_path)
    indptr = _load_npy(path, _require(graph, "indptr", str, meta_path), ("int64",), num_nodes + 1, "CSR indptr")
    indices = _load_npy(path, _require(graph, "indices", str, meta_path), INDEX_DTYPES, num_edges, "CSR indices")
    indptr_path = os.path.join(path, graph["indptr"])
    if int(indptr[0]) != 0 or int(indptr[-1]) != num_edges:
        raise _fail(indptr_path, f"indptr starts at {int(indptr[0])} and ends at {int(indptr[-1])}; expected 0 and "
                    f"num_edges={num_edges}", "The topology is inconsistent; re-create the dataset")
    labels_name = meta.get("labels")
    labels = None
    if labels_name is not None:
        labels = _load_npy(path, labels_name, ("int64",), num_nodes, "labels")
    splits = meta.get("splits", {})
    split_arrays = {}
    for split_name, file_name in splits.items():
        if split_name not in SPLITS:
            raise _fail(meta_path, f"unknown split '{split_name}'", f"Splits are {', '.join(SPLITS)}")
        split_arrays[split_name] = _load_npy(path, file_name, ("int64",), None, f"{split_name} split")
    for score_name, file_name in meta.get("scores", {}).items():
        _load_npy(path, file_name, ("float32",), num_nodes, f"'{score_name}' score")
    num_users = _check_bipartite(meta, meta_path, num_nodes)
    edge_splits = meta.get("edge_splits", {})
    if not isinstance(edge_splits, dict):
        raise _fail(meta_path, "key 'edge_splits' has the wrong type", "The file is damaged; re-create the dataset")
    edge_arrays = {}
    for split_name, file_name in edge_splits.items():
        if split_name not in EDGE_SPLITS:
            raise _fail(meta_path, f"unknown edge split '{split_name}'",
                        f"Edge splits are {', '.join(EDGE_SPLITS)} (training edges are the CSR)")
        edge_arrays[split_name] = _load_npy(path, file_name, ("int64",), None, f"{split_name} edge split", width=2)

    if check == "full":
        for start in range(0, num_nodes, 1 << 24):
            block = np.asarray(indptr[start:start + (1 << 24) + 1])
            if np.any(np.diff(block) < 0):
                raise _fail(indptr_path, "indptr decreases, so some row has a negative length",
                            "The topology is corrupt; re-create the dataset")
        _check_range(os.path.join(path, graph["indices"]), indices, 0, num_nodes, "neighbor id")
        if labels is not None and meta.get("num_classes") is not None:
            _check_range(os.path.join(path, labels_name), labels, -1, int(meta["num_classes"]), "label")
        for split_name, array in split_arrays.items():
            _check_range(os.path.join(path, splits[split_name]), array, 0, num_nodes, f"{split_name} node id")
        for split_name, array in edge_arrays.items():
            # Pairs are (user, item) in a user-item dataset, any two nodes otherwise.
            first_end, second_start = (num_nodes, 0) if num_users is None else (num_users, num_users)
            edge_path = os.path.join(path, edge_splits[split_name])
            _check_range(edge_path, array[:, 0], 0, first_end, f"{split_name} pair's first node")
            _check_range(edge_path, array[:, 1], second_start, num_nodes, f"{split_name} pair's second node")
    return Dataset(path, meta)
