"""Uniform neighbor sampling without replacement, per-hop fanouts, over a graph of typed nodes and relations.

One sampler for every graph: ``NeighborSampler(graph, fanouts, seed)`` reads anything with node types,
relations and one CSR per relation (:class:`Graph`; a :class:`~lsm_gnn.data.Dataset` is one, and
:class:`CSRGraph` makes one of two bare CSR arrays). Inside it is keyed: seeds, node counts and fanouts per node
type and relation, a one-type graph the graph of one node type and one relation. ``sample(seeds, iteration)``
takes seeds as ``{type: ids}`` or a ``(type, ids)`` pair and returns one :class:`Hop` per fanout, innermost (the
seeds') first, per node type (``nodes``, ``num_dst``) and relation (``edge_index``). Plain ids and plain hops
(``nodes`` a tensor, ``num_dst`` an int, ``edge_index`` one [2, E] tensor), as models of one node type read
them, are :class:`~lsm_gnn.sampling.OneTypeSampler`'s: the one-type form is a wrapper made once, not a mode.

How the op draws is the sampler's own choice: on a graph of one node type and one relation every hop by one
call of the op, with the sampler's seed; on any other graph each relation by one call per hop, with random
streams of its own (:func:`_draw_seed`).

Sampling is deterministic in (seed, iteration, seeds): a window buffer can sample batch t + 256 now and the
trainer gets the very same batch at iteration t + 256.

The op is ``torch.ops.lsm_gnn.sample_hops`` (:mod:`lsm_gnn.kernels.ops`): the C++ core for CPU seeds, the
Triton kernel for CUDA seeds (``device="cuda"``, or seeds given as a CUDA tensor), drawing the same hops.
The Triton kernel is checked against the C++ core on CPU tensors under Triton's interpreter
(``kernels=triton``); it has not run on a GPU yet (``docs/gpu.md``).

Typed hops feed PyG's ``HeteroConv``, one layer per hop, outermost hop first; each layer ends at the
previous hop's nodes, the last one at the seeds::

    hops = sampler.sample({"paper": batch}, iteration)
    x_dict = {t: features[t][hops[-1].nodes[t]] for t in hops[-1].nodes}
    for conv, hop in zip(convs, reversed(hops)):       # convs: HeteroConv({rel: SAGEConv((-1, -1), d)})
        out = conv(x_dict, hop.edge_index)
        x_dict = {t: y[:hop.num_dst[t]] for t, y in out.items()}
    logits = x_dict["paper"]                           # one row per seed

HeteroConv outputs only the types that some relation points to, so a type that is a source must also be
a destination (give the graph reverse relations, as PyG's ``ToUndirected`` does).
"""
from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch.utils._pytree import tree_map

from lsm_gnn.data.dataset import ONE_RELATION, ONE_TYPE, Relation, relation_key
from lsm_gnn.data.fanouts import keyed_fanouts
from lsm_gnn.data.format import source_file, topology_error
from lsm_gnn.defaults import TOPOLOGY_ACCESS
from lsm_gnn.utils.hashing import mix64
from lsm_gnn.utils.hostmem import host_zeros
from lsm_gnn.utils.ids import as_id_tensor, first_occurrence_labels, read_only_tensor
from lsm_gnn.kernels import kernel_mode
from lsm_gnn.kernels.ops import hops_of  # importing it registers torch.ops.lsm_gnn

_MASK64 = (1 << 64) - 1


