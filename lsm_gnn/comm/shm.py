"""Rows between ranks of one host through shared memory, in place of the rows' bytes in gloo's TCP messages.

Each rank keeps two *segments*, files in ``/dev/shm`` that every rank of the
group maps, one for each parity of the lookup count. A segment is the buffer
a lookup works in (``whole`` of :class:`~lsm_gnn.comm.SharedCache`: the rows
this rank's cache serves to every rank at its front, the rows this rank asked
of other owners after them), then one hit flag per served row. The owner's
cache writes its rows there once; each requester copies the rows it asked
for straight from the owner's segment into its own buffer. The rows
collective then carries, from each owner to each requester, only where the
rows are (:data:`HEADER` then one int64 row index per id), a few KB where
the rows were MBs.

**Ordering.** A requester reads owner ``d``'s segment of lookup ``t`` after
the rows collective of ``t``, which ``d`` joins only once its rows are
written. ``d`` writes that parity again at lookup ``t + 2``, after the rows
collective of ``t + 1`` has completed, which needs every requester to have
joined it: a requester's lookups run one after another, so it joined after
it finished reading lookup ``t``. One segment would not do: the next
lookup's ids may reach ``d`` (sent ahead, ``following``) while a requester
still reads the current one. Every pair sends a header, so the collective
orders every pair, also those that exchange no rows.

**Growth.** An owner knows how many rows its lookup needs before it serves
(after the ids collective). If its segment of that parity is too small it
makes a larger one under a new name and drops the old; the header names
the segment (generation and capacity) and each requester maps it on sight.

**Cleanup.** A segment's file is unlinked once every rank has mapped it,
after the rows collective of the next lookup (``unlink_mapped``); the maps
stay valid until dropped. What is left is unlinked at a close, when the
object is collected or at Python's exit. A requester opens a new segment
by a name of its own, a hard link the owner made beside the file (``-for<rank>``),
and unlinks that name once mapped: an owner whose last lookup made a segment
may close, or be collected, before a slower requester has mapped it, and the
rows stay reachable. A rank killed before that leaves at most the files of
its last two lookups (and links no one took); the others unlink them when
their next exchange fails (``abandon``).

Ranks choose with ``cache.exchange`` (``SharedCache(exchange=...)``, else
``LSM_GNN_EXCHANGE``): ``auto`` takes shared memory where every rank of the
group sees the same ``/dev/shm`` (:func:`negotiate`), ``shm`` insists on it,
``collective`` always sends the rows' bytes.
"""
from __future__ import annotations

import glob
import mmap
import os
import secrets
import socket
import weakref

import torch
import torch.distributed as dist

SHM_DIR = "/dev/shm"
PREFIX = "lsm-gnn-rows"
HEADER = 3  # int64 words before the row indices: [parity, generation, capacity in rows]
PARITIES = 2  # segments a rank keeps, used in turn by its lookups (see "Ordering")
EXCHANGE_ENV = "LSM_GNN_EXCHANGE"
#: auto wants this much free in /dev/shm at start: a container's default (64 MB in Docker) is less than two
#: batches of 4 KiB rows, and a full /dev/shm would stop the run at its first larger batch
AUTO_MIN_FREE = 1 << 30
EXCHANGES = ("auto", "shm", "collective")


def exchange_choice(exchange: str | None) -> str:
    """``exchange`` (None: ``LSM_GNN_EXCHANGE``, else auto), checked against :data:`EXCHANGES`."""
    source = "exchange"
    if exchange is None:
        exchange, source = os.environ.get(EXCHANGE_ENV, "").strip() or "auto", EXCHANGE_ENV
    if exchange not in EXCHANGES:
        raise ValueError(f"{source}={exchange!r} is not valid; choose one of: {', '.join(EXCHANGES)}")
    return exchange


