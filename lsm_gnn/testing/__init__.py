"""Helpers for tests of lsm-gnn and of code built on it (shipped in the package, as PyG does).

Here: tiny datasets and recorded graphs; beside it, what the tests and benchmarks run but the production code never
imports: :mod:`.kernel_launches` (the recorded kernel launches of the compile check), :mod:`.virtual_hosts` (two
hosts on one machine for multi-node runs) and :mod:`.benchmarking` (what the benchmark scripts share)."""
from __future__ import annotations

import json
import os
import socket

import numpy as np
from torch.utils._python_dispatch import TorchDispatchMode

from lsm_gnn.data.dataset import Dataset
from lsm_gnn.data.format import META_FILE
from lsm_gnn.data.writer import DatasetWriter


def id_features(num_nodes: int, dim: int, dtype: str = "float32") -> np.ndarray:
    """Features from which a row's node id can be read back: row i starts with i
    (exact in float32 below 2**24) and continues with a per-row pattern."""
    rows = np.arange(num_nodes, dtype=np.int64)[:, None]
    cols = np.arange(dim, dtype=np.int64)[None, :]
    values = np.where(cols == 0, rows, (rows * 31 + cols * 7) % 251)
    if np.dtype(dtype) == np.float16:
        values = np.where(cols == 0, rows % 2048, values)  # float16 is exact only up to 2048
    return values.astype(dtype)


def write_tiny_dataset(path: str | os.PathLike, num_nodes: int = 1000, dim: int = 16, dtype: str = "float32",
                       avg_degree: int = 4, num_classes: int = 4, seed: int = 0, features: np.ndarray | None = None,
                       chunk: int = 257, row_alignment: int | None = None) -> tuple[Dataset, np.ndarray]:
    """Writes a small random dataset and returns it opened, with the feature array it holds. ``row_alignment``
    as in :class:`~lsm_gnn.data.writer.DatasetWriter` (None: packed rows; 512: the layout before packing)."""
    rng = np.random.default_rng(seed)
    if features is None:
        features = id_features(num_nodes, dim, dtype)
    with DatasetWriter(path, num_nodes=num_nodes, feature_dim=dim, feature_dtype=dtype,
                       row_alignment=row_alignment) as writer:
        for start in range(0, num_nodes, chunk):
            writer.write_features(features[start:start + chunk])
        num_edges = num_nodes * avg_degree
        writer.write_edges([(rng.integers(0, num_nodes, num_edges), rng.integers(0, num_nodes, num_edges))])
        writer.write_labels(rng.integers(0, num_classes, num_nodes), num_classes)
        order = rng.permutation(num_nodes)
        cut1, cut2 = int(0.6 * num_nodes), int(0.8 * num_nodes)
        writer.write_split("train", order[:cut1])
        writer.write_split("val", order[cut1:cut2])
        writer.write_split("test", order[cut2:])
        dataset = writer.commit()
    return dataset, features