@dataclass
class Hop:
    """One hop (a DGL-style block), typed or plain.

    Typed (the sampler's own form): per node type and relation. ``nodes[t]``: every node of type t in this hop;
    its first ``num_dst[t]`` are the destinations (the previous hop's nodes, the seeds for hop 0); a type not
    reached has an empty tensor. ``edge_index[r]`` ([2, E] for every relation r = (s, name, d)): row 0 indexes
    ``nodes[s]`` (sources), row 1 indexes ``nodes[d][:num_dst[d]]`` (destinations), as in PyG's
    ``edge_index_dict``; messages flow 0 -> 1 as in PyG.

    Plain (a typed hop of a graph of one node type and one relation in its :meth:`unkeyed` form, which a
    one-type graph's models read): the same with ``nodes`` a
    tensor, ``num_dst`` an int and ``edge_index`` one [2, E] tensor. The derived fields below map over either
    form alike (``tree_map``).
    """

    nodes: torch.Tensor | dict[str, torch.Tensor]
    num_dst: int | dict[str, int]
    edge_index: torch.Tensor | dict[Relation, torch.Tensor]

    @property
    def num_src(self) -> int | dict[str, int]:
        return tree_map(lambda ids: int(ids.numel()), self.nodes)

    @property
    def dst_nodes(self) -> torch.Tensor | dict[str, torch.Tensor]:
        return tree_map(lambda ids, count: ids[:count], self.nodes, self.num_dst)

    @property
    def num_edges(self) -> int | dict[Relation, int]:
        return tree_map(lambda edges: int(edges.shape[1]), self.edge_index)

    def unkeyed(self) -> Hop:
        """This typed hop of a graph of one node type and one relation in the plain form (that type's nodes and
        ``num_dst``, that relation's ``edge_index``): the form models of one node type read."""
        if len(self.nodes) != 1 or len(self.edge_index) != 1:
            raise ValueError(f"a hop of {len(self.nodes)} node types and {len(self.edge_index)} relations has no "
                             "plain form; only a graph of one node type and one relation's has")
        (node_type, nodes), = self.nodes.items()
        (edges,) = self.edge_index.values()
        return Hop(nodes, self.num_dst[node_type], edges)

    def edges_to(self, device) -> None:
        """Moves ``edge_index`` (what a model reads of the hop) to ``device``."""
        self.edge_index = tree_map(lambda edges: edges.to(device, non_blocking=True), self.edge_index)


class Graph(Protocol):
    """What the sampler reads from a graph (a :class:`~lsm_gnn.data.Dataset` is one); node ids are local to
    their type."""

    node_types: list[str]
    relations: list[Relation]

    def num_nodes_of(self, node_type: str) -> int:
        """The node count of one type."""

    def csr(self, relation: Relation) -> tuple[np.ndarray, np.ndarray]:
        """(indptr int64 of num_nodes_of(dst) + 1 entries, int32 or int64 indices of src-type ids): row v lists
        the src-type nodes that dst-type node v aggregates from (messages flow src -> dst)."""


class CSRGraph:
    """Two CSR arrays as a :class:`Graph` of one node type and one relation (:data:`~lsm_gnn.data.dataset.
    ONE_TYPE`, :data:`~lsm_gnn.data.dataset.ONE_RELATION`, as a schema-1 dataset): a topology to sample that
    is not in a dataset directory. The node count is the rows of ``indptr``."""

    def __init__(self, indptr, indices):
        self.indptr, self.indices = indptr, indices
        self.node_types, self.relations = [ONE_TYPE], [ONE_RELATION]

    def num_nodes_of(self, node_type: str = ONE_TYPE) -> int:
        return len(self.indptr) - 1

    def csr(self, relation: Relation = ONE_RELATION) -> tuple[np.ndarray, np.ndarray]:
        return self.indptr, self.indices


def _require_cuda() -> None:
    if not torch.cuda.is_available():
        raise RuntimeError("CUDA sampling was requested but torch sees no CUDA device; sample on the CPU "
                           "(device='cpu' and CPU seeds)")


def _signed64(value: int) -> int:
    """A uint64 as the int64 with the same bits (torch ops take int64)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _sampler_device(device) -> torch.device | None:
    """A sampler's ``device`` argument, checked: None, "cpu" or "cuda[:i]"."""
    device = None if device is None else torch.device(device)
    if device is not None and device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be None, 'cpu' or 'cuda[:i]', got {device!r}")
    if device is not None and device.type == "cuda":
        _require_cuda()  # fail at construction, not at the first batch
    return device


def _batch_device(device: torch.device | None, *seeds) -> torch.device:
    """Where a batch is sampled: the sampler's device, else the GPU of the first CUDA tensor among the
    seed arrays, else the CPU. A bare "cuda" means the current GPU."""
    if device is None:
        on_gpu = [ids.device for ids in seeds if isinstance(ids, torch.Tensor) and ids.is_cuda]
        device = on_gpu[0] if on_gpu else torch.device("cpu")
    if device.type == "cuda":
        _require_cuda()
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


#: ``auto`` preloads a memory-mapped topology no larger than this share of the memory still available
PRELOAD_SHARE = 0.25


def _ranks_on_this_host() -> int:
    """The processes of this run on this host (torchrun's LOCAL_WORLD_SIZE, Open MPI's local size), each of
    which holds its own preloaded copy; 1 outside a launcher."""
    import os

    for key in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        if os.environ.get(key, "").isdigit() and int(os.environ[key]) > 0:
            return int(os.environ[key])
    return 1


