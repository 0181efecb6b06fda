"""The storage interface every backend implements.

A storage serves feature rows of one dataset by node id, in request order:
``read(ids)[i]`` equals the feature row of ``ids[i]`` on disk, for every i,
whatever the order, duplicates or backend. It knows nothing of caches.
"""
from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass

import torch

# Imported here for the reads below; also keeps `from lsm_gnn.storage.base import as_id_tensor` working.
from lsm_gnn.utils.ids import as_id_tensor  # noqa: F401

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "int8": torch.int8, "uint8": torch.uint8}


@dataclass
class StorageStats:
    """Counters since open (or the last reset).

    ``bytes_read`` is what crossed from the file (aligned reads, whole runs);
    ``bytes_useful`` is distinct rows x row bytes; their ratio is the I/O
    amplification. Latencies are per ``read`` call. ``busy_seconds`` is the time at least one read was in
    flight: reads on several threads overlap, so it can be less than ``total_seconds``, their sum.
    """

    backend: str
    batches: int = 0
    rows: int = 0
    unique_rows: int = 0
    requests: int = 0
    bytes_read: int = 0
    bytes_useful: int = 0
    total_seconds: float = 0.0
    last_batch_seconds: float = 0.0
    max_batch_seconds: float = 0.0
    busy_seconds: float = 0.0

    @property
    def amplification(self) -> float:
        """bytes_read / bytes_useful (1.0 is ideal; 0.0 before any read)."""
        return self.bytes_read / self.bytes_useful if self.bytes_useful else 0.0

    @property
    def mean_batch_seconds(self) -> float:
        return self.total_seconds / self.batches if self.batches else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d["amplification"] = self.amplification
        d["mean_batch_seconds"] = self.mean_batch_seconds
        return d