def negotiate(group, backend: str, wanted: str) -> list[str] | None:
    """Each rank's token for its segments' names when the rows go through shared memory, else None (the rows
    collective carries them). ``wanted`` is this rank's :func:`exchange_choice`. Collective; every rank
    decides alike, and raises ValueError alike when ranks want different ways or ``shm`` cannot be had.

    Shared memory needs a gloo group (over NCCL the rows stay on the devices) whose ranks all see the same
    ``/dev/shm``. Each rank writes a file with a random token there and reads every other rank's: the same
    host name or boot id is not enough (containers on one host may each have their own ``/dev/shm``).
    ``auto`` also wants :data:`AUTO_MIN_FREE` bytes free there."""
    world = dist.get_world_size(group)
    if backend != "gloo" or world == 1:
        if wanted == "shm":
            raise ValueError(f"exchange=shm needs a gloo group of several ranks on one host; this one is "
                             f"{backend} with {world} rank(s): use auto or collective")
        return None
    token = secrets.token_hex(8)
    probe = os.path.join(SHM_DIR, f"{PREFIX}-probe-{token}")
    unwritable = None  # why this rank cannot make a file there (a read-only or full /dev/shm), else None
    try:
        with open(probe, "x") as fh:
            fh.write(token)
    except OSError as exc:
        probe, unwritable = None, exc.strerror
    try:
        fs = os.statvfs(SHM_DIR)
        free = fs.f_bavail * fs.f_frsize
    except OSError:
        free = 0
    ranks: list = [None] * world
    dist.all_gather_object(ranks, (socket.gethostname(), wanted, token if probe else None, free, unwritable),
                           group=group)
    seen = []
    for _, _, other, _, _ in ranks:
        try:
            with open(os.path.join(SHM_DIR, f"{PREFIX}-probe-{other}")) as fh:
                seen.append(other is not None and fh.read() == other)
        except OSError:
            seen.append(False)
    everyone: list = [None] * world
    dist.all_gather_object(everyone, seen, group=group)  # after it every rank has read every probe
    if probe:
        os.unlink(probe)
    wants = sorted({r[1] for r in ranks})
    if len(wants) > 1:
        raise ValueError(f"ranks ask for different exchanges ({', '.join(wants)}: cache.exchange or "
                         f"{EXCHANGE_ENV}); start every rank with the same setting")
    blind = [(r, s) for r, row in enumerate(everyone) for s, ok in enumerate(row) if not ok]
    if wanted == "collective" or wanted == "auto" and (blind or min(r[3] for r in ranks) < AUTO_MIN_FREE):
        return None
    cannot_write = [(r, row[0], row[4]) for r, row in enumerate(ranks) if row[4] is not None]
    if cannot_write:
        r, host, why = cannot_write[0]
        raise ValueError(f"exchange=shm needs a writable {SHM_DIR}: rank {r} (host {host}) cannot make a file there "
                         f"({why}); make {SHM_DIR} writable (a container: mount a tmpfs there) or set "
                         f"cache.exchange=collective ({EXCHANGE_ENV}=collective), which needs none")
    if blind:
        r, s = blind[0]
        raise ValueError(f"exchange=shm needs every rank to share {SHM_DIR}: rank {r} (host {ranks[r][0]}) cannot "
                         f"read rank {s}'s file there (host {ranks[s][0]}); use auto or collective")
    return [r[2] for r in ranks]


class Segment:
    """A file of ``capacity`` rows of ``row_bytes`` and ``capacity`` one-byte flags, mapped shared:
    :attr:`rows` ``[capacity, row_bytes]`` and :attr:`flags` ``[capacity]`` (uint8 tensors over the map)."""

    def __init__(self, path: str, capacity: int, row_bytes: int, create: bool):
        self.path, self.capacity = path, capacity
        size = capacity * (row_bytes + 1)
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
        try:
            if create:
                # Reserve the pages now: a full /dev/shm then raises here, not SIGBUS at a write into the map.
                os.posix_fallocate(fd, 0, size)
            self.map = mmap.mmap(fd, size)
        except OSError as exc:
            os.close(fd)
            if create:
                os.unlink(path)
            raise OSError(exc.errno, f"{'making' if create else 'mapping'} the exchange's shared segment {path} "
                                     f"({size / 2**20:.1f} MiB) failed: {exc.strerror}; free {SHM_DIR} or set "
                                     f"cache.exchange=collective ({EXCHANGE_ENV}=collective)") from None
        os.close(fd)  # the map keeps the file's memory
        self.rows = torch.frombuffer(self.map, dtype=torch.uint8, count=capacity * row_bytes).view(capacity,
                                                                                                      row_bytes)
        self.flags = torch.frombuffer(self.map, dtype=torch.uint8, count=capacity, offset=capacity * row_bytes)


