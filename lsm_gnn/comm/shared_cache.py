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
   replies. Between ranks on one host the rows skip the collective: that
   buffer is in shared memory, each requester copies its rows from the
   owner's, and the collective carries where they are
   (:mod:`lsm_gnn.comm.shm`; ``exchange`` chooses);
5. copies the rows once, from that buffer into the batch's request order.

The loader tells each lookup what the next one will be (``following``:
the next batch's ids and the batch that enters the window before it,
which it samples one batch further ahead). The next request's collective
then starts before this lookup serves and runs while it is served and
answered, so the next lookup usually finds its requests there and starts
serving: two lookups' exchanges are in flight at once, and only the rows
collective is on each lookup's path. The collectives stay two a lookup.

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
from lsm_gnn.comm.collectives import Collectives, ExchangeError, ExchangeStats, exchange_backend
from lsm_gnn.comm.group import ProgressBoard, collective_timeout
from lsm_gnn.comm.padded import PaddedAllToAll, Pending
from lsm_gnn.comm.shm import HEADER, SharedRows, exchange_choice, negotiate
from lsm_gnn.features import StorageShape
from lsm_gnn.utils.hostmem import HostBufferPool, host_zeros
from lsm_gnn.utils.ids import as_id_tensor, unique_ids


@dataclass
class _Announced:
    """The next lookup's request, sent during the lookup before (``following`` of :meth:`SharedCache.lookup`)."""
    unique: np.ndarray          # the distinct ids it asks for
    new: list[np.ndarray]       # the distinct ids of each batch that enters the window before it
    order: np.ndarray           # what _pack_request gave for them
    counts: np.ndarray
    pending: Pending            # its collective, in flight