def topology_access_for(graph: Graph, relations, access: str) -> str:
    """``access`` with ``auto`` decided: ``preload`` when the mapped CSRs of ``relations``, once per rank on
    this host, take at most :data:`PRELOAD_SHARE` of the memory this process can still use (a memory cgroup's
    limit counted) and that is at least ``defaults.AUTO_MIN_ROOM`` (under a tight cap the copy, which cannot be
    reclaimed as the mapped file's pages can, takes the run's margin), else ``random``."""
    if access != "auto":
        return access
    from lsm_gnn.defaults import AUTO_MIN_ROOM
    from lsm_gnn.utils.memcap import available_memory

    mapped = sum(a.nbytes for r in relations for a in graph.csr(r) if getattr(a, "_mmap", None) is not None)
    room = available_memory()
    fits = room is not None and room >= AUTO_MIN_ROOM and mapped * _ranks_on_this_host() <= PRELOAD_SHARE * room
    return "preload" if mapped and fits else "random"


def _preloaded(array: np.ndarray) -> np.ndarray:
    """A memory-mapped ``array`` copied into memory on transparent huge pages: the sampler's loads land at
    random in the CSR, and with 4 KiB pages nearly each one also missed the TLB (on a 2M-node, 28M-edge
    graph the op took 25-30% less time from huge pages, docs/benchmarks/sampler.md "Neighbor sampler against DGL")."""
    if getattr(array, "_mmap", None) is None:
        return array
    copy = host_zeros(array.shape, torch.from_numpy(np.empty(0, dtype=array.dtype)).dtype).numpy()
    copy[...] = array
    return copy


def advise_mapped(array, access: str) -> None:
    """``madvise`` on the memory map behind ``array`` (``np.load(..., mmap_mode="r")`` keeps its mmap),
    if it has one: ``"random"`` turns the kernel's read-around off, ``"normal"`` restores it, ``"preload"``
    restores it and has the kernel read the whole file now (``MADV_WILLNEED``: sequential reads ahead of
    sampling, where a cold topology otherwise comes in one page fault per neighbour list, one random read
    each: 17 ms an iteration on a 110 MiB topology, docs/benchmarks/pipeline.md "Read-ahead").

    A page fault on a mapped file normally reads up to 128 KiB around the page (read-around). A sampler
    reads one neighbor list, tens of bytes, per fault at random places: when the topology does not fit
    in memory, read-around reads ~32 pages for each one used and evicts the useful ones to make room
    (measured in docs/benchmarks/scale.md, "Out of core: topology and scale"). The advice holds for the whole
    mapping, so other readers of the same array in this process lose read-around too."""
    import mmap

    if access not in TOPOLOGY_ACCESS:
        raise ValueError(f"topology access must be one of {', '.join(TOPOLOGY_ACCESS)}, got {access!r}")
    base = getattr(array, "_mmap", None)
    if base is None or not hasattr(mmap, "MADV_RANDOM"):
        return  # in memory already, or a platform without madvise
    base.madvise(mmap.MADV_RANDOM if access == "random" else mmap.MADV_NORMAL)
    if access == "preload" and hasattr(mmap, "MADV_WILLNEED"):
        base.madvise(mmap.MADV_WILLNEED)


class _SamplingCSR:
    """One CSR as the tensors ``sample_hops`` reads, copied to each CUDA device on first use there.
    Memory-mapped arrays are advised for ``access`` (:func:`advise_mapped`) and wrapped, or with ``preload``
    copied into memory on huge pages (:func:`_preloaded`)."""

    def __init__(self, indptr, indices, access: str = "random"):
        for array in (indptr, indices):
            advise_mapped(array, access)
        # The native sampler bounds-checks the CSR as it reads it; its errors name these files.
        self.files = (source_file(indptr), source_file(indices))
        if access == "preload":
            indptr, indices = _preloaded(indptr), _preloaded(indices)
        indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        self.num_rows = indptr.size - 1
        self.indptr = read_only_tensor(indptr)
        indices = np.ascontiguousarray(indices)
        if indices.dtype not in (np.int32, np.int64):
            indices = indices.astype(np.int64)
        self.indices = read_only_tensor(indices)
        self._on_device: dict = {}  # CUDA device -> (indptr, indices) there

    def on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device.type != "cuda":
            return self.indptr, self.indices
        if device not in self._on_device:
            self._on_device[device] = (self.indptr.to(device), self.indices.to(device))
        return self._on_device[device]


