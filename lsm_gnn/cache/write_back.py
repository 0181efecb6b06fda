"""Write-back: a cache over a writable storage (an embedding table) changes rows in their lines and writes them
to the storage only when their line is evicted or the cache is flushed.

:func:`write_back_for` picks the part once, when the cache is built: :class:`WriteBack` over a writable storage,
else :class:`ReadOnly`, whose hooks do nothing. The cache's stages call the hooks (``check_intact`` at begin,
``evict`` before the victims leave, ``remember`` at account); :meth:`~lsm_gnn.cache.SoftwareCache.update` and
:meth:`~lsm_gnn.cache.SoftwareCache.flush` call :meth:`WriteBack.update` and :meth:`WriteBack.flush`. A dirty
line is written before its victim-buffer copy is made, so a parked line is always clean.
"""
from __future__ import annotations

import time

import torch

from lsm_gnn.cache.stats import CacheStats
from lsm_gnn.kernels.layout import INVALID_TAG

#: bytes of dirty lines :meth:`WriteBack.flush` hands the storage per write (bounds the copies it makes)
FLUSH_BYTES = 16 << 20


def _words(rows: torch.Tensor) -> torch.Tensor:
    """A contiguous 2-D tensor of bytes (an embedding table's rows) as int64 words where its rows allow,
    for index copies; any other tensor as it is."""
    if rows.dtype == torch.uint8 and rows.dim() == 2 and rows.shape[1] % 8 == 0 and rows.is_contiguous():
        return rows.view(torch.int64)
    return rows


class ReadOnly:
    """A cache over a storage nobody writes: nothing is dirty, each hook does nothing."""

    dirty: torch.Tensor | None = None

    def __init__(self):
        self.timings: dict[str, float] = {}

    def check_intact(self) -> None:
        """begin: refuses the call where an earlier write-back failed."""

    def evict(self, done, assigned: torch.Tensor) -> None:
        """evict: the dirty lines among a batch's victims (``done``, the assignment of ``assigned``) to storage."""

    def remember(self, plan) -> None:
        """account: keeps the rows of the batch's distinct ids that got no line (``plan``: a lookup's, or None
        for a batch that hit in full), for an update before the next lookup."""


