"""The embedding table's directory as both of its writers see it: the table (:mod:`lsm_gnn.storage.table`) and
its undo journal's recovery (:mod:`lsm_gnn.storage.journal`), which must not import the table.

Its file names, :class:`TableError`, and writing rows into table.bin in place (:func:`write_runs`).
"""
from __future__ import annotations

import errno
import os

import numpy as np
import torch

from lsm_gnn.utils.fileio import reporting_disk_full

META_FILE = "table.json"
DATA_FILE = "table.bin"
FRESH_FIX = "start fresh (delete the table directory and train from scratch) or restore the table from a backup"


class TableError(ValueError):
    """A table directory is missing, malformed, or does not fit the checkpoint."""


def pwrite_all(fd: int, data, offset: int) -> None:
    """pwrite until every byte is out (pwrite may write less than asked)."""
    view = memoryview(data).cast("B")
    while view.nbytes:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno.ENOSPC, "short write")  # reporting_disk_full names the file
        view, offset = view[n:], offset + n


#: rows are written by one native call (``lsm_gnn._C.write_rows``: a pwrite per row, in C, without the GIL);
#: False: one ``os.pwrite`` per run of consecutive ids, which the crash tests instrument between any two writes
NATIVE_WRITES = True


def write_runs(fd: int, file_name: str, ids: np.ndarray, rows: np.ndarray, stride: int) -> int:
    """pwrites ``rows`` at sorted distinct ``ids``; returns the bytes written."""
    if NATIVE_WRITES:
        from lsm_gnn import _C

        with reporting_disk_full(file_name):
            return _C.write_rows(fd, torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)),
                                 torch.from_numpy(np.ascontiguousarray(rows)), stride)
    n, row_bytes = rows.shape
    if stride != row_bytes:  # a run spans the zero padding between its rows, so it is one buffer
        staged = np.zeros((n, stride), dtype=np.uint8)
        staged[:, :row_bytes] = rows
    else:
        staged = np.ascontiguousarray(rows)
    flat = staged.reshape(-1)
    bounds = np.flatnonzero(np.diff(ids) != 1) + 1
    starts, ends = np.concatenate(([0], bounds)), np.concatenate((bounds, [n]))
    total = 0
    with reporting_disk_full(file_name):
        for s, e in zip(starts.tolist(), ends.tolist()):
            length = (e - s - 1) * stride + row_bytes
            pwrite_all(fd, flat[s * stride:s * stride + length], int(ids[s]) * stride)
            total += length
    return total