def _draw_seed(seed: int, relation: Relation, hop: int) -> int:
    """The sample_hops seed of one relation at one hop of typed sampling: keyed by the relation's name (not its
    position, so adding a relation to a graph leaves the others' draws alone), mixed so that no two relations
    or hops share random streams. As a signed int64, the op's type."""
    name_key = int.from_bytes(hashlib.blake2b(relation_key(relation).encode(), digest_size=8).digest(), "little")
    return _signed64(mix64(mix64(seed ^ name_key) + hop))


class NeighborSampler:
    """Samples hops outward from seed nodes of a :class:`Graph`.

    ``fanouts``: per hop h, ``fanouts[h]`` (-1: all) distinct neighbors of each node reached so far; one list
    for every relation, or a dict giving each relation its list (keys: the relation tuple or its
    ``"src__name__dst"`` name; all lists the same length). Hop 0 samples the seeds' neighbors; each later
    hop samples for every node reached so far. At hop h every relation r = (s, name, d)
    draws ``fanouts[r][h]`` neighbors of each node of type d from r's CSR, and a type's nodes at hop h are
    its nodes of hop h - 1 followed by its newly reached ones, in relation order, then edge order. The op
    bounds each relation's neighbor ids by its src type's node count.

    ``device``: None samples where the seeds are (CUDA seeds: on their GPU; anything else: on the CPU);
    "cpu" or "cuda[:i]" forces one. The GPU path copies each relation's CSR to the device on first use (the
    topology must fit in GPU memory) and runs the Triton kernels.

    ``topology_access``: ``"random"`` stops the kernel's read-around on the memory-mapped CSRs, which pays
    when the topology does not fit in memory; ``"normal"`` keeps it; ``"preload"`` reads the CSRs in now,
    sequentially, into memory on huge pages; ``"auto"`` (default) preloads a topology that takes at most a
    quarter of the memory still available (once per rank on the host), else reads at random. See
    :func:`advise_mapped` and :func:`_preloaded`.

    ``num_nodes`` (per node type) and ``fanouts`` (per relation) are keyed for every graph; on a graph of one
    relation ``indptr`` and ``indices`` are its CSR.
    """

    def __init__(self, graph: Graph, fanouts, seed: int = 0, num_threads: int = 0, device=None,
                 topology_access: str = "auto"):
        self.node_types = [str(t) for t in graph.node_types]
        self.relations: list[Relation] = [tuple(r) for r in graph.relations]
        if len(set(self.node_types)) != len(self.node_types) or len(set(self.relations)) != len(self.relations):
            raise ValueError("the graph lists a node type or a relation twice")
        if not self.relations:
            raise ValueError("the graph has no relations to sample")
        for r in self.relations:
            if len(r) != 3 or r[0] not in self.node_types or r[2] not in self.node_types:
                raise ValueError(f"relation {r!r} must be (src_type, name, dst_type) with types among "
                                 f"{self.node_types}")
        self.num_nodes = {t: int(graph.num_nodes_of(t)) for t in self.node_types}
        self.fanouts = keyed_fanouts(fanouts, self.relations)
        self.num_hops = len(self.fanouts[self.relations[0]])
        #: the relation of a graph of one node type and one relation, whose hops one call of the op draws (the
        #: native fast path: an inside choice, whatever form the seeds come in); None on any other graph
        self._one_relation = self.relations[0] if len(self.node_types) == len(self.relations) == 1 else None
        self.seed = int(seed) & _MASK64
        self.num_threads = num_threads
        self.device = _sampler_device(device)
        self._pool: ThreadPoolExecutor | None = None  # sample_many's workers, made at its first parallel call
        self._pool_threads = 0
        self._pool_lock = threading.Lock()
        self._draw_seeds = {r: [_draw_seed(self.seed, r, h) for h in range(self.num_hops)] for r in self.relations}
        if topology_access not in TOPOLOGY_ACCESS:
            raise ValueError(f"topology_access must be one of {', '.join(TOPOLOGY_ACCESS)}, got {topology_access!r}")
        access = topology_access_for(graph, self.relations, topology_access)
        self._csr = {r: self._relation_csr(graph, r, access) for r in self.relations}

    @property
    def indptr(self) -> torch.Tensor:
        return self._only_csr().indptr

    @property
    def indices(self) -> torch.Tensor:
        return self._only_csr().indices

    def _only_csr(self) -> _SamplingCSR:
        if len(self.relations) != 1:
            raise AttributeError(f"the graph has {len(self.relations)} relations, so no one indptr and indices; "
                                 "each relation's CSR is in _csr")
        return self._csr[self.relations[0]]

    def _relation_csr(self, graph: Graph, relation: Relation, access: str) -> _SamplingCSR:
        src_type, _, dst_type = relation
        indptr, indices = graph.csr(relation)
        csr = _SamplingCSR(indptr, indices, access)
        if csr.num_rows != self.num_nodes[dst_type]:
            raise self._corrupt(relation, csr, f"indptr has {csr.num_rows + 1} entries, but {dst_type!r} has "
                                               f"{self.num_nodes[dst_type]} nodes (expected one more entry)", "indptr")
        return csr

    @staticmethod
    def _corrupt(relation: Relation, csr: _SamplingCSR, message: str, array: str):
        """The DatasetError for a CSR fault found sampling relation by relation, naming the relation (and its file)."""
        from lsm_gnn import _C

        fault = _C.CorruptGraphError(f"relation {relation_key(relation)}: {message}", array)
        return topology_error(fault, *csr.files)

    def sample(self, seeds, iteration: int = 0) -> list[Hop]:
        """The hops of one mini-batch, on the sampling device, per node type and relation. ``seeds``:
        ``{type: distinct ids}`` or a ``(type, ids)`` pair (for plain ids and plain hops of a graph of one node
        type: :class:`~lsm_gnn.sampling.OneTypeSampler`)."""
        return self._sample(self._keyed_seeds(seeds), iteration, self.num_threads)

    def sample_many(self, batches: Sequence[tuple[object, int]]) -> list[list[Hop]]:
        """:meth:`sample` of each ``(seeds, iteration)`` in ``batches``, in order, with the same results. On the
        CPU with the native kernels the batches are spread over ``num_threads`` workers (0: the cores this process
        may use), one thread each: a batch alone is a fraction of a millisecond, too short to share across
        threads well, while whole batches side by side scale (a loader filling its window samples dozens)."""
        batches = list(batches)
        keyed = [self._keyed_seeds(seeds) for seeds, _ in batches]
        threads = self.num_threads if self.num_threads > 0 else len(os.sched_getaffinity(0))
        on_cpu = all(_batch_device(self.device, *seeds.values()).type == "cpu" for seeds in keyed)
        # The C++ op only: the Triton interpreter (kernels=triton on a CPU) is not safe on several threads.
        if len(batches) < 2 or threads < 2 or not on_cpu or kernel_mode() != "native":
            return [self._sample(seeds, iteration, self.num_threads) for seeds, (_, iteration) in zip(keyed, batches)]
        with self._pool_lock:
            if self._pool is None or self._pool_threads != threads:
                if self._pool is not None:
                    self._pool.shutdown(wait=False)
                self._pool = ThreadPoolExecutor(threads, thread_name_prefix="lsm-gnn-sampler")
                self._pool_threads = threads
            pool = self._pool
        return list(pool.map(lambda seeds, batch: self._sample(seeds, batch[1], 1), keyed, batches))

    def input_nodes(self, seeds, iteration: int = 0) -> dict[str, torch.Tensor]:
        """Every node whose features the batch needs, per node type (the last hop's nodes)."""
        return self.sample(seeds, iteration)[-1].nodes

    def _keyed_seeds(self, seeds) -> dict:
        """``seeds`` as ``{node type: ids}``, checked against the graph's types."""
        if isinstance(seeds, tuple) and len(seeds) == 2 and isinstance(seeds[0], str):
            seeds = {seeds[0]: seeds[1]}
        if not isinstance(seeds, Mapping):
            raise TypeError(f"seeds must be {{node type: ids}} or a (node type, ids) pair, got "
                            f"{type(seeds).__name__}; for plain ids of a graph of one node type use "
                            "lsm_gnn.sampling.OneTypeSampler")
        unknown = [t for t in seeds if t not in self.num_nodes]
        if unknown:
            raise ValueError(f"seeds of node type {unknown[0]!r}, which the graph does not have; its types: "
                             f"{', '.join(self.node_types)}")
        return dict(seeds)

    def _sample(self, seeds: dict, iteration: int, num_threads: int) -> list[Hop]:
        device = _batch_device(self.device, *seeds.values())
        if self._one_relation is not None:
            return self._sample_one_relation(seeds, device, iteration, num_threads)
        return self._sample_by_relation(seeds, device, iteration, num_threads)

    def _sample_one_relation(self, seeds: dict, device: torch.device, iteration: int, num_threads: int
                             ) -> list[Hop]:
        """A graph of one node type and one relation: every hop by one call of the op, with the sampler's own
        seed (the op checks the seeds)."""
        from lsm_gnn import _C

        (node_type,), relation = self.node_types, self._one_relation
        csr = self._csr[relation]
        indptr, indices = csr.on(device)
        ids = as_id_tensor(seeds.get(node_type, []), device)
        try:
            flat = torch.ops.lsm_gnn.sample_hops(indptr, indices, ids, self.fanouts[relation],
                                                 _signed64(self.seed), int(iteration), num_threads)
        except _C.CorruptGraphError as exc:
            raise topology_error(exc, *csr.files) from None
        return [Hop({node_type: nodes}, {node_type: num_dst}, {relation: torch.stack([src, dst])})
                for nodes, num_dst, src, dst in hops_of(flat, ids.numel())]

    def _sample_by_relation(self, seeds: dict, device: torch.device, iteration: int, num_threads: int
                            ) -> list[Hop]:
        """Per hop, one call of the op per relation, each with its own random streams."""
        from lsm_gnn import _C

        frontier = self._seed_nodes(seeds, device)
        no_ids = torch.empty(0, dtype=torch.int64, device=device)
        hops = []
        for h in range(self.num_hops):
            drawn = {}  # relation -> (neighbor ids of its src type, dst index into frontier[dst type])
            for r in self.relations:
                dst_nodes, fanout = frontier[r[2]], self.fanouts[r][h]
                if dst_nodes.numel() == 0 or fanout == 0:
                    drawn[r] = (no_ids, no_ids)
                    continue
                csr = self._csr[r]
                indptr, indices = csr.on(device)
                try:
                    nodes, src, dst = torch.ops.lsm_gnn.sample_hops(indptr, indices, dst_nodes, [fanout],
                                                                    self._draw_seeds[r][h], int(iteration),
                                                                    num_threads, self.num_nodes[r[0]])
                except _C.CorruptGraphError as exc:
                    raise self._corrupt(r, csr, *exc.args) from None
                # The op merges neighbors with the seeds numerically, which is wrong across types:
                # nodes[src] is each edge's neighbor id, exact either way.
                neighbors = nodes.index_select(0, src)  # not nodes[src]: 10x slower on the CPU
                drawn[r] = (neighbors, dst)
            num_dst = {t: int(ids.numel()) for t, ids in frontier.items()}
            frontier, edge_index = self._merge(frontier, drawn)
            hops.append(Hop(frontier, num_dst, edge_index))
        return hops

    def _seed_nodes(self, seeds: dict, device: torch.device) -> dict[str, torch.Tensor]:
        """Per type, its seeds as an int64 tensor on ``device`` (empty for types without), checked."""
        nodes = {}
        for t in self.node_types:
            ids = as_id_tensor(seeds.get(t, []), device)
            outside = (ids < 0) | (ids >= self.num_nodes[t])
            if bool(outside.any()):
                i = int(torch.nonzero(outside)[0])
                raise IndexError(f"seed node {int(ids[i])} of type {t!r} at position {i} is outside "
                                 f"[0, {self.num_nodes[t]})")
            ordered = torch.sort(ids).values
            repeated = ordered[1:] == ordered[:-1]
            if bool(repeated.any()):
                raise ValueError(f"seed node {int(ordered[1:][repeated][0])} of type {t!r} appears twice in the "
                                 "batch; seeds must be distinct")
            nodes[t] = ids
        return nodes

    def _merge(self, frontier: dict[str, torch.Tensor], drawn: dict[Relation, tuple[torch.Tensor, torch.Tensor]]
               ) -> tuple[dict[str, torch.Tensor], dict[Relation, torch.Tensor]]:
        """Each type's nodes (its previous ones, then the new ones by first occurrence) and each relation's
        edges in local ids."""
        nodes, edge_index = {}, {}
        for t in self.node_types:
            outgoing = [r for r in self.relations if r[0] == t]
            reached = [drawn[r][0] for r in outgoing]
            if sum(ids.numel() for ids in reached) == 0:
                nodes[t], labels = frontier[t], frontier[t][:0]
            else:
                nodes[t], labels = first_occurrence_labels(torch.cat([frontier[t], *reached]))
                labels = labels[frontier[t].numel():]
            for r, src in zip(outgoing, torch.split(labels, [ids.numel() for ids in reached])):
                edge_index[r] = torch.stack([src, drawn[r][1]])
        return nodes, {r: edge_index[r] for r in self.relations}