class SharedCache(StorageShape):
    """Makes ``cache`` (this rank's slice) part of one cache across the ranks of ``group``.

    ``owner`` maps ids to owning ranks (see :mod:`lsm_gnn.comm.ownership`).
    ``group`` defaults to a new group over all ranks whose timeout is
    ``timeout_s``, by default ``LSM_GNN_TIMEOUT_S`` (300 s): NCCL when the
    cache is on a GPU and torch has NCCL, else gloo (``backend`` chooses).
    Over NCCL the rows never leave the device: the exchange sends the cache's
    device tensors as they are. Over gloo they cross in host memory (staged
    there if the cache is on a GPU). The same code serves both.

    ``exchange`` says how the rows travel over gloo: ``auto`` (None: ``LSM_GNN_EXCHANGE``, else auto) through
    shared memory when every rank sees the same ``/dev/shm``, else in the rows collective; ``shm`` insists on
    shared memory (ValueError where there is none), ``collective`` never uses it. :attr:`exchange` says which.
    """

    def __init__(self, cache: SoftwareCache, owner, group=None, timeout_s: float | None = None,
                 backend: str | None = None, exchange: str | None = None):
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
        # The rows are unpacked on the host (in place, per owner) or on the device (one gather after the wait);
        # tests/test_nccl_rule.py takes the device path on CPU tensors.
        self.unpack_on_host = self.exchange_device.type == "cpu"
        self.timeout_s = timeout.total_seconds()
        # Each rank's last lookup, so a failed exchange can name the rank it waited for.
        self.progress = ProgressBoard.for_default_group("exchange")
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        self.stats = ExchangeStats()
        self.net = Collectives(group, self.exchange_device, self.timeout_s, self.stats, self.progress)
        tokens = negotiate(group, self.backend, exchange_choice(exchange))
        self._shm = None if tokens is None else SharedRows(self.rank, self.world_size, self.row_bytes, tokens)
        self.exchange = "collective" if self._shm is None else "shm"
        self.last_served: np.ndarray | None = None  # ids served as owner in the last iteration (for tests)
        self._window = None          # the caller's window these owner windows mirror
        self.owner_window: WindowBuffer | None = None
        self._ahead = 0              # future batches already forwarded and not yet current
        self._lock = threading.Lock()
        # Each kind of message agrees on its own chunk size: requests and updates differ in length.
        self._buffers: dict[str, torch.Tensor] = {}  # see _scratch
        self._results = HostBufferPool()  # the rows returned, over memory reused once the caller drops them
        self._announced: _Announced | None = None  # the next lookup's request, sent ahead (``following``)
        self._requests = PaddedAllToAll(self.rank, self.world_size, "ids and future")
        self._updates = PaddedAllToAll(self.rank, self.world_size, "update ids")

    # -- collectives (lsm_gnn.comm.collectives) ------------------------------------------------------------------

    def _exchange(self, padded: PaddedAllToAll, messages, start: float) -> list[np.ndarray]:
        """``padded.exchange(messages)`` (or, given an announced request, ``padded.finish`` of its pending
        call), its time outside the collectives (padding the messages into chunks and reading them out)
        counted, with the time since ``start``, as "pack"."""
        s = self.stats
        waited = sum(s.collective_seconds.values())
        if isinstance(messages, _Announced):
            received = padded.finish(messages.pending)
        else:
            received = padded.exchange(messages, self.net.post)
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

    def _pack_request(self, unique: np.ndarray, new: list[np.ndarray]):
        """(the order grouping ``unique`` by owner, ids asked of each owner, one int64 message per owner
        ``[ids asked, new batches, size of each new batch's share | ids | the batches' ids]``)."""
        world = self.world_size
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
        return order, counts, messages

    def _read_request(self, received: list[np.ndarray], new: int):
        """(the ids each rank asks of this one (one array per rank), each rank's share of the ``new`` new
        future batches (``[rank][batch]``)) from the messages of :meth:`_pack_request`."""
        batches = [int(part[1]) for part in received]
        if any(m != new for m in batches):
            raise ExchangeError(f"rank {self.rank}: ranks forward {batches} new future batches at iteration "
                                f"{self.stats.iterations}, this one {new}: every rank must gather with windows "
                                "of the same length")
        asked, shares = [], []
        for part in received:
            n_ids = int(part[0])
            asked.append(part[2 + new:2 + new + n_ids])
            shares.append(np.split(part[2 + new + n_ids:], np.cumsum(part[2:2 + new])[:-1]) if new else [])
        return asked, shares

    def _request(self, unique: np.ndarray, new: list[np.ndarray]):
        """Sends every owner the ids this rank asks it for and its share of the new future batches, in one
        collective (two when a message outgrows the agreed chunk). Returns (the order grouping ``unique``
        by owner, ids asked of each owner, and what :meth:`_read_request` reads)."""
        start = time.perf_counter()
        order, counts, messages = self._pack_request(unique, new)
        received = self._exchange(self._requests, messages, start)
        return (order, counts, *self._read_request(received, len(new)))

    def _send_ahead(self, following) -> None:
        """Starts the request of the next lookup, ``following = (ids, new)`` (see :meth:`lookup`)."""
        start = time.perf_counter()
        ids, new = following
        unique = unique_ids(self._checked(ids))[0].numpy()
        new = [unique_ids(as_id_tensor(batch))[0].numpy() for batch in new]
        order, counts, messages = self._pack_request(unique, new)
        self.stats.add("pack", start)
        self._announced = _Announced(unique, new, order, counts, self._requests.start(messages, self.net.post))
        self.stats.announced += 1

    def _check_out(self, num_ids: int, out: torch.Tensor | None) -> None:
        """ValueError unless ``out`` is None or can take ``num_ids`` rows in request order as they are."""
        on, dtype = self.exchange_device, self.cache.data.dtype
        if out is not None and (not out.is_contiguous() or tuple(out.shape) != (num_ids, self.storage.dim)
                                or out.dtype != dtype or out.device != on):
            raise ValueError(f"out must be a contiguous {dtype} tensor of shape ({num_ids}, {self.storage.dim}) "
                             f"on {on}, got {out.dtype} {tuple(out.shape)} on {out.device}")

    def _checked(self, ids) -> torch.Tensor:
        """``ids`` as an int64 tensor; IndexError naming one outside the storage's rows."""
        ids = as_id_tensor(ids)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.storage.num_rows):
            bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
            raise IndexError(f"node id {bad} is out of range [0, {self.storage.num_rows})")
        return ids

    def _take_announced(self, unique: np.ndarray, new: list[np.ndarray]):
        """What :meth:`_request` returns, for the request the lookup before sent (``following``); ValueError
        unless this lookup is the one announced."""
        announced = self._announced
        if not np.array_equal(unique, announced.unique):
            differs = f"{unique.size} distinct ids, not the {announced.unique.size} announced"
        elif len(new) != len(announced.new) or not all(np.array_equal(a, b) for a, b in zip(new, announced.new)):
            differs = f"a window with {len(new)} new batches, not the {len(announced.new)} announced"
        else:
            self._announced = None
            received = self._exchange(self._requests, announced, time.perf_counter())
            return (announced.order, announced.counts, *self._read_request(received, len(new)))
        raise ValueError(f"rank {self.rank}: lookup {self.stats.iterations} came with {differs} (or other ones); "
                         "the other ranks serve what was announced (settle() drops the announcement)")

    # -- one iteration ---------------------------------------------------------------------------------------

    def lookup(self, ids, future=None, out: torch.Tensor | None = None, following=None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows of ``ids`` in request order and their hit mask, served by their owners.

        Two collectives per call, whatever the window: the ids with the window's new batches (their counts
        inside), and the rows with their hit flags (whose sizes each side knows from the ids). A third
        carries what outgrew the agreed chunk of the first (:mod:`lsm_gnn.comm.padded`).

        ``following = (ids, new)`` says what the next lookup will be: of those ids (any order, any
        repeats), once the batches ``new`` (ids each, in order) have entered its window. Its request then
        starts before this lookup serves, and travels while this one is served and answered: two lookups'
        exchanges are in flight, and the next lookup waits for its request only if it has not arrived.
        Every rank must pass ``following`` alike (the loader does). The next lookup must be the one
        announced, else it raises ValueError (the other ranks have its request already); :meth:`settle`
        drops an announced request that no lookup will take."""
        with self._lock:
            try:
                return self._lookup(ids, future, out, following)
            except ExchangeError:
                if self._shm is not None:  # the group is broken: no rank will map a segment again
                    self._shm.abandon()
                raise

    def _lookup(self, ids, future, out, following) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`lookup`, under its lock."""
        start = time.perf_counter()
        self.progress.mark(self.stats.iterations)
        t = self.stats.add("progress mark", start)
        ids = self._checked(ids)
        self._check_out(ids.numel(), out)  # before any collective: a bad out must not leave one half made
        s = self.stats
        t = s.add("pack", t)
        new = self._new_future(future)
        filling = "window, filled" if len(new) > 1 else "window"  # a new window's whole future: once an epoch
        t = s.add(filling, t)
        unique, inverse = unique_ids(ids)
        if self._announced is not None:  # sent during the lookup before: usually here by now
            order, counts, asked, shares = self._take_announced(unique.numpy(), new)
        else:
            order, counts, asked, shares = self._request(unique.numpy(), new)
        if following is not None:
            self._send_ahead(following)
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
        arrive = self._reply(rows, hit, back, sizes, counts, whole)
        own = sum(sizes[:self.rank])
        result, hit_mask = self._unpack(whole, back[own:own + sizes[self.rank]], hit, arrive, counts, order,
                                        inverse, out)
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
        (grown by a quarter more when too small; on huge pages in host memory). Fresh memory costs a page
        fault per 4 KiB page on first touch, more than the copy into it (44 ms for a 35 MB batch on the
        2-core test machine, 4 ms into a reused buffer). Nothing returned to a caller points into it."""
        buffer = self._buffers.pop(name, None)
        if buffer is None or buffer.shape[0] < rows:
            del buffer  # freed before its successor is made
            shape = (rows + rows // 4, self.row_bytes)
            on = self.exchange_device
            buffer = host_zeros(shape, torch.uint8) if self.unpack_on_host else torch.empty(
                shape, dtype=torch.uint8, device=on)
        self._buffers[name] = buffer
        return buffer[:rows]

    def _flag_rows(self, n: int) -> int:
        """Rows of ``row_bytes`` that carry ``n`` one-byte hit flags after the rows themselves."""
        return -(-n // self.row_bytes)

    def _serve(self, served: torch.Tensor, counts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(one byte buffer, this slice's rows of ``served`` at its front, their hit mask): the cache writes the
        rows there and, over the rows collective, the other owners' replies land after them, so the batch is
        copied once into request order and this rank's own rows never enter a message. Through shared memory
        the buffer is this rank's segment, which the other ranks read, and holds this slice's rows only."""
        on = self.exchange_device
        if self._shm is None:
            remote = sum(int(n) + self._flag_rows(int(n)) for d, n in enumerate(counts) if d != self.rank)
            whole = self._scratch("whole", served.numel() + remote)
        else:
            whole = self._shm.buffer(self.stats.iterations, served.numel()).rows[:served.numel()]
        rows = whole[:served.numel()].view(self.cache.data.dtype)
        if self.cache.device == on:
            _, hit = self.cache.lookup(served, future=self.owner_window, out=rows)
        else:  # a GPU cache exchanging over gloo: its rows are staged in host memory
            found, hit = self.cache.lookup(served, future=self.owner_window)
            rows.copy_(found)
        return whole, rows, hit.to(on)

    def _reply(self, rows: torch.Tensor, hit: torch.Tensor, back: torch.Tensor, asked: list[int],
               counts: np.ndarray, whole: torch.Tensor):
        """Starts giving each other rank the rows it asked for; returns ``arrive()``, which waits for this
        rank's replies and gives, for each other owner ``d``, where this rank's rows from it are: ``(buffer
        [*, row_bytes], row of each id asked of d in it, hit flags)``. The rows collective puts them at the
        back of ``whole``; through shared memory they stay in the owner's segment, copied once, straight into
        request order. Until ``arrive()``, this rank may read only the front of ``whole`` (its own rows)."""
        if self._shm is None:
            return self._send_rows(rows, hit, back, asked, counts, whole)
        return self._share_rows(rows.shape[0], hit, back, asked, counts)

    def _send_rows(self, rows: torch.Tensor, hit: torch.Tensor, back: torch.Tensor, asked: list[int],
                   counts: np.ndarray, whole: torch.Tensor):
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
        posted = self.net.post(send, send_sizes, recv_sizes, "rows", recv=whole[rows.shape[0]:])

        def arrive():
            posted.wait()
            remote, position = {}, rows.shape[0]
            for d, n in enumerate(counts.tolist()):
                if d != self.rank:
                    flags = whole[position + n:position + n + self._flag_rows(n)].view(-1)[:n]
                    remote[d] = (whole, torch.arange(position, position + n, device=whole.device), flags.bool())
                    position += n + self._flag_rows(n)
            return remote

        return arrive

    def _share_rows(self, num_served: int, hit: torch.Tensor, back: torch.Tensor, asked: list[int],
                    counts: np.ndarray):
        """:meth:`_send_rows` through shared memory: this rank's rows are in its segment already (``whole``'s
        front), its hit flags go beside them, and the rows collective tells each other rank which segment
        and which of its rows hold the ids it asked for (int64: ``HEADER`` words, then a row per id). The
        rows stay there until the unpack copies them into request order; their flags are read now."""
        start = time.perf_counter()
        shm, lookup = self._shm, self.stats.iterations
        shm.buffer(lookup, 0).flags[:num_served].copy_(hit)  # the segment _serve wrote the rows into
        header = torch.tensor(shm.header(lookup), dtype=torch.int64)
        back = back.cpu()
        send_sizes = [0 if d == self.rank else HEADER + n for d, n in enumerate(asked)]
        starts = np.cumsum([0, *asked])
        send = torch.cat([part for d in range(self.world_size) if d != self.rank
                          for part in (header, back[starts[d]:starts[d + 1]])])
        recv_sizes = [0 if d == self.rank else HEADER + int(n) for d, n in enumerate(counts)]
        self.stats.add("pack", start)
        posted = self.net.post(send, send_sizes, recv_sizes, "rows")

        def arrive():
            got = posted.wait()
            start = time.perf_counter()
            shm.unlink_mapped(lookup)  # every rank has finished the lookup before: it mapped what was new then
            remote, first = {}, 0
            for d, size in enumerate(recv_sizes):
                if d == self.rank:
                    continue
                message = got[first:first + size]
                segment, where = shm.peer(d, message[:HEADER]), message[HEADER:]
                remote[d] = (segment.rows, where, segment.flags[where].bool())
                first += size
            self.stats.add("flags from owners", start)
            return remote

        return arrive

    def _unpack(self, whole: torch.Tensor, own_back: torch.Tensor, own_hit: torch.Tensor, arrive,
                counts: np.ndarray, order: np.ndarray, inverse: torch.Tensor, out: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows in request order, each copied once from where it is, and their hit mask. In host memory this
        rank's own rows (the front of ``whole``) go first, while the other owners' replies are on their way;
        then ``arrive()`` (:meth:`_reply`) says where those are. On a device, one gather once all arrived."""
        start = time.perf_counter()
        on, dtype = self.exchange_device, self.cache.data.dtype
        owner = np.empty(order.size, dtype=np.int64)  # the owner of each distinct id
        row = torch.empty(order.size, dtype=torch.int64)  # its row in that owner's buffer
        hit = torch.empty(order.size, dtype=torch.bool, device=on)
        ranges = np.cumsum([0, *counts.tolist()])
        for d in range(self.world_size):
            owner[order[ranges[d]:ranges[d + 1]]] = d
        mine = torch.from_numpy(order[ranges[self.rank]:ranges[self.rank + 1]])
        row[mine] = own_back.cpu()
        hit[mine.to(on)] = own_hit[own_back.to(on)]
        rows = whole.view(dtype)  # [rows, dim]: each row is row_bytes of that dtype
        if self.unpack_on_host:
            from lsm_gnn import _C

            if out is None:  # memory an earlier batch touched, once nothing uses it
                out = self._results.empty((inverse.numel(), *rows.shape[1:]), dtype)
            target = out.view(torch.uint8).view(-1, self.row_bytes)
            by_owner = torch.from_numpy(owner)[inverse]

            def copy(d: int, buffer: torch.Tensor, where: torch.Tensor) -> None:
                positions = torch.nonzero(by_owner == d).reshape(-1)
                _C.copy_rows(target, positions, buffer, where[positions])

            copy(self.rank, whole, row[inverse])
        self.stats.add("unpack", start)
        remote = arrive()
        t = time.perf_counter()  # (the wait counts as the rows collective's)
        for d, (_, index, flags) in remote.items():
            sent = torch.from_numpy(order[ranges[d]:ranges[d + 1]])
            row[sent] = index.cpu()
            hit[sent.to(on)] = flags.to(on)
        if self.unpack_on_host:
            where = row[inverse]
            for d, (buffer, _, _) in remote.items():
                copy(d, buffer, where)
        else:  # every row is in whole: one gather on the device
            index = row.to(on)[inverse.to(on)]
            out = rows[index] if out is None else torch.index_select(rows, 0, index, out=out)
        self.stats.add("unpack", t)
        return out, hit[inverse.to(on)]

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
            asked = self._updates.exchange(np.split(grouped, np.cumsum(counts)[:-1]), self.net.post)
            sends, receives = counts.tolist(), [a.size for a in asked]
            asked = torch.from_numpy(np.concatenate(asked))
            rows = self.net.all_to_all(grads[order.to(grads.device)], sends, receives, "update rows")
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

    def gather(self, ids, *, future=None, out: torch.Tensor | None = None, following=None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`lookup` (collective: every rank gathers its batch at the same time)."""
        return self.lookup(ids, future=future, out=out, following=following)

    def counters(self) -> dict[str, int]:
        """This rank's slice: the bytes it read from storage and, with PVP, what its victim buffer served
        (for every rank)."""
        return self.cache.counters()

    def prefetch(self) -> None:
        self.cache.prefetch()

    def settle(self) -> None:
        """Joins the slice's background work, and drops an announced request no lookup will take (a loader
        that stopped): its collective ends, since every rank sent it, and no owner serves it."""
        with self._lock:
            announced, self._announced = self._announced, None
            if announced is not None:
                self._requests.finish(announced.pending)
        self.cache.settle()

    def close(self) -> None:
        """Unlinks this rank's shared-memory segments and drops its maps (the same happens when the cache is
        collected or the process exits). No lookup may follow."""
        if self._shm is not None:
            self._shm.close()

    def describe(self) -> str:
        rows = ", rows through shared memory" if self._shm is not None else ""
        return (f"{self.cache.describe()}, one slice of a cache shared by {self.world_size} ranks "
                f"({self.owner.name} ownership{rows})")

    @property
    def last_timings(self) -> dict:
        """Seconds of the last lookup spent exchanging with other ranks (the loader reports it as a stage)."""
        return {"exchange": self.stats.last_exchange_seconds}
