"""The communication layer: per-rank cache slices that behave as one cache.

Every rank holds a :class:`~lsm_gnn.cache.SoftwareCache` for the nodes it
owns. Each iteration, ``SharedCache.lookup(ids)`` on every rank makes two
``all_to_all_single`` calls, whatever the window:

1. deduplicates the batch's ids and buckets them by owner, and so the
   distinct ids of each batch newly sampled into the window;
2. sends, in one int64 message per owner, the ids it asks for and its
   share of the new window batches (the owners keep a window of what every
   rank will ask for; it drives their dynamic policies). The messages go
   in chunks of a size every rank knows without asking, their lengths
   inside them (:mod:`lsm_gnn.comm.padded`): no collective of counts
   first. A message longer than its chunk (a new window's whole future,
   once an epoch) costs one more collective, which every rank knows of
   from the chunks;
3. serves what it received from its own slice in one lookup (so an id that
   several ranks asked for is looked up, and read from storage, once);
4. sends the rows back as raw bytes of the features' dtype, each owner's
   hit flags (one byte per row) after its rows in the same message: the
   sizes need no exchange, since a rank gets one row per id it asked. A
   rank's own ids and rows never enter a message: its cache writes its
   rows into the front of the buffer that receives the other owners'
   replies;
5. copies the rows once, from that buffer into the batch's request order.

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
from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from lsm_gnn.cache import SoftwareCache, WindowBuffer
from lsm_gnn.comm.group import TIMEOUT_ENV, ProgressBoard, collective_timeout, first_line
from lsm_gnn.comm.padded import PaddedAllToAll
from lsm_gnn.features import StorageShape
from lsm_gnn.hostmem import HostBufferPool, host_zeros
from lsm_gnn.ids import as_id_tensor, unique_ids


class ExchangeError(RuntimeError):
    """A collective of the exchange failed: another rank died, hung or disagrees on the schedule."""


@dataclass
class ExchangeStats:
    iterations: int = 0
    requested: int = 0        # distinct ids this rank asked for, summed over iterations
    served: int = 0           # distinct ids this rank served as owner, summed over iterations
    remote_requested: int = 0  # of the requested ids, those owned by another rank
    exchange_seconds: float = 0.0  # in the exchange: its collectives and packing the messages
    serve_seconds: float = 0.0     # the local lookup for all ranks' requests
    last_exchange_seconds: float = 0.0
    collectives: int = 0           # all_to_all_single calls made (2 per lookup, 3 when a request spills)
    #: seconds in each kind of collective: "ids and future" (with the counts inside; mostly waiting for the
    #: slowest rank to arrive), "ids and future, spill" (the words past a chunk), "rows", and the "update ..."
    #: kinds of :meth:`SharedCache.update`
    collective_seconds: dict = field(default_factory=dict)
    collective_calls: dict = field(default_factory=dict)  # calls of each kind
    #: seconds of the exchange's local work: "window" (the owners' windows; "window, filled" when a new
    #: window's whole future is forwarded, once an epoch), "pack" (ids and rows into messages), "unpack"
    #: (rows into request order)
    local_seconds: dict = field(default_factory=dict)

    def add(self, what: str, start: float) -> float:
        """Adds the seconds since ``start`` to ``local_seconds[what]``; returns now."""
        now = time.perf_counter()
        self.local_seconds[what] = self.local_seconds.get(what, 0.0) + now - start
        return now

    def as_dict(self) -> dict:
        return {k: dict(v) if isinstance(v, dict) else v for k, v in vars(self).items()}


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
        # Each kind of message agrees on its own chunk size: requests and updates differ in length.
        self._buffers: dict[str, torch.Tensor] = {}  # see _scratch
        self._results = HostBufferPool()  # the rows returned, over memory reused once the caller drops them
        self._requests = PaddedAllToAll(self.rank, self.world_size, "ids and future")
        self._updates = PaddedAllToAll(self.rank, self.world_size, "update ids")

    # -- collectives ---------------------------------------------------------------------------------------------

    def _all_to_all(self, send: torch.Tensor, send_counts: list[int], recv_counts: list[int], what: str,
                    recv: torch.Tensor | None = None) -> torch.Tensor:
        if recv is None:
            recv = torch.empty((sum(recv_counts), *send.shape[1:]), dtype=send.dtype, device=self.exchange_device)
        t = time.perf_counter()
        try:
            dist.all_to_all_single(recv, send.to(self.exchange_device).contiguous(), recv_counts, send_counts,
                                   group=self.group)
        except Exception as exc:  # gloo raises RuntimeError / DistBackendError with a terse message
            raise ExchangeError(
                f"rank {self.rank}: exchanging {what} at iteration {self.stats.iterations} failed after at most "
                f"{self.timeout_s:g} s ({TIMEOUT_ENV}): {self.progress.laggards()}; check its log. "
                f"({self.backend}: {first_line(exc)})") from None
        s = self.stats
        s.collectives += 1
        s.collective_seconds[what] = s.collective_seconds.get(what, 0.0) + time.perf_counter() - t
        s.collective_calls[what] = s.collective_calls.get(what, 0) + 1
        return recv

    def _exchange(self, padded: PaddedAllToAll, messages: list[np.ndarray], start: float) -> list[np.ndarray]:
        """``padded.exchange(messages)``, its time outside the collectives (padding the messages into chunks
        and reading them out) counted, with the time since ``start``, as "pack"."""
        s = self.stats
        waited = sum(s.collective_seconds.values())
        received = padded.exchange(messages, self._all_to_all)
        s.add("pack", start + sum(s.collective_seconds.values()) - waited)
        return received

    def _by_owner(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(order that groups ids by owner, count per owner)."""
        owners = self.owner(ids)
        return np.argsort(owners, kind="stable"), np.bincount(owners, minlength=self.world_size)

    # -- the shared window -----------------------------------------------------------------------------------

    def _new_future(self, future) -> list[np.ndarray]:
        """The distinct ids of each batch newly sampled into ``future`` since the last lookup (a new window,
        for a new epoch or an evaluation, starts the owners' windows afresh)."""
        if future is not self._window:
            self._window, self._ahead = future, 0
            self.owner_window = None  # freed before its successor is built: one index per node count, not two
            if future is not None:
                self.owner_window = WindowBuffer(future.size, self.storage.num_rows)
        if future is None:
            return []
        if self._ahead:
            self.owner_window.pop()  # the current iteration's batch has left the future
            self._ahead -= 1
        new = [unique_ids(as_id_tensor(future[j]))[0].numpy() for j in range(self._ahead, len(future))]
        self._ahead += len(new)
        return new

    def _request(self, unique: np.ndarray, new: list[np.ndarray]):
        """Sends every owner the ids this rank asks it for and its share of the new future batches.

        One int64 message per owner ``[ids asked, new batches, size of each new batch's share | ids | the
        batches' ids]``, in one collective (two when a message outgrows the agreed chunk).
        Returns (the order grouping ``unique`` by owner, ids asked of each owner, the ids each rank asks of
        this one (one array per rank), and each rank's share of the new batches (``[rank][batch]``)).
        """
        start, world = time.perf_counter(), self.world_size
        order, counts = self._by_owner(unique)
        future_ids = np.concatenate(new) if new else np.empty(0, dtype=np.int64)
        batch_of = np.repeat(np.arange(len(new), dtype=np.int64), [b.size for b in new])
        future_owner = self.owner(future_ids)
        # (owner, batch) groups in order; the stable sort (a radix sort) keeps each batch's ids sorted
        f_order = np.argsort(future_owner * len(new) + batch_of, kind="stable")
        f_counts = np.bincount(future_owner * len(new) + batch_of, minlength=world * len(new)).reshape(
            world, len(new)).astype(np.int64)
        messages = [np.concatenate([[n, len(new)], c, s, f]) for n, c, s, f in zip(
            counts, f_counts, np.split(unique[order], np.cumsum(counts)[:-1]),
            np.split(future_ids[f_order], np.cumsum(f_counts.sum(axis=1))[:-1]))]
        received = self._exchange(self._requests, messages, start)
        batches = [int(part[1]) for part in received]
        if any(m != len(new) for m in batches):
            raise ExchangeError(f"rank {self.rank}: ranks forward {batches} new future batches at iteration "
                                f"{self.stats.iterations}, this one {len(new)}: every rank must gather with windows "
                                "of the same length")
        asked, shares, m = [], [], len(new)
        for part in received:
            n_ids = int(part[0])
            asked.append(part[2 + m:2 + m + n_ids])
            shares.append(np.split(part[2 + m + n_ids:], np.cumsum(part[2:2 + m])[:-1]) if m else [])
        return order, counts, asked, shares

    # -- one iteration ---------------------------------------------------------------------------------------

    def lookup(self, ids, future=None, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of ``ids`` in request order and their hit mask, served by their owners.

        Two collectives per call, whatever the window: the ids with the window's new batches (their counts
        inside), and the rows with their hit flags (whose sizes each side knows from the ids). A third
        carries what outgrew the agreed chunk of the first (:mod:`lsm_gnn.comm.padded`)."""
        with self._lock:
            start = time.perf_counter()
            self.progress.mark(self.stats.iterations)
            t = self.stats.add("progress mark", start)
            ids = as_id_tensor(ids)
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.storage.num_rows):
                bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
                raise IndexError(f"node id {bad} is out of range [0, {self.storage.num_rows})")
            s = self.stats
            t = s.add("pack", t)
            new = self._new_future(future)
            filling = "window, filled" if len(new) > 1 else "window"  # a new window's whole future: once an epoch
            t = s.add(filling, t)
            unique, inverse = unique_ids(ids)
            order, counts, asked, shares = self._request(unique.numpy(), new)
            t = time.perf_counter()
            for j in range(len(new)):  # each owner's window holds the union of every rank's future
                union, _ = unique_ids(torch.from_numpy(np.concatenate([share[j] for share in shares])))
                self.owner_window.push(union)
            t = s.add(filling, t)
            # Serve every rank's requests in one lookup: shared ids are looked up and read once.
            served, back = unique_ids(torch.from_numpy(np.concatenate(asked)))
            sizes = [a.size for a in asked]
            whole, rows, hit = self._serve(served, counts)
            serve = time.perf_counter() - t
            self._reply(rows, hit, back, sizes, counts, whole)
            t = time.perf_counter()
            own = sum(sizes[:self.rank])
            result, hit_mask = self._unpack(whole, served.numel(), back[own:own + sizes[self.rank]], hit,
                                            counts, order, inverse, out)
            s.add("unpack", t)
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

    def _scratch(self, name: str, rows: int) -> torch.Tensor:
        """``rows`` rows of ``row_bytes`` bytes on the exchange's device, from a buffer kept between lookups
        (grown by a quarter more when too small; on huge pages in host memory). Fresh memory costs a page fault per 4 KiB page on first
        touch, more than the copy into it (44 ms for a 35 MB batch on the 2-core test machine, 4 ms into a
        reused buffer). Nothing returned to a caller points into it."""
        buffer = self._buffers.pop(name, None)
        if buffer is None or buffer.shape[0] < rows:
            del buffer  # freed before its successor is made
            shape = (rows + rows // 4, self.row_bytes)
            on = self.exchange_device
            buffer = host_zeros(shape, torch.uint8) if on.type == "cpu" else torch.empty(shape, dtype=torch.uint8,
                                                                                          device=on)
        self._buffers[name] = buffer
        return buffer[:rows]

    def _flag_rows(self, n: int) -> int:
        """Rows of ``row_bytes`` that carry ``n`` one-byte hit flags after the rows themselves."""
        return -(-n // self.row_bytes)

    def _serve(self, served: torch.Tensor, counts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(one byte buffer, this slice's rows of ``served`` at its front, their hit mask): the cache writes the
        rows there and the other owners' replies land after them, so the batch is copied once, from that
        buffer into request order, and this rank's own rows never enter a message."""
        on = self.exchange_device
        remote = sum(int(n) + self._flag_rows(int(n)) for d, n in enumerate(counts) if d != self.rank)
        whole = self._scratch("whole", served.numel() + remote)
        rows = whole[:served.numel()].view(self.cache.data.dtype)
        if self.cache.device == on:
            _, hit = self.cache.lookup(served, future=self.owner_window, out=rows)
        else:  # a GPU cache exchanging over gloo: its rows are staged in host memory
            found, hit = self.cache.lookup(served, future=self.owner_window)
            rows.copy_(found)
        return whole, rows, hit.to(on)

    def _reply(self, rows: torch.Tensor, hit: torch.Tensor, back: torch.Tensor, asked: list[int],
               counts: np.ndarray, whole: torch.Tensor) -> None:
        """Sends each other rank its rows (as raw bytes of the features' dtype: never widened) then their hit
        flags (one byte each, padded to whole rows) in one collective, received into the back of ``whole``.
        Both sides know the sizes (a rank gets one row per id it asked), and a rank sends itself nothing."""
        start = time.perf_counter()
        rb = self.row_bytes
        data = rows.view(torch.uint8).reshape(-1, rb)
        flags = hit.to(torch.uint8)
        back = back.to(data.device)
        send_sizes = [0 if d == self.rank else n + self._flag_rows(n) for d, n in enumerate(asked)]
        send = self._scratch("send", sum(send_sizes))
        first = position = 0
        for n, size in zip(asked, send_sizes):
            if size:
                index = back[first:first + n]
                torch.index_select(data, 0, index, out=send[position:position + n])
                send[position + n:position + size].view(-1)[:n] = flags[index]
            first, position = first + n, position + size
        recv_sizes = [0 if d == self.rank else int(n) + self._flag_rows(int(n)) for d, n in enumerate(counts)]
        self.stats.add("pack", start)
        self._all_to_all(send, send_sizes, recv_sizes, "rows", recv=whole[rows.shape[0]:])

    def _unpack(self, whole: torch.Tensor, num_served: int, own_back: torch.Tensor, own_hit: torch.Tensor,
                counts: np.ndarray, order: np.ndarray, inverse: torch.Tensor, out: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows in request order, copied once from ``whole`` (this slice's rows, then the other owners'
        replies), and their hit mask."""
        on = self.exchange_device
        slot = np.empty(order.size, dtype=np.int64)  # each distinct id's row in ``whole``
        hit = torch.empty(order.size, dtype=torch.bool, device=on)
        first, position = 0, num_served
        for d, n in enumerate(counts.tolist()):
            mine = order[first:first + n]
            if d == self.rank:  # served here: the rows the cache wrote, in the order this rank asked them
                slot[mine] = own_back.numpy() if own_back.device.type == "cpu" else own_back.cpu().numpy()
                hit[torch.from_numpy(mine).to(on)] = own_hit[own_back.to(on)]
            else:
                slot[mine] = np.arange(position, position + n)
                flags = whole[position + n:position + n + self._flag_rows(n)].view(-1)[:n]
                hit[torch.from_numpy(mine).to(on)] = flags.bool()
                position += n + self._flag_rows(n)
            first += n
        rows = whole.view(self.cache.data.dtype)  # [rows, dim]: each row is row_bytes of that dtype
        index = torch.from_numpy(slot).to(on)[inverse.to(on)]
        if out is None and on.type == "cpu":  # memory an earlier batch touched, once nothing uses it
            out = self._results.empty((index.numel(), *rows.shape[1:]), rows.dtype)
        if out is None:
            result = rows[index]
        else:
            result = torch.index_select(rows, 0, index, out=out)
        return result, hit[inverse.to(on)]

    # -- writes: every row changes at its owner --------------------------------------------------------------

    @property
    def writable(self) -> bool:
        return self.cache.dirty is not None

    def update(self, ids, grads: torch.Tensor, apply) -> None:
        """Read-modify-write across ranks (collective): each rank sends the distinct ``ids`` it changes, with
        their ``grads`` rows, to their owners; an owner sums the rows every rank sent for one id and applies
        ``apply(rows, summed)`` to its slice once (:meth:`SoftwareCache.update`). So every row has one writer
        and every rank's next lookup sees the change. Two collectives: the ids (their counts inside, a third
        when they outgrow the agreed chunk), then the rows."""
        with self._lock:
            start = time.perf_counter()
            ids = as_id_tensor(ids)
            grads = grads.detach().cpu().contiguous() if self.exchange_device.type == "cpu" else grads.detach()
            order, counts = self._by_owner(ids.numpy())
            grouped = ids.numpy()[order]
            order = torch.from_numpy(order)
            asked = self._updates.exchange(np.split(grouped, np.cumsum(counts)[:-1]), self._all_to_all)
            sends, receives = counts.tolist(), [a.size for a in asked]
            asked = torch.from_numpy(np.concatenate(asked))
            rows = self._all_to_all(grads[order.to(grads.device)], sends, receives, "update rows")
            # Every rank's rows for one id summed in rank order: the same sum whoever computes it.
            unique, inverse = unique_ids(asked)
            summed = torch.zeros((unique.numel(), *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
            summed.index_add_(0, inverse.to(rows.device), rows)
            self.stats.add("update", start)
            self.cache.update(unique, summed, apply)

    def flush(self) -> None:
        """Writes this rank's dirty lines (its slice's rows) to the storage; every rank flushes its own."""
        self.cache.flush()

    # -- the Features interface (lsm_gnn.features): a shared cache wraps this rank's slice ----------------------

    caches = True

    @property
    def cache_lines(self) -> int:
        """This rank's slice's lines (``owner`` says which rows it holds)."""
        return self.cache.num_lines

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
