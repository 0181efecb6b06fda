"""A stand-in for the part of KvikIO that the gds backend uses (lsm_gnn/storage/gds.py), over plain file reads.

``CuFile(path, "r")`` opens a file; ``pread(buf, size, file_offset)`` fills ``buf`` (a CPU uint8 tensor posing
as device memory) and returns a future whose ``get()`` gives the bytes read; ``close()``. KvikIO's compatibility
mode does the same thing with POSIX reads into a bounce buffer, so this is what the backend sees there.
``install(monkeypatch)`` puts it in ``sys.modules`` and lets the backend's GPU check pass.
"""
from __future__ import annotations

import sys
import types

import torch


class CuFile:
    #: (file offset, size) of every pread since the last clear, in issue order
    requests: list[tuple[int, int]] = []

    def __init__(self, path, mode):
        assert mode == "r", "the gds backend only reads"
        self._fh = open(path, "rb")

    def pread(self, buf, size, file_offset):
        self._fh.seek(file_offset)
        data = self._fh.read(size)
        buf.view(-1)[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        CuFile.requests.append((file_offset, size))
        return types.SimpleNamespace(get=lambda: len(data))

    def close(self):
        self._fh.close()


def install(monkeypatch) -> None:
    """``import kvikio`` gives this module's stand-in, and torch reports a GPU (for the backend's check only)."""
    monkeypatch.setitem(sys.modules, "kvikio", types.SimpleNamespace(CuFile=CuFile))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
