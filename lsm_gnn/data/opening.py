"""Opening a dataset directory: one entry point for both schemas.

It reads meta.json (:func:`lsm_gnn.data.format.read_dataset_meta`), checks the directory by its schema
(:func:`lsm_gnn.data.format.check_dataset`: a schema-1 dataset is a typed graph of one type and one relation),
and opens either as the one :class:`~lsm_gnn.data.dataset.Dataset`.
"""
from __future__ import annotations

import os

from lsm_gnn.data.dataset import Dataset
from lsm_gnn.data.format import CHECK_ALIASES, CHECKS, check_dataset, read_dataset_meta


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
    meta = read_dataset_meta(path)
    check_dataset(path, meta, check)
    return Dataset(path, meta)