def write_tiny_hetero_dataset(path: str | os.PathLike, papers: int = 600, authors: int = 500, topics: int = 30,
                              num_classes: int = 3, seed: int = 4, paper_signal: float = 0.2):
    """A small schema-2 dataset a heterogeneous GNN learns well: papers (the target) whose class shows in
    their authors' and topics' features more than in their own (``paper_signal``: how much; 0, none);
    topics have no features. Returns it opened."""
    from lsm_gnn.data.hetero_writer import HeteroDatasetWriter

    rng = np.random.default_rng(seed)
    label = rng.integers(0, num_classes, papers)
    author_class = rng.integers(0, num_classes, authors)
    centroids = rng.standard_normal((num_classes, 16)) * 2
    types = {"paper": {"num_nodes": papers, "feature_dim": 16}, "author": {"num_nodes": authors, "feature_dim": 16},
             "topic": {"num_nodes": topics}}
    with HeteroDatasetWriter(path, node_types=types, target="paper") as w:
        w.write_features("paper", centroids[label] * paper_signal + rng.standard_normal((papers, 16)))
        w.write_features("author", centroids[author_class] + rng.standard_normal((authors, 16)) * 0.5)
        # Each paper has 3 authors, mostly of its own class, and one topic of its class.
        by_class = [np.flatnonzero(author_class == c) for c in range(num_classes)]
        paper = np.repeat(np.arange(papers), 3)
        author = np.array([rng.choice(by_class[label[p]]) if rng.random() < 0.8 else rng.integers(0, authors)
                           for p in paper])
        topic = label * (topics // num_classes) + rng.integers(0, topics // num_classes, papers)
        w.write_edges(("author", "writes", "paper"), [(author, paper)])
        w.write_edges(("paper", "written_by", "author"), [(paper, author)])
        w.write_edges(("topic", "topic_of", "paper"), [(topic, np.arange(papers))])
        w.write_edges(("paper", "has_topic", "topic"), [(np.arange(papers), topic)])
        w.write_edges(("paper", "cites", "paper"), [(rng.integers(0, papers, 2 * papers),
                                                     rng.integers(0, papers, 2 * papers))])
        w.write_labels("paper", label, num_classes)
        order = rng.permutation(papers)
        w.write_split("paper", "train", order[:papers * 2 // 3])
        w.write_split("paper", "val", order[papers * 2 // 3:papers * 5 // 6])
        w.write_split("paper", "test", order[papers * 5 // 6:])
        for t in ("paper", "author"):
            w.write_score(t, "degree", rng.random(types[t]["num_nodes"]))
        return w.commit()


def power_law_trace(seed: int, iterations: int, batch: int, num_nodes: int, skew: float = 0.9) -> list[np.ndarray]:
    """Batches of ids drawn from a Zipf-like popularity over a random permutation of the nodes
    (a cache trace with hot and cold ids, for the cache tests)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, num_nodes + 1) ** skew
    p /= p.sum()
    perm = rng.permutation(num_nodes)
    return [perm[rng.choice(num_nodes, batch, p=p)] for _ in range(iterations)]


def brute_force_min(trace, ways: int, num_sets: int = 1) -> int:
    """The optimum hit count of a ``num_sets x ways`` cache (ids in the cache's sets) over ``trace``, by
    trying every choice of ids to keep after each batch: an oracle for Belady's MIN on tiny traces only."""
    from functools import lru_cache
    from itertools import combinations

    from lsm_gnn.cache.geometry import set_of

    batches = [tuple(sorted({int(v) for v in b})) for b in trace]

    def fits(keep) -> bool:
        return np.bincount(set_of(np.array(keep, np.int64), num_sets), minlength=num_sets).max(initial=0) <= ways

    @lru_cache(maxsize=None)
    def best(t: int, cached: frozenset) -> int:
        if t == len(batches):
            return 0
        hits = sum(1 for v in batches[t] if v in cached)
        pool = sorted(cached | set(batches[t]))
        keeps = (k for size in range(len(pool) + 1) for k in combinations(pool, size) if fits(k))
        return hits + max(best(t + 1, frozenset(k)) for k in keeps)

    return best(0, frozenset())


def tiny_cache_setup(path: str | os.PathLike, num_nodes: int, dim: int = 6):
    """(memory storage, features tensor, quantized degree scores) of a tiny dataset, for the cache tests."""
    import torch

    from lsm_gnn.cache import quantize_scores
    from lsm_gnn.storage import open_storage

    dataset, features = write_tiny_dataset(path, num_nodes=num_nodes, dim=dim)
    static = quantize_scores(np.diff(np.asarray(dataset.indptr)).astype(np.float64))
    return open_storage(dataset, "memory"), torch.from_numpy(features), static


def edit_meta(dataset, change) -> None:
    """Rewrites ``meta.json`` of ``dataset`` (a Dataset) after ``change(meta)``: for tests of damaged datasets."""
    path = os.path.join(dataset.path, META_FILE)
    with open(path) as f:
        meta = json.load(f)
    change(meta)
    with open(path, "w") as f:
        json.dump(meta, f)


def rewrite_checksums(path: str | os.PathLike, *names: str) -> None:
    """Records the current bytes of files ``names`` of the dataset at ``path`` in its meta.json ``checksums`` and
    block checksums: for tests that change a file of a written dataset on purpose (the run's ``data.verify``
    would otherwise stop at the change)."""
    from lsm_gnn.data.format import BLOCK_SUMS_FILE, block_sums_of_file, crc32_file

    path = os.fspath(path)
    with open(os.path.join(path, META_FILE)) as f:
        meta = json.load(f)
    blocks = meta.get("block_checksums")
    for name in names:
        meta["checksums"][name], sums = block_sums_of_file(os.path.join(path, name))
        if blocks is not None:
            sums_path = os.path.join(path, blocks["file"])
            first, count = blocks["files"][name]
            if count != sums.size:  # another size: its sums go to the end of the file
                first = os.path.getsize(sums_path) // 4
                blocks["files"][name] = [first, int(sums.size)]
            with open(sums_path, "r+b") as f:
                f.seek(4 * first)
                f.write(sums.astype("<u4").tobytes())
    if blocks is not None:
        meta["checksums"][BLOCK_SUMS_FILE] = crc32_file(os.path.join(path, blocks["file"]))
    with open(os.path.join(path, META_FILE), "w") as f:
        json.dump(meta, f)


def free_port() -> int:
    """A TCP port free on localhost now, for a test's MASTER_PORT."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PROGRAM_ORDERS = ("natural", "reversed", "shuffled", "alternating")


class ProgramOrder:
    """Makes Triton's interpreter run the programs of each kernel launch in ``order``: ``natural`` (0, 1, 2...,
    the interpreter's own), ``reversed``, ``shuffled`` (a permutation drawn from ``seed`` and the launch's
    number: different per launch, the same on every run with that seed), or ``alternating`` (launches 0, 2,
    4... reversed, 1, 3, 5... shuffled: both orders in one run of a test, at the cost of one).

    A GPU runs one launch's programs in any order and at once; the interpreter runs them one at a time in
    order, so a kernel that silently relies on that order passes on CPU and fails on a GPU. Running its tests
    under other orders too shows the dependence on CPU.

    The interpreter sets the grid once per launch (``set_grid_dim``), then loops over x, y, z setting each
    program's index (``set_grid_idx``) before running it; :meth:`apply` wraps both, so the loop's n-th step
    runs the program whose ``tl.program_id`` is the permutation's n-th entry. Both methods exist unchanged in
    triton 3.6 and 3.9."""

    def __init__(self, order: str, seed: int = 0):
        if order not in PROGRAM_ORDERS:
            raise ValueError(f"program order {order!r}; use one of {', '.join(PROGRAM_ORDERS)}")
        self.order = order
        self.seed = seed
        self.launches = 0  # launches run so far under this order (numbers the shuffled permutations)

    def __repr__(self) -> str:
        return f"ProgramOrder({self.order!r}, seed={self.seed})"

    def permutation(self, count: int, launch: int) -> np.ndarray:
        """The program indices of launch number ``launch`` (``count`` programs), in the order they run."""
        if self.order == "reversed" or (self.order == "alternating" and launch % 2 == 0):
            return np.arange(count)[::-1]
        if self.order in ("shuffled", "alternating"):
            return np.random.default_rng([self.seed, launch]).permutation(count)
        return np.arange(count)

    def apply(self, monkeypatch) -> None:
        """Patches the interpreter (through ``monkeypatch``, which undoes it) for every launch from now on."""
        from triton.runtime.interpreter import InterpreterBuilder

        set_grid_dim, set_grid_idx = InterpreterBuilder.set_grid_dim, InterpreterBuilder.set_grid_idx
        order = self

        def set_grid_dim_in_order(builder, nx, ny, nz):
            set_grid_dim(builder, nx, ny, nz)
            builder.program_order = order.permutation(nx * ny * nz, order.launches)
            order.launches += 1

        def set_grid_idx_in_order(builder, x, y, z):
            _, ny, nz = builder.grid_dim
            step = (x * ny + y) * nz + z  # the loop's position: z innermost, x outermost
            program = int(builder.program_order[step])
            set_grid_idx(builder, program // (ny * nz), program // nz % ny, program % nz)

        monkeypatch.setattr(InterpreterBuilder, "set_grid_dim", set_grid_dim_in_order)
        monkeypatch.setattr(InterpreterBuilder, "set_grid_idx", set_grid_idx_in_order)


class RecordedGraph:
    """A stand-in for ``torch.cuda.CUDAGraph`` on CPU tensors. Capturing records the ops dispatched and runs none
    (a capture runs nothing); ``replay`` runs them again with the same arguments, scalars and all. So, as on a
    GPU, whatever changes between replays must reach the graph through memory it reads."""

    def __init__(self):
        self.ops: list = []
        self.replays = 0

    @classmethod
    def new(cls) -> tuple["RecordedGraph", "_Capturing"]:
        """(graph, the context that captures into it): ``ServeGraphs``'s ``new_graph``."""
        graph = cls()
        return graph, _Capturing(graph)

    def replay(self) -> None:
        self.replays += 1
        for func, args, kwargs in self.ops:
            func(*args, **kwargs)


class _Capturing(TorchDispatchMode):
    def __init__(self, graph: RecordedGraph):
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        returns = func._schema.returns
        if returns and returns[0].alias_info is None:  # a fresh tensor: a graph would own its memory
            raise AssertionError(f"{func} allocates during a capture")
        self.graph.ops.append((func, args, kwargs or {}))
        return args[0] if returns else None