class WriteBack(ReadOnly):
    """The dirty lines of a cache whose lines are ``data`` over the writable ``storage``; counts what it writes
    in ``stats`` and its seconds in ``timings["write-back"]``."""

    def __init__(self, storage, data: torch.Tensor, stats: CacheStats):
        self.storage, self.data, self.stats = storage, data, stats
        self.device = data.device
        self.dirty = torch.zeros(data.shape[0], dtype=torch.bool, device=self.device)  # changed since read/written
        self.timings = {"write-back": 0.0}
        self._failed: BaseException | None = None  # a write-back that failed: the dirty rows it held are gone
        # The last lookup's rows that got no line (bypassed), which an update before the next lookup needs.
        self._lineless: tuple[torch.Tensor, torch.Tensor] | None = None

    def check_intact(self) -> None:
        if self._failed is not None:
            raise RuntimeError(f"this cache lost dirty rows when writing them back failed ({self._failed}); "
                               "resume from the last checkpoint (its table is intact)") from self._failed

    def evict(self, done, assigned: torch.Tensor) -> None:
        self.timings["write-back"] = 0.0
        if not done.evictions:
            return
        tags, lines = done.evicted_tag, done.evicted_line
        # A line taken twice in one batch (a set given more ids than ways) also evicts a row installed by this
        # batch: only the line's earlier occupant, never one of the batch's misses, can hold changes.
        position = torch.searchsorted(assigned, tags).clamp_max(max(assigned.numel() - 1, 0))
        installed_now = (assigned[position] == tags) & ~done.hit[position] if assigned.numel() else False
        victim = (tags != INVALID_TAG) & ~installed_now
        victim[victim.clone()] = self.dirty[lines[victim]]
        if bool(victim.any()):
            self._write_lines(tags[victim], lines[victim])

    def remember(self, plan) -> None:
        lost = None if plan is None else torch.nonzero(plan.line < 0).reshape(-1)
        if lost is None or lost.numel() == 0:
            self._lineless = None
            return
        unique, inverse = plan.unique, plan.inverse
        position = torch.empty(unique.numel(), dtype=torch.int64, device=self.device)
        position.scatter_(0, inverse, torch.arange(inverse.numel(), device=self.device))
        self._lineless = (unique[lost], plan.rows[position[lost]])

    def update(self, ids: torch.Tensor, line: torch.Tensor, grads: torch.Tensor, apply) -> torch.Tensor | None:
        """Row ``i`` of distinct ``ids`` (in ``line[i]``, -1: uncached) becomes row ``i`` of ``apply(rows,
        grads)``: in its line, which becomes dirty, or in the storage where it has none. Returns the ids written
        to the storage (None: none)."""
        self.check_intact()
        cached = line >= 0
        held = torch.nonzero(cached).reshape(-1)
        apart = torch.nonzero(~cached).reshape(-1)
        lines = line[held]
        data = _words(self.data)  # rows of bytes moved as 8-byte words: several times faster
        if apart.numel() == 0:  # the usual case: every row is in its line
            rows = torch.index_select(data, 0, lines)
        else:
            rows = torch.empty((ids.numel(), data.shape[1]), dtype=data.dtype, device=self.device)
            rows.index_copy_(0, held, torch.index_select(data, 0, lines))
            rows.index_copy_(0, apart, _words(self._stored_rows(ids[apart.cpu()])))
        rows = rows.view(self.data.dtype)
        new = apply(rows, grads.to(self.device)).to(self.data.dtype)
        keep_before = self.storage.before_change
        if keep_before is not None:  # a clean line holds its row's stored bytes: a journal can keep them now
            clean = torch.nonzero(~self.dirty[lines]).reshape(-1)
            if clean.numel():
                first = held[clean]
                keep_before(ids[first.cpu()], rows[first].cpu())
        data.index_copy_(0, lines, _words(new.contiguous() if apart.numel() == 0 else new[held]))
        self.dirty[lines] = True
        self._lineless = None  # changed below, or not asked for: the next lookup keeps its own
        if apart.numel() == 0:
            return None
        changed = ids[apart.cpu()]
        self.storage.write(changed, new[apart].cpu())
        return changed

    def flush(self, tags: torch.Tensor) -> None:
        """Writes every dirty line (``tags``: the node each line holds) to the storage, in id order,
        :data:`FLUSH_BYTES` at a time: each write copies its rows, and a cache sized to fit a memory cap has
        no room for copies of all its lines at once."""
        self.check_intact()
        lines = torch.nonzero(self.dirty).reshape(-1)
        lines = lines[torch.argsort(tags[lines])]
        for part in lines.split(max(1, FLUSH_BYTES // self.storage.row_bytes)):
            self._write_lines(tags[part], part)

    def _write_lines(self, tags: torch.Tensor, lines: torch.Tensor) -> None:
        """Writes ``lines`` (holding rows of ``tags``) to the storage in id order and marks them clean; a failure
        leaves the cache refusing every later call (those rows exist nowhere else)."""
        start = time.perf_counter()
        order = torch.argsort(tags)
        tags, lines = tags[order], lines[order]
        try:
            self.storage.write(tags.cpu(), self.data[lines].cpu())  # a device cache's lines go to the host first
        except BaseException as exc:
            self._failed = exc
            raise
        self.dirty[lines] = False
        self.stats.written_back += tags.numel()
        self.stats.bytes_written += tags.numel() * self.storage.row_bytes
        self.timings["write-back"] = self.timings.get("write-back", 0.0) + time.perf_counter() - start

    def _stored_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows of uncached ``ids`` as stored: kept from the last lookup where it had them, else read."""
        out = torch.empty((ids.numel(), self.storage.dim), dtype=self.data.dtype, device=self.device)
        missing = torch.ones(ids.numel(), dtype=torch.bool, device=self.device)
        if self._lineless is not None:
            known, known_rows = self._lineless
            ids_here = ids.to(self.device)
            at = torch.searchsorted(known, ids_here).clamp_max(known.numel() - 1)
            found = torch.nonzero(known[at] == ids_here).reshape(-1)
            out.index_copy_(0, found, known_rows[at[found]])
            missing[found] = False
        read = torch.nonzero(missing).reshape(-1)
        if read.numel():
            out.index_copy_(0, read, self.storage.read(ids[read.cpu()]).to(self.device))
        return out


def write_back_for(storage, data: torch.Tensor, stats: CacheStats) -> ReadOnly:
    """The write-back of a cache whose lines are ``data``: :class:`WriteBack` over a writable storage, else
    :class:`ReadOnly`."""
    return WriteBack(storage, data, stats) if storage.writable else ReadOnly()
