"""Opening a dataset directory: one entry point for both schemas.

It reads meta.json, hands the directory to the schema's own checks (:func:`lsm_gnn.data.format.check_schema1`,
:func:`lsm_gnn.data.hetero.check_schema2`), and opens either as the one :class:`~lsm_gnn.data.dataset.Dataset`.
"""
from __future__ import annotations

import os

from lsm_gnn.data.dataset import Dataset
from lsm_gnn.data.format import (
    CHECK_ALIASES, CHECKS, HETERO_SCHEMA_VERSION, META_FILE, _fail, _read_meta, check_format, check_schema1,
)
from lsm_gnn.data.hetero import check_schema2


def open_dataset(path: str | os.PathLike, check: str = "full") -> Dataset:
    """Opens and validates a dataset directory.

    Every level checks meta.json key by key, files, sizes, dtypes, indptr
    (endpoints and order), labels, split ids, held-out pairs and scores: at
    most O(num_nodes) work. ``check="full"`` (default) also scans the neighbor
    ids, O(num_edges); ``check="fast"`` (formerly "shape") leaves them to the
    native sampler and PageRank, which bounds-check every id they read. The
    file checksums are verified separately by :meth:`Dataset.verify_checksums`.
    """
    check = CHECK_ALIASES.get(check, check)
    if check not in CHECKS:
        raise ValueError(f"check must be 'fast' or 'full' ('shape' is the former name of 'fast'), got {check!r}")
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise _fail(path, "no such dataset directory",
                    "Create one with 'lsm-gnn prepare synthetic --out <dir>' or a converter")
    meta_path = os.path.join(path, META_FILE)
    if not os.path.isfile(meta_path):
        raise _fail(meta_path, "missing", "The directory is not an lsm-gnn dataset; create one with 'lsm-gnn prepare'")
    meta = _read_meta(meta_path)
    check_format(meta, meta_path)
    if meta["version"] == HETERO_SCHEMA_VERSION:
        check_schema2(path, meta, meta_path, check)
    else:
        check_schema1(path, meta, meta_path, check)
    return Dataset(path, meta)
