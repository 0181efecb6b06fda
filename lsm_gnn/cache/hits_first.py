"""Hits first: a device cache serves a request's hits before any other work, so a batch that hits in full costs
one kernel and one read back (issue 43's budget), and only a batch with misses pays for the distinct ids, the
assign and the storage reads. The probe runs where the batch before hit in full: where batches miss (a cache
smaller than the features), it would cost a read back that only says so, and the assign runs at once, its one
read back bringing the counts and the missed ids together.

The kernel (``torch.ops.lsm_gnn.cache_serve_hits``) walks the request as it came, repeats and all: it finds each
id's line, marks it as an assign marks a hit (an idempotent mark, so repeats may race) and copies its row to the
id's position. One read back of three counts then says whether every id hit, whether any was out of range, and
how many distinct ids hit (for the stats). A batch with misses goes on to the assign, which finds its hits again
and marks them the same way, so serving hits first never changes a decision (tests/test_hits_first.py).

Opt-in (``SoftwareCache(graphs=True)``, a GPU cache): where the caller gives the rows' buffer (``out``), the
serving is a CUDA graph per batch size and set of buffers (:class:`ServeGraphs`): the request copied into the
graph's own ids, then one replay that copies the per-call scalars in from pinned host memory, runs the kernel and
copies the counts back out, so an all-hit batch costs two launches that do not go through Triton's launcher.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, NamedTuple

import torch

from lsm_gnn.cache.state import CacheState
from lsm_gnn.kernels import ops as _ops  # noqa: F401  (registers torch.ops.lsm_gnn)
from lsm_gnn.kernels.row_gather import as_words, word_bytes

_LAST_STAMP = 2**31 - 1


class Probe(NamedTuple):
    """What serving the hits found: ``hit`` per requested id (its row is in ``rows`` where true)."""

    hit: torch.Tensor
    misses: int        # positions whose id is not cached
    out_of_range: int  # positions whose id is outside [0, num_rows)
    distinct_hits: int


class HitsFirst:
    """The buffers the kernel reuses on every lookup: its counts, and a stamp per line that tells a line's first
    visitor in this lookup (so repeated ids count once)."""

    def __init__(self, num_lines: int, device: torch.device, graphs: ServeGraphs | None = None):
        self.touched = torch.zeros(num_lines, dtype=torch.int32, device=device)
        self.counts = torch.zeros(3, dtype=torch.int32, device=device)
        self._stamp = 0
        # Probe only where the last batch hit in full: a batch with misses then costs one read back, not two.
        self.probing = False
        self.graphs = graphs

    def serve(self, state: CacheState, data: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, num_rows: int,
              iteration: int, scan_base: int, window=None, *, rows_kept: bool = False) -> Probe:
        """Serves the hits of ``ids`` into ``rows`` (``[len(ids), dim]`` like ``data``'s lines). ``window``: a
        window's ``(first_iteration, first_position, first_rank, front, limit)`` where hits take their next use
        now (a policy with ``assign_next_use``). ``rows_kept``: ``rows`` is a buffer the caller reuses (its
        ``out``), so a graph may write to it on later calls too."""
        self._stamp += 1
        if self._stamp > _LAST_STAMP:  # every 2**31 lookups: start the stamps again
            self.touched.zero_()
            self._stamp = 1
        arrays, front, limit = (None, None, None), 0, 0
        if window is not None:
            *arrays, front, limit = window
        word = word_bytes(data.shape[1] * data.element_size(), data, rows)  # rows move as words of one width
        buffers = (state.tags, state.records, state.flags, state.last_use, self.touched, as_words(data, word),
                   as_words(rows, word), self.counts, *arrays)
        scalars = (self._stamp, iteration, scan_base, front)

        def launch(ids: torch.Tensor, hit: torch.Tensor, on_device: torch.Tensor | None = None) -> None:
            tags, records, flags, last_use, touched, lines, out, counts, *window_arrays = buffers
            torch.ops.lsm_gnn.cache_serve_hits(tags, records, flags, last_use, touched, self._stamp, state.ways,
                                               ids, num_rows, lines, out, hit, counts, iteration, scan_base,
                                               *window_arrays, front, limit, on_device)

        if self.graphs is not None and rows_kept and ids.numel():
            key = (ids.numel(), ids.dtype, state.ways, num_rows, limit, *(_address(b) for b in buffers))
            hit, counts = self.graphs.serve(key, launch, ids, scalars, self.counts)
        else:
            hit = torch.empty(ids.numel(), dtype=torch.int8, device=ids.device)
            launch(ids, hit)
            counts = self.counts.tolist()  # the one read back of an all-hit batch
        misses, out_of_range, distinct = counts
        return Probe(hit.view(torch.bool), misses, out_of_range, distinct)


def _address(t: torch.Tensor | None) -> tuple | None:
    return None if t is None else (t.data_ptr(), t.dtype, tuple(t.shape))


class _Graph(NamedTuple):
    graph: object          # torch.cuda.CUDAGraph (or a stand-in that records and replays the same ops)
    ids: torch.Tensor      # the request, copied in before each replay
    hit: torch.Tensor


class ServeGraphs:
    """The hit-serving kernel as CUDA graphs, one per batch size and set of buffers (the key), at most
    ``max_graphs`` kept (least recently used dropped). A graph's first call runs the launch as it is and
    captures it; later calls copy the request into the graph's ids and replay. Everything that changes between
    calls goes through memory the graph reads or writes: the scalars from a host buffer, the counts to one.
    ``new_graph``: makes a graph and the context that captures into it (``torch.cuda.CUDAGraph`` and
    ``torch.cuda.graph`` on a GPU; tests give a stand-in that records the ops and replays them on CPU tensors)."""

    def __init__(self, device: torch.device, max_graphs: int = 8, new_graph: Callable | None = None):
        if new_graph is None:
            if device.type != "cuda":
                raise ValueError(f"CUDA graphs need a cache on a CUDA device, not {device}: construct the cache "
                                 "with graphs=False (the default)")
            new_graph = _cuda_graph
        pin = device.type == "cuda"
        self.device = device
        self.max_graphs = max_graphs
        self._new_graph = new_graph
        self._graphs: OrderedDict[tuple, _Graph] = OrderedDict()
        self._scalars = torch.zeros(4, dtype=torch.int64, device=device)
        self._host_scalars = torch.zeros(4, dtype=torch.int64, pin_memory=pin)
        self._host_counts = torch.zeros(3, dtype=torch.int32, pin_memory=pin)
        self.captures = 0

    def __len__(self) -> int:
        return len(self._graphs)

    def serve(self, key: tuple, launch: Callable, ids: torch.Tensor, scalars: tuple, counts: torch.Tensor
              ) -> tuple[torch.Tensor, list[int]]:
        """(hit per id, the counts as ``launch`` leaves them): ``launch(ids, hit, scalars_on_device)`` serves."""
        self._host_scalars.numpy()[:] = scalars  # what the next replay copies in
        entry = self._graphs.get(key)
        if entry is None:
            return self._capture(key, launch, ids, counts)
        self._graphs.move_to_end(key)
        entry.ids.copy_(ids)
        entry.graph.replay()
        self._wait()
        return entry.hit.clone(), self._host_counts.tolist()

    def _capture(self, key: tuple, launch: Callable, ids: torch.Tensor, counts: torch.Tensor):
        # This call runs as captured, eagerly (which also compiles the kernel: a capture must not), then the
        # same work is captured for the calls to come.
        static_ids, hit = ids.clone(), torch.empty(ids.numel(), dtype=torch.int8, device=ids.device)

        def body() -> None:
            self._scalars.copy_(self._host_scalars, non_blocking=True)
            launch(static_ids, hit, self._scalars)
            self._host_counts.copy_(counts, non_blocking=True)

        body()
        self._wait()
        served, found = hit.clone(), self._host_counts.tolist()
        graph, capturing = self._new_graph()
        with capturing:
            body()
        if len(self._graphs) >= self.max_graphs:
            self._graphs.popitem(last=False)
        self._graphs[key] = _Graph(graph, static_ids, hit)
        self.captures += 1
        return served, found

    def _wait(self) -> None:
        if self.device.type == "cuda":  # the counts' copy out is asynchronous
            torch.cuda.current_stream(self.device).synchronize()


def _cuda_graph():
    graph = torch.cuda.CUDAGraph()
    # thread_local: the loader's other threads (read-ahead, PVP) keep copying while this one captures
    return graph, torch.cuda.graph(graph, capture_error_mode="thread_local")
