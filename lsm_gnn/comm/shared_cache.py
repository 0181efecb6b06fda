"""The communication layer: per-rank cache slices that behave as one cache.

Every rank holds a :class:`~lsm_gnn.cache.SoftwareCache` for the nodes it
owns. Each iteration, ``SharedCache.lookup(ids)`` on every rank:

1. deduplicates the batch's ids and buckets them by owner;
2. exchanges counts and ids with ``all_to_all_single`` (uneven splits);
3. serves what it received from its own slice in one lookup (so an id that
   several ranks asked for is looked up, and read from storage, once);
4. sends the rows (with their hit flags) back and reassembles the batch in
   the original order.

The future is shared the same way: each batch newly sampled into a rank's
window is sent, id by owner, to the owners, which keep a window of what
every rank will ask for; that window drives the owners' dynamic policies.

Calls are collective: every rank must call ``lookup`` the same number of
times with windows of the same length (the loader guarantees it). The
exchange runs on its own process group, so it never interleaves with DDP's
gradient all-reduce on another thread. A rank that dies or stops makes
the others fail with :class:`ExchangeError` at the next exchange (gloo
reports the closed connection, or the group's timeout expires).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from lsm_gnn.cache import SoftwareCache, WindowBuffer
from lsm_gnn.comm.group import TIMEOUT_ENV, ProgressBoard, collective_timeout, first_line
from lsm_gnn.features import StorageShape
from lsm_gnn.ids import as_id_tensor, unique_ids


class ExchangeError(RuntimeError):
    """A collective of the exchange failed: another rank died, hung or disagrees on the schedule."""


@dataclass
class ExchangeStats:
    iterations: int = 0
    requested: int = 0        # distinct ids this rank asked for, summed over iterations
    served: int = 0           # distinct ids this rank served as owner, summed over iterations
    remote_requested: int = 0  # of the requested ids, those owned by another rank
    exchange_seconds: float = 0.0  # in collectives (ids, rows, future windows)
    serve_seconds: float = 0.0     # the local lookup for all ranks' requests
    last_exchange_seconds: float = 0.0

    def as_dict(self) -> dict:
        return dict(vars(self))


def exchange_backend(device: torch.device) -> str:
    """The process-group backend for a cache on ``device``: NCCL for a GPU cache where torch has it."""
    if torch.device(device).type == "cuda" and dist.is_nccl_available():
        return "nccl"
    return "gloo"


class SharedCache(StorageShape):
    """Makes ``cache`` (this rank's slice) part of one cache across the ranks of ``group``.

    ``owner`` maps ids to owning ranks (see :mod:`lsm_gnn.comm.ownership`).
    ``group`` defaults to a new group over all ranks whose timeout is
    ``timeout_s``, by default ``LSM_GNN_TIMEOUT_S`` (300 s): NCCL when the
    cache is on a GPU and torch has NCCL, else gloo (``backend`` chooses).
    Over NCCL the rows never leave the device: the exchange sends the cache's
    device tensors as they are. Over gloo they cross in host memory (staged
    there if the cache is on a GPU). The same code serves both.
    """

    def __init__(self, cache: SoftwareCache, owner, group=None, timeout_s: float | None = None,
                 backend: str | None = None):
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("SharedCache needs torch.distributed initialised (torchrun, launch/mpirun.sh, or "
                               "dist.init_process_group); with one process use the SoftwareCache directly")
        self.cache = cache
        self.storage = cache.storage
        self.owner = owner
        timeout = collective_timeout() if timeout_s is None else timedelta(seconds=timeout_s)
        if group is None:
            backend = backend or exchange_backend(cache.device)
            group = dist.new_group(backend=backend, timeout=timeout)
        self.group = group
        self.backend = str(dist.get_backend(group)).lower()
        # Where the exchanged tensors live: the cache's device over NCCL, the host over gloo.
        self.exchange_device = cache.device if self.backend == "nccl" else torch.device("cpu")
        self.timeout_s = timeout.total_seconds()
        # Each rank's last lookup, so a failed exchange can name the rank it waited for.
        self.progress = ProgressBoard.for_default_group("exchange")
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        self.stats = ExchangeStats()
        self.last_served: np.ndarray | None = None  # ids served as owner in the last iteration (for tests)
        self._window = None          # the caller's window these owner windows mirror
        self.owner_window: WindowBuffer | None = None
        self._ahead = 0              # future batches already forwarded and not yet current
        self._lock = threading.Lock()

    # -- collectives ---------------------------------------------------------------------------------------------

    def _all_to_all(self, send: torch.Tensor, send_counts: list[int], recv_counts: list[int], what: str
                    ) -> torch.Tensor:
        recv = torch.empty((sum(recv_counts), *send.shape[1:]), dtype=send.dtype, device=self.exchange_device)
        try:
            dist.all_to_all_single(recv, send.to(self.exchange_device).contiguous(), recv_counts, send_counts,
                                   group=self.group)
        except Exception as exc:  # gloo raises RuntimeError / DistBackendError with a terse message
            raise ExchangeError(
                f"rank {self.rank}: exchanging {what} at iteration {self.stats.iterations} failed after at most "
                f"{self.timeout_s:g} s ({TIMEOUT_ENV}): {self.progress.laggards()}; check its log. "
                f"({self.backend}: {first_line(exc)})") from None
        return recv

    def _exchange(self, send: torch.Tensor, send_counts: np.ndarray, what: str) -> tuple[torch.Tensor, list[int]]:
        counts = torch.as_tensor(send_counts, dtype=torch.int64)
        recv_counts = self._all_to_all(counts, [1] * self.world_size, [1] * self.world_size, f"{what} counts")
        recv_counts = recv_counts.tolist()
        return self._all_to_all(send, counts.tolist(), recv_counts, what), recv_counts

    def _by_owner(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(order that groups ids by owner, count per owner)."""
        owners = self.owner(ids)
        return np.argsort(owners, kind="stable"), np.bincount(owners, minlength=self.world_size)

    # -- the shared window -----------------------------------------------------------------------------------

    def _forward_future(self, future) -> None:
        """Mirrors newly sampled future batches into the owners' windows."""
        if future is not self._window:  # a new epoch (or evaluation) brought a new window
            self._window, self._ahead = future, 0
            self.owner_window = None  # freed before its successor is built: one index per node count, not two
            if future is not None:
                self.owner_window = WindowBuffer(future.size, self.storage.num_rows)
        if future is None:
            return
        if self._ahead:
            self.owner_window.pop()  # the current iteration's batch has left the future
            self._ahead -= 1
        new = [np.unique(as_id_tensor(future[j]).numpy()) for j in range(self._ahead, len(future))]
        if not new:
            return
        ids = np.concatenate(new)
        offset = np.repeat(np.arange(len(new), dtype=np.int64), [b.size for b in new])
        order, counts = self._by_owner(ids)
        pairs = torch.from_numpy(np.stack([ids[order], offset[order]], axis=1))
        received, _ = self._exchange(pairs, counts, "future batches")
        received = received.cpu().numpy()
        for j in range(len(new)):
            self.owner_window.push(np.unique(received[received[:, 1] == j, 0]))
        self._ahead += len(new)

    # -- one iteration ---------------------------------------------------------------------------------------

    def lookup(self, ids, future=None, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of ``ids`` in request order and their hit mask, served by their owners."""
        with self._lock:
            start = time.perf_counter()
            serve = 0.0
            self.progress.mark(self.stats.iterations)
            ids = as_id_tensor(ids)
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.storage.num_rows):
                bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
                raise IndexError(f"node id {bad} is out of range [0, {self.storage.num_rows})")
            self._forward_future(future)
            unique, inverse = unique_ids(ids)
            order, counts = self._by_owner(unique.numpy())
            order = torch.from_numpy(order)
            requested, recv_counts = self._exchange(unique[order], counts, "ids")
            # Serve every rank's requests in one lookup: shared ids are looked up and read once.
            t = time.perf_counter()
            served, back = unique_ids(requested)
            rows, hit = self.cache.lookup(served, future=self.owner_window)
            on = self.exchange_device  # over NCCL the cache's own device: no copy
            rows, hit = rows.to(on), hit.to(on)
            payload = torch.cat([rows.contiguous().view(torch.uint8).reshape(served.numel(), self.row_bytes),
                                 hit.to(torch.uint8).reshape(-1, 1)], dim=1)[back.to(on)]
            serve = time.perf_counter() - t
            answer = self._all_to_all(payload, recv_counts, counts.tolist(), "rows")
            by_unique = torch.empty_like(answer)
            by_unique[order.to(on)] = answer
            dtype = self.cache.data.dtype
            gathered = by_unique[:, :self.row_bytes].contiguous().view(dtype).reshape(unique.numel(), -1)
            index = inverse.to(on)
            if out is None:
                result = gathered[index]
            else:
                result = torch.index_select(gathered, 0, index, out=out)
            hit_mask = by_unique[:, self.row_bytes].bool()[index]
            s = self.stats
            elapsed = time.perf_counter() - start
            s.iterations += 1
            s.requested += unique.numel()
            s.served += served.numel()
            s.remote_requested += int(unique.numel() - counts[self.rank])
            s.serve_seconds += serve
            s.last_exchange_seconds = elapsed - serve
            s.exchange_seconds += elapsed - serve
            self.last_served = served.cpu().numpy()
            return result, hit_mask

    # -- the Features interface (lsm_gnn.features): a shared cache wraps this rank's slice ----------------------

    caches = True

    def gather(self, ids, *, future=None, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`lookup` (collective: every rank gathers its batch at the same time)."""
        return self.lookup(ids, future=future, out=out)

    def counters(self) -> dict[str, int]:
        """This rank's slice: the bytes it read from storage and, with PVP, what its victim buffer served
        (for every rank)."""
        return self.cache.counters()

    def prefetch(self) -> None:
        self.cache.prefetch()

    def settle(self) -> None:
        self.cache.settle()

    def describe(self) -> str:
        return (f"{self.cache.describe()}, one slice of a cache shared by {self.world_size} ranks "
                f"({self.owner.name} ownership)")

    @property
    def last_timings(self) -> dict:
        """Seconds of the last lookup spent exchanging with other ranks (the loader reports it as a stage)."""
        return {"exchange": self.stats.last_exchange_seconds}