class SharedRows:
    """This rank's two segments and its maps of the other ranks' (see the module's doc). ``tokens[r]`` names
    rank ``r``'s files; every rank must hold the same list."""

    def __init__(self, rank: int, world_size: int, row_bytes: int, tokens: list[str]):
        self.rank, self.world_size, self.row_bytes, self.tokens = rank, world_size, row_bytes, tokens
        self.generation = 0  # of this rank's latest segment: each has a name of its own
        self.own: list[Segment | None] = [None] * PARITIES  # by parity
        self.own_generation = [0] * PARITIES
        self.peers: dict[tuple[int, int], tuple[int, Segment]] = {}  # (owner, parity) -> (generation, its map)
        self._to_unlink: list[tuple[int, str]] = []  # (lookup that made it, path); changed in place only
        # unlinked when this object goes, or at the interpreter's exit, whichever is first
        self._finalizer = weakref.finalize(self, _unlink_all, self._to_unlink)

    def _path(self, owner: int, parity: int, generation: int, reader: int | None = None) -> str:
        """A segment's file, or (``reader``) the name that rank opens it by (see the module's "Cleanup")."""
        name = f"{PREFIX}-{self.tokens[owner]}-r{owner}-p{parity}-g{generation}"
        return os.path.join(SHM_DIR, name if reader is None else f"{name}-for{reader}")

    def buffer(self, lookup: int, rows: int) -> Segment:
        """This rank's segment for ``lookup``'s parity with room for ``rows`` rows (a larger one, under a new
        name, when it has too few: a quarter more, so slowly growing batches rarely need another)."""
        parity = lookup % PARITIES
        segment = self.own[parity]
        if segment is None or segment.capacity < rows:
            self.own[parity] = None  # the old map goes before the new one is made
            self.generation += 1
            capacity = max(1, rows + rows // 4)
            segment = Segment(self._path(self.rank, parity, self.generation), capacity, self.row_bytes, create=True)
            self.own[parity], self.own_generation[parity] = segment, self.generation
            self._to_unlink.append((lookup, segment.path))
            for reader in range(self.world_size):  # each requester's own name for it, which it unlinks
                if reader != self.rank:
                    os.link(segment.path, self._path(self.rank, parity, self.generation, reader))
        return segment

    def header(self, lookup: int) -> list[int]:
        """What precedes the row indices in every reply of ``lookup``: which segment holds the rows."""
        parity = lookup % PARITIES
        return [parity, self.own_generation[parity], self.own[parity].capacity]

    def peer(self, owner: int, header) -> Segment:
        """Owner ``owner``'s segment that ``header`` (its reply's first :data:`HEADER` words) names, mapped once
        and again when the owner replaced it."""
        parity, generation, capacity = (int(v) for v in header)
        known = self.peers.get((owner, parity))
        if known is None or known[0] != generation:
            self.peers.pop((owner, parity), None)
            path = self._path(owner, parity, generation, reader=self.rank)
            self.peers[owner, parity] = (generation, Segment(path, capacity, self.row_bytes, create=False))
            os.unlink(path)  # mapped: the map keeps the memory
        return self.peers[owner, parity][1]

    def unlink_mapped(self, lookup: int) -> None:
        """Unlinks the files this rank made before ``lookup``: called once ``lookup``'s rows collective has
        completed, every rank has mapped them (a requester maps a segment in the lookup that made it, whether
        or not it asked that owner for any row, and finished that lookup before joining this collective)."""
        done = [entry for entry in self._to_unlink if entry[0] < lookup]
        _unlink_all(done)
        for entry in done:
            self._to_unlink.remove(entry)

    def close(self) -> None:
        """Unlinks this rank's files still named and drops every map (tensors still viewing one keep it)."""
        _unlink_all(self._to_unlink)
        self._to_unlink.clear()
        self.own = [None] * PARITIES
        self.peers = {}

    def abandon(self) -> None:
        """:meth:`close` after a failed exchange, also unlinking every rank's files still named: a rank that
        died leaves those of its last lookups, and no rank will map them now."""
        self.close()
        for token in self.tokens:  # this rank's too: the names it made for requesters that will not map them
            _unlink_all((None, path) for path in glob.glob(os.path.join(SHM_DIR, f"{PREFIX}-{token}-*")))


def _unlink_all(entries) -> None:
    for _, path in entries:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