class FeatureStorage(ABC):
    """Base class: the public ``read`` validates, the backend's ``_read`` works."""

    backend = "abstract"

    def __init__(self, num_rows: int, dim: int, dtype: str):
        self.num_rows = int(num_rows)
        self.dim = int(dim)
        self.dtype_name = dtype
        self.dtype = TORCH_DTYPES[dtype]
        self.row_bytes = self.dim * torch.empty((), dtype=self.dtype).element_size()
        self._executor: ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()
        self._closed = False

    @property
    def device(self) -> torch.device:
        """Where reads land: ``read``'s rows and ``read_into``'s ``out`` live here. A cache picks its miss path
        by it (:func:`lsm_gnn.cache.staging.miss_path`)."""
        return torch.device("cpu")

    def read(self, ids, out: torch.Tensor | None = None) -> torch.Tensor:
        """Returns the feature rows of ``ids`` as a ``[len(ids), dim]`` tensor, in request order.

        ``out``, if given, must be a contiguous tensor of that shape, dtype and
        device; it is filled and returned. Out-of-range ids raise IndexError.
        """
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        ids = as_id_tensor(ids)
        n = ids.numel()
        if out is None:
            out = torch.empty((n, self.dim), dtype=self.dtype, device=self.device)
        elif out.shape != (n, self.dim) or out.dtype != self.dtype or not out.is_contiguous() \
                or out.device != self.device:
            raise ValueError(f"out must be a contiguous {self.dtype} tensor of shape ({n}, {self.dim}) on "
                             f"{self.device}, got {out.dtype} {tuple(out.shape)} on {out.device}")
        if n:
            self._read(ids, out)
        return out

    def read_into(self, ids, out: torch.Tensor, slots: torch.Tensor) -> None:
        """Reads the row of ``ids[i]`` into ``out[slots[i]]`` for every ``i``: a cache's misses straight into
        their lines, with no batch-sized buffer between. ``out`` is a contiguous ``[*, dim]`` tensor of the
        storage's dtype on its device; ``slots`` holds one row of ``out`` per id (distinct ones, or rows
        written twice get either id's row)."""
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        if out.dim() != 2 or out.shape[1] != self.dim or out.dtype != self.dtype or not out.is_contiguous() \
                or out.device != self.device:
            raise ValueError(f"out must be a contiguous {self.dtype} tensor of shape (rows, {self.dim}) on "
                             f"{self.device}, got {out.dtype} {tuple(out.shape)} on {out.device}")
        # The slots stay where out is (a cache's lines on its GPU): only their bounds come to the host, in one read.
        ids, slots = as_id_tensor(ids), as_id_tensor(slots, out.device)
        if slots.shape != ids.shape:
            raise ValueError(f"slots must name one row of out per id: {slots.numel()} slots for {ids.numel()} ids")
        if ids.numel():
            low, high = torch.stack(torch.aminmax(slots)).tolist()
            if low < 0 or high >= out.shape[0]:
                raise IndexError(f"slots must lie in [0, {out.shape[0]}) (the rows of out), got {low}..{high}")
            self._read_into(ids, out, slots)

    def _read_into(self, ids: torch.Tensor, out: torch.Tensor, slots: torch.Tensor) -> None:
        """:meth:`read_into` for checked arguments; backends that can place rows themselves override it."""
        out.index_copy_(0, slots, self.read(ids))

    # -- writes (a writable storage: an embedding table) ----------------------------------------------------

    #: whether reads come from a disk, so that reading them early hides their time (a cache reads ahead)
    from_disk = False
    #: whether :meth:`write` works (a feature file is read-only; a trainable embedding table is not)
    writable = False
    #: a journaling storage's ``before_change(ids, rows)``: a cache hands it the stored rows of clean lines
    #: before it changes them (an embedding table keeps them as before-images); None: no journal to feed
    before_change = None

    def write(self, ids, rows: torch.Tensor) -> None:
        """Stores ``rows[i]`` as the row of ``ids[i]``: distinct ids, ``rows`` ``[len(ids), dim]`` of the
        storage's dtype. Only a writable storage (``writable``) takes writes."""
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        if not self.writable:
            raise TypeError(f"{self!r} is read-only: feature files are never written; trainable rows live in "
                            "an embedding table (lsm_gnn.storage.EmbeddingTable)")
        ids = as_id_tensor(ids)
        if rows.shape != (ids.numel(), self.dim) or rows.dtype != self.dtype:
            raise ValueError(f"rows must be a {self.dtype} tensor of shape ({ids.numel()}, {self.dim}), got "
                             f"{rows.dtype} {tuple(rows.shape)}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_rows):
            bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
            raise IndexError(f"node id {bad} is out of range [0, {self.num_rows})")
        if ids.numel():
            self._write(ids, rows.cpu().contiguous())

    def _write(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """:meth:`write` for checked arguments (a CPU int64 tensor of distinct ids and contiguous CPU rows)."""
        raise NotImplementedError

    def update(self, ids, grads: torch.Tensor, apply) -> None:
        """Read-modify-write of the rows of distinct ``ids``: each becomes ``apply(rows, grads)``'s row
        (``grads[i]`` belongs to ``ids[i]``). A cache does the same on its lines; a shared cache at the owner."""
        ids = as_id_tensor(ids)
        self.write(ids, apply(self.read(ids), grads))

    def flush(self) -> None:
        """Nothing is held back: every write already reached the storage."""

    # -- the Features interface (lsm_gnn.features): storage is the source with no cache ---------------------

    caches = False
    cache_lines = owner = None  # no cache, so no lines and no owners
    last_timings: dict = {}

    def gather(self, ids, *, future=None, out: torch.Tensor | None = None, following=None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`read`, with an all-False hit mask (nothing is cached); ``future`` and ``following`` are
        ignored."""
        rows = self.read(ids, out)
        return rows, torch.zeros(rows.shape[0], dtype=torch.bool)

    def counters(self) -> dict[str, int]:
        s = self.stats()
        return {"bytes_read": s.bytes_read, "bytes_useful": s.bytes_useful, "read_seconds": s.busy_seconds}

    def prefetch(self) -> None:
        """Nothing to prefetch without a cache."""

    def settle(self) -> None:
        """Nothing runs in the background."""

    def describe(self) -> str:
        return f"{self.backend} storage, no cache"

    def read_async(self, ids, out: torch.Tensor | None = None) -> Future:
        """Like :meth:`read`, on a background thread; ``.result()`` gives the rows."""
        with self._executor_lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"lsm-{self.backend}")
        return self._executor.submit(self.read, ids, out)

    @abstractmethod
    def _read(self, ids: torch.Tensor, out: torch.Tensor) -> None:
        """Fills ``out`` with the rows of ``ids`` (already a CPU int64 tensor, non-empty)."""

    @abstractmethod
    def stats(self) -> StorageStats:
        """Counters since open or the last :meth:`reset_stats`."""

    @abstractmethod
    def reset_stats(self) -> None:
        """Zeroes the counters."""

    def close(self) -> None:
        self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(backend={self.backend!r}, rows={self.num_rows}, dim={self.dim}, "
                f"dtype={self.dtype_name})")


class CountingStorage(FeatureStorage):
    """A backend written in Python: its counters are kept here, behind a lock.

    ``read_async`` reads on another thread while ``stats()`` may be called from the caller's,
    so every update and snapshot holds the lock. (The native backends count in C++.)
    """

    def __init__(self, num_rows: int, dim: int, dtype: str):
        super().__init__(num_rows, dim, dtype)
        self._stats_lock = threading.Lock()
        self._stats = StorageStats(backend=self.backend)

    def _count(self, rows: int, seconds: float, *, unique_rows: int = 0, requests: int = 0, bytes_read: int = 0,
               bytes_useful: int = 0) -> None:
        """Adds one ``read`` of ``rows`` ids that took ``seconds``."""
        with self._stats_lock:
            s = self._stats
            s.batches += 1
            s.rows += rows
            s.unique_rows += unique_rows
            s.requests += requests
            s.bytes_read += bytes_read
            s.bytes_useful += bytes_useful
            s.total_seconds += seconds
            s.busy_seconds += seconds  # a cache reads ahead only from the native backends: no overlap here
            s.last_batch_seconds = seconds
            s.max_batch_seconds = max(s.max_batch_seconds, seconds)

    def stats(self) -> StorageStats:
        with self._stats_lock:
            return StorageStats(**vars(self._stats))

    def reset_stats(self) -> None:
        with self._stats_lock:
            self._stats = StorageStats(backend=self.backend)
