"""The one interface between feature sources and their readers.

A :class:`Features` gives the rows of node features by node id. Plain
storage (:class:`~lsm_gnn.storage.FeatureStorage`, including the in-memory
backend), the software cache (:class:`~lsm_gnn.cache.SoftwareCache`, which
wraps a storage) and the shared cache over ranks
(:class:`~lsm_gnn.comm.SharedCache`, which wraps a cache) all implement it,
so the loader, the trainer and the PyG/DGL adapters read any of them the
same way and never ask which one they hold (GraphBolt's ``Feature``
composed by wrapping, PyG's ``FeatureStore``).

A graph's features are a :class:`TypedFeatures`: rows by (node type, id),
one :class:`Features` per row format, always keyed by node type. A graph of
one node type is the same with one type: :meth:`TypedFeatures.one_type` wraps
its one :class:`Features` (GraphBolt's ``wrap_with_cached_feature``), once, where
a user hands a bare source in (:func:`lsm_gnn.loader.keyed_features`).
Node types whose rows have one format (dim and dtype) share one id space
(:class:`~lsm_gnn.storage.concat.ConcatStorage`) and so one cache, one
window, one victim buffer and one exchange between ranks: IGBH (every type
1024 x float32) and MAG240M (only papers have features) each have a single
group, whose lines go to whichever type's rows the policy keeps. Types with
other row formats form groups of their own, each with a share of the budget
(``docs/hetero.md``). Types without features are in no group.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

#: counters every Features reports (cumulative since it was opened): bytes from the file, distinct rows' bytes,
#: and the seconds the storage spent reading them (its busy time: the disk's side of a pipeline's bound)
BASE_COUNTERS = ("bytes_read", "bytes_useful", "read_seconds")
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
    #: the lines this source caches on this rank (a shared cache: this rank's slice), or None without a cache
    cache_lines: int | None
    #: where several ranks share one cache, the rank that owns each row (``owner(ids) -> ranks``); else None
    owner: object | None

    def gather(self, ids, *, future=None, out: torch.Tensor | None = None, following=None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows ``[len(ids), dim]`` in request order, hit mask ``[len(ids)]``) for one batch.

        ``future`` is the window of upcoming batches (a
        :class:`~lsm_gnn.cache.WindowBuffer`) for caches that plan with it;
        ``out`` receives the rows when given. ``following = (ids, new)``, when
        known, is the next gather: of ``ids``, once the batches ``new`` (ids
        each) have entered the window. A source that exchanges with other
        ranks sends that request while this gather is served; the others
        ignore it.
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
    cache_lines = owner = None
    last_timings: dict = {}
    dim = 0
    dtype = torch.float32
    row_bytes = 0

    def __init__(self, num_rows: int):
        self.num_rows = int(num_rows)

    def gather(self, ids, *, future=None, out: torch.Tensor | None = None, following=None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(ids)
        return torch.empty((n, 0), dtype=self.dtype), torch.zeros(n, dtype=torch.bool)

    def counters(self) -> dict[str, int]:
        return {"bytes_read": 0, "bytes_useful": 0, "read_seconds": 0.0}

    def prefetch(self) -> None:
        """Nothing to prefetch."""

    def settle(self) -> None:
        """Nothing runs in the background."""

    def describe(self) -> str:
        return "no input features (node embeddings only)"


@dataclass
class FeatureGroup:
    """Node types sharing one row format, and the Features serving their id space."""

    types: list[str]           # in id-space order
    offsets: dict[str, int]    # first id of each type in the group's id space
    features: Features

    def ids(self, nodes: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[tuple[str, int]]]:
        """The group's ids of ``nodes`` (per type, local ids) and (type, count) per part, in order."""
        if not hasattr(nodes, "keys"):  # a bad argument, not a mode: ids of one type come keyed by it too
            raise TypeError(f"nodes are given as {{node type: ids}}, got {type(nodes).__name__}: e.g. "
                            f"{{{self.types[0]!r}: ids}}, or gather from the one source, features.only.gather(ids)")
        parts = [(t, nodes[t]) for t in self.types if t in nodes]  # empty ones too: every type gets its rows
        if not parts:
            return torch.empty(0, dtype=torch.int64), []
        if len(parts) == 1 and self.offsets[parts[0][0]] == 0:  # its own ids: no copy (a one-type graph's each gather)
            ids = parts[0][1].to(torch.int64)
        else:
            ids = torch.cat([local.to(torch.int64) + self.offsets[t] for t, local in parts])
        return ids, [(t, local.numel()) for t, local in parts]


