"""The one interface between feature sources and their readers.

A :class:`Features` gives the rows of node features by node id. Plain
storage (:class:`~lsm_gnn.storage.FeatureStorage`, including the in-memory
backend), the software cache (:class:`~lsm_gnn.cache.SoftwareCache`, which
wraps a storage) and the shared cache over ranks
(:class:`~lsm_gnn.comm.SharedCache`, which wraps a cache) all implement it,
so the loader, the trainer and the PyG/DGL adapters read any of them the
same way and never ask which one they hold (GraphBolt's ``Feature``
composed by wrapping, PyG's ``FeatureStore``).
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

#: counters every Features reports (cumulative since it was opened)
BASE_COUNTERS = ("bytes_read", "bytes_useful")
#: added by a cache with a victim buffer: rows it served instead of storage, and their bytes
PVP_COUNTERS = ("pvp_hits", "bytes_saved")


@runtime_checkable
class Features(Protocol):
    """Node feature rows by id. ``num_rows`` x ``dim`` of ``dtype``, ``row_bytes`` each."""

    num_rows: int
    dim: int
    dtype: torch.dtype
    row_bytes: int
    #: whether :meth:`gather`'s hit mask means anything (a cache) or is all False (storage)
    caches: bool

    def gather(self, ids, *, future=None, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows ``[len(ids), dim]`` in request order, hit mask ``[len(ids)]``) for one batch.

        ``future`` is the window of upcoming batches (a
        :class:`~lsm_gnn.cache.WindowBuffer`) for caches that plan with it;
        ``out`` receives the rows when given.
        """

    def counters(self) -> dict[str, int]:
        """Cumulative I/O counters: :data:`BASE_COUNTERS`, plus :data:`PVP_COUNTERS` with a victim buffer."""

    def prefetch(self) -> None:
        """Starts, in the background, whatever the next :meth:`gather` can use (a victim buffer's queue)."""

    def settle(self) -> None:
        """Waits for background work :meth:`prefetch` started (before the reader stops)."""

    def describe(self) -> str:
        """What this source is, for a log line (e.g. "a 2.0 GiB hybrid cache ... over io_uring storage")."""

    @property
    def last_timings(self) -> dict[str, float]:
        """Seconds of the last :meth:`gather` in stages of its own (e.g. "exchange" between ranks)."""


class StorageShape:
    """The shape of a Features that serves the rows of the storage it wraps (``self.storage``)."""

    @property
    def num_rows(self) -> int:
        return self.storage.num_rows

    @property
    def dim(self) -> int:
        return self.storage.dim

    @property
    def dtype(self) -> torch.dtype:
        return self.storage.dtype

    @property
    def row_bytes(self) -> int:
        return self.storage.row_bytes


class NoFeatures:
    """Rows of width 0 for every node: what a model reads when it takes only trainable embeddings
    (``model.node_embedding.features=false``). Reads nothing."""

    caches = False
    last_timings: dict = {}
    dim = 0
    dtype = torch.float32
    row_bytes = 0

    def __init__(self, num_rows: int):
        self.num_rows = int(num_rows)

    def gather(self, ids, *, future=None, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(ids)
        return torch.empty((n, 0), dtype=self.dtype), torch.zeros(n, dtype=torch.bool)

    def counters(self) -> dict[str, int]:
        return dict.fromkeys(BASE_COUNTERS, 0)

    def prefetch(self) -> None:
        """Nothing to prefetch."""

    def settle(self) -> None:
        """Nothing runs in the background."""

    def describe(self) -> str:
        return "no input features (node embeddings only)"