def _add_to(total: dict, part: dict) -> None:
    for key, value in part.items():
        total[key] = total.get(key, 0) + value


class TypedFeatures:
    """A graph's feature rows by (node type, local id), one :class:`FeatureGroup` per row format: nodes are
    given as {type: ids} and rows come back per type. A graph of one node type is the same with one type
    (:meth:`of` wraps one :class:`Features` so); the loader's :class:`~lsm_gnn.loader.Batch` unwraps it for
    the models.

    Besides the input features, a node type may have trainable rows (``trainable``: a
    :class:`~lsm_gnn.embedding.NodeEmbedding`, ``model.node_embedding``): a writable source gathered with
    :meth:`gather_trainable` and changed with :meth:`update`, which keeps its own order of reads and
    updates."""

    def __init__(self, groups: list[FeatureGroup]):
        self.groups = groups
        self.group_of: dict[str, int] = {t: g for g, group in enumerate(groups) for t in group.types}
        #: trainable rows by node type (node embeddings); empty without
        self.trainable: dict = {}

    @classmethod
    def one_type(cls, features, node_type: str = "node") -> TypedFeatures:
        """The features of a graph of one node type, ``node_type``, served by ``features`` (a :class:`Features`):
        one group of one type."""
        if not isinstance(features, Features):
            raise TypeError(f"features must implement lsm_gnn.features.Features (gather, counters, ...): a "
                            f"storage, a SoftwareCache or a SharedCache; got {type(features).__name__}")
        return cls([FeatureGroup([node_type], {node_type: 0}, features)])

    @property
    def only(self) -> Features:
        """The source of the one feature group (e.g. a graph of one node type's)."""
        if len(self.groups) != 1:
            raise ValueError(f"features of node types {list(self.group_of)} come from {len(self.groups)} "
                             "sources; pick one of .groups")
        return self.groups[0].features

    @property
    def caches(self) -> bool:
        return any(group.features.caches for group in self.groups)

    def dims(self) -> dict[str, int]:
        """Feature dim per featured type."""
        return {t: group.features.dim for group in self.groups for t in group.types}

    def group_ids(self, nodes: dict) -> list[torch.Tensor]:
        """Per group, the ids of ``nodes`` ({type: local ids}) in its id space (what its window holds for a
        batch)."""
        return [group.ids(nodes)[0] for group in self.groups]

    def gather(self, nodes: dict, *, future=None, following=None) -> tuple[dict, dict]:
        """(rows, hit mask) of ``nodes`` ({type: local ids}), each a dict per type (types without features are
        left out).

        ``future``: the windows of upcoming batches (:meth:`window_ids`; ``GroupWindows.buffers`` in
        :mod:`lsm_gnn.loader`), or None. ``following = (nodes, new)``: the next gather's nodes and the
        batches of nodes entering the window before it (:meth:`Features.gather`), or None. Every group
        gathers, even with no ids of its types in the batch: a cache's iterations then stay in step with
        its window, and a shared cache's collectives with the other ranks'."""
        if following is not None:  # per group, in its id space, as its window holds them
            entering = [self.group_ids(batch) for batch in following[1]]
            following = [(ids, [batch[g] for batch in entering])
                         for g, ids in enumerate(self.group_ids(following[0]))]
        else:
            following = [None] * len(self.groups)
        rows, hits = {}, {}
        for g, group in enumerate(self.groups):
            ids, parts = group.ids(nodes)
            x, hit = group.features.gather(ids, future=None if future is None else future[g],
                                           following=following[g])
            start = 0
            for t, count in parts:
                rows[t], hits[t] = x[start:start + count], hit[start:start + count]
                start += count
        return rows, hits

    def add_trainable(self, node_type: str, source) -> None:
        """Gives ``node_type`` trainable rows from ``source`` (a :class:`~lsm_gnn.embedding.NodeEmbedding`)."""
        if node_type in self.trainable:
            raise ValueError(f"node type {node_type!r} has trainable rows already")
        self.trainable[node_type] = source

    def _shared_window(self, node_type: str, source) -> int | None:
        """The feature group whose window ``node_type``'s trainable rows plan with: one of that type alone, whose id
        space is the table's (the same ids, so the same window); None: the table has a window of its own."""
        g = self.group_of.get(node_type)
        if g is not None and self.groups[g].types == [node_type] and \
                self.groups[g].features.num_rows == source.source.num_rows:
            return g
        return None

    def _trainable_windows(self) -> dict[str, int]:
        """The window each trainable type plans with, as indices into :meth:`window_ids`' list: one window per id
        space (each feature group's, then each trainable type's that shares none)."""
        windows, own = {}, len(self.groups)
        for t, source in self.trainable.items():
            shared = self._shared_window(t, source)
            windows[t] = own if shared is None else shared
            own += shared is None
        return windows

    def window_ids(self, nodes: dict) -> list[torch.Tensor]:
        """Per window the loader keeps, the ids of ``nodes`` in it: each feature group's (:meth:`group_ids`), then
        each trainable type's that shares no group's window (its table's own ids)."""
        ids = self.group_ids(nodes)
        own = [t for t, w in self._trainable_windows().items() if w >= len(self.groups)]
        return ids + [nodes[t].to(torch.int64) if t in nodes else torch.empty(0, dtype=torch.int64) for t in own]

    def window_rows(self) -> list[int]:
        """The rows of each window's id space, in :meth:`window_ids`' order."""
        own = [t for t, w in self._trainable_windows().items() if w >= len(self.groups)]
        return [group.features.num_rows for group in self.groups] + [self.trainable[t].source.num_rows for t in own]

    def gather_trainable(self, nodes: dict, future=None, *, training: bool = False, stop=None):
        """(trainable rows of ``nodes`` as float32 per trainable type, seconds by stage, bytes read and written),
        or None if ``stop`` was set while a training gather (``training``: the batch's rows will be updated)
        waited for the update of the batch before. ``future``: the windows (:meth:`window_ids`), or None."""
        if not self.trainable:
            raise ValueError("these features have no trainable rows (model.node_embedding)")
        windows = self._trainable_windows()
        rows, timings, io = {}, {}, {}
        for t, source in self.trainable.items():
            found = source.read(nodes[t], None if future is None else future[windows[t]],
                                training=training, stop=stop)
            if found is None:
                return None
            rows[t] = found[0]
            _add_to(timings, found[1])
            _add_to(io, found[2])
        return rows, timings, io

    def update(self, nodes: dict, grad: dict) -> dict:
        """One optimizer step on the trainable rows of ``nodes`` given their gradient (both per trainable type;
        collective over ranks); the table bytes it read and wrote."""
        io: dict = {}
        for t, source in self.trainable.items():  # every rank in the same order: each step is a collective
            _add_to(io, source.step(nodes[t], grad[t]))
        return io

    def counters(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for group in self.groups:
            _add_to(total, group.features.counters())
        return total

    def prefetch(self) -> None:
        for group in self.groups:
            group.features.prefetch()

    def settle(self) -> None:
        for group in self.groups:
            group.features.settle()
        for source in self.trainable.values():
            source.settle()

    def describe(self, label=lambda types: "+".join(types)) -> str:
        """Each group's source, for a log line, named by ``label(types)``; unnamed where it gives None (a graph
        of one node type's one source, :func:`lsm_gnn.build.cache_label`)."""
        named = ((label(group.types), group.features.describe()) for group in self.groups)
        return "; ".join(text if name is None else f"{name}: {text}" for name, text in named)

    @property
    def last_timings(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for group in self.groups:
            _add_to(total, group.features.last_timings)
        return total
