"""Converters into the dataset format: numpy arrays, .npy files, PyG, DGL, OGB/IGB folders.

Every converter ends in one typed core: :func:`check_typed` validates all
inputs before writing, then :func:`write_typed` streams them through a
schema's writer: features chunk by chunk, edges in chunks of
``EDGE_CHUNK``, so inputs opened with ``np.load(mmap_mode="r")`` convert in
bounded memory whatever their size. Only per-node vectors (labels, CSR
``indptr``) are held whole, as the writer needs them. :func:`from_numpy`
gives the core its arrays as the one node type and the one relation of
:class:`DatasetWriter`'s schema; :func:`~lsm_gnn.data.convert_hetero.hetero_from_numpy`
gives it node types and relations for :class:`~lsm_gnn.data.hetero_writer.HeteroDatasetWriter`.

Edge direction follows PyG and DGL: an edge ``src -> dst`` sends a message
from ``src`` to ``dst``, so ``dst``'s CSR row lists ``src``.
"""
from __future__ import annotations

import fnmatch
import os
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from lsm_gnn.data.dataset import Dataset, Relation, relation_key
from lsm_gnn.data.format import FEATURE_DTYPES, ONE_RELATION, ONE_TYPE, SPLITS
from lsm_gnn.data.scores import SCORE_NAMES, check_score_names
from lsm_gnn.data.writer import EDGE_CHUNK, DatasetWriter, TypedDatasetWriter, csr_edge_chunks, errors_about
from lsm_gnn.utils.progress import progress_bar

FEATURE_CHUNK_BYTES = 32 << 20  # bytes of source features read per write
VECTOR_CHUNK = 1 << 22          # entries per chunk when scanning per-node vectors

# Names recognised by from_folder, searched recursively (OGB dumps, IGB's processed/ tree).
FOLDER_PATTERNS: dict[str, tuple[str, ...]] = {
    "features": ("node_feat.npy", "node-feat.npy", "node_features.npy", "features.npy", "feat.npy", "feats.npy"),
    "edge_index": ("edge_index.npy", "edge-index.npy", "edges.npy"),
    "labels": ("node_label*.npy", "node-label*.npy", "labels.npy", "label.npy"),
    "train_idx": ("train_idx.npy", "train.npy"),
    "val_idx": ("val_idx.npy", "valid_idx.npy", "val.npy", "valid.npy"),
    "test_idx": ("test_idx.npy", "test.npy"),
}
_REQUIRED_IN_FOLDER = ("features", "edge_index")


# -- input checks shared by every converter (one type, typed, interactions) -------------

def _is_tensor(x: Any) -> bool:
    return hasattr(x, "detach") and hasattr(x, "cpu") and hasattr(x, "numpy")


def _to_numpy(x: Any) -> np.ndarray:
    """A numpy view of an array-like block (numpy, memmap, CPU or GPU torch tensor, list)."""
    if _is_tensor(x):
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":  # numpy has no bfloat16
            x = x.float()
        return x.numpy()
    return np.asarray(x)


def array_like(x: Any) -> Any:
    """Keeps anything sliceable with a shape (memmap, tensor, h5py); wraps the rest with numpy."""
    return x if hasattr(x, "shape") and hasattr(x, "__getitem__") else np.asarray(x)


def dtype_of(x: Any) -> np.dtype:
    return _to_numpy(x[:0]).dtype


def _check_ids(block: np.ndarray, num_nodes: int, what: str, offset: int, hint: str) -> None:
    if block.size and (block.min() < 0 or block.max() >= num_nodes):
        bad = int(np.flatnonzero((block < 0) | (block >= num_nodes))[0])
        raise ValueError(f"{what} has node id {int(block[bad])} at position {offset + bad}, outside [0, {num_nodes}); "
                         f"{hint}")


def require_integer(dtype: np.dtype, what: str) -> None:
    if not np.issubdtype(dtype, np.integer):
        raise ValueError(f"{what} must hold integer node ids, got dtype {dtype}; convert it with .astype(np.int64)")


def range_hint(num_nodes: int, counted_by: str = "features.shape[0]") -> str:
    return (f"num_nodes={num_nodes} is taken from {counted_by}; pass features for every node "
            "or remap the ids to 0..num_nodes-1")


def converter_progress(enabled: bool, **kw):
    return progress_bar(enabled, unit_scale=True, **kw)


# -- validation of each input -----------------------------------------------------

def stored_feature_dtype(source: np.dtype, requested: Any) -> np.dtype:
    """The stored dtype: ``requested`` if given, else the source's if storable, float32 for other floats."""
    if requested is not None:
        target = np.dtype(requested)
        if target.name not in FEATURE_DTYPES:
            raise ValueError(f"feature_dtype={target} is not supported; use one of {', '.join(FEATURE_DTYPES)}")
        if np.issubdtype(target, np.integer) and not np.issubdtype(source, np.integer) and source != np.bool_:
            raise ValueError(f"features are {source} but feature_dtype={target}: quantize the features yourself "
                             f"(e.g. np.round(x * scale).astype(np.{target})) and pass the integer array")
        return target
    if source.name in FEATURE_DTYPES:
        return source
    if source == np.bool_:
        return np.dtype(np.uint8)
    if np.issubdtype(source, np.floating):
        return np.dtype(np.float32)
    raise ValueError(f"features have dtype {source}, which is not stored as is; pass feature_dtype= one of "
                     f"{', '.join(FEATURE_DTYPES)}")


def write_feature_chunks(write, features: Any, target: np.dtype, bar) -> None:
    """Streams every row of ``features`` to ``write`` as ``target`` in chunks of about ``FEATURE_CHUNK_BYTES``,
    so a memory-mapped input is converted in bounded memory."""
    num_rows, dim = int(features.shape[0]), int(features.shape[1])
    rows_per_chunk = max(1, FEATURE_CHUNK_BYTES // (dim * max(target.itemsize, dtype_of(features).itemsize)))
    for start in range(0, num_rows, rows_per_chunk):
        rows = _to_numpy(features[start:start + rows_per_chunk])
        write(_cast_rows(rows, target, start))
        bar.update(rows.shape[0])


def _cast_rows(rows: np.ndarray, target: np.dtype, start: int) -> np.ndarray:
    if rows.dtype == target:
        return rows
    if np.issubdtype(target, np.integer) and rows.size:
        info = np.iinfo(target)
        if rows.min() < info.min or rows.max() > info.max:
            raise ValueError(f"features in rows {start}..{start + rows.shape[0] - 1} do not fit in {target} "
                             f"([{info.min}, {info.max}]); choose a wider feature_dtype")
    return rows.astype(target)


def check_features(features: Any) -> tuple[Any, int, int]:
    features = array_like(features)
    shape = tuple(features.shape)
    if len(shape) != 2:
        raise ValueError(f"features must be a 2-D array [num_nodes, feature_dim], got shape {shape}; "
                         "reshape it, e.g. features.reshape(num_nodes, -1)")
    if shape[0] == 0 or shape[1] == 0:
        raise ValueError(f"features must have at least one node and one column, got shape {shape}")
    return features, int(shape[0]), int(shape[1])


def check_edge_index(edge_index: Any, num_nodes: int) -> Any:
    edge_index = array_like(edge_index)
    shape = tuple(edge_index.shape)
    if len(shape) != 2 or shape[0] != 2:
        hint = "; it looks like (num_edges, 2): pass edge_index.T" if len(shape) == 2 and shape[1] == 2 else ""
        raise ValueError(f"edge_index must have shape (2, num_edges), sources in row 0 and destinations in row 1 "
                         f"(the PyG layout), got shape {shape}{hint}")
    require_integer(dtype_of(edge_index), "edge_index")
    return edge_index


def num_edges_of(edges: Any) -> int:
    """Edges given as a (2, E) array-like or as a (src, dst) pair of 1-D array-likes."""
    return int(edges[0].shape[0]) if isinstance(edges, tuple) else int(edges.shape[1])


def checked_edge_chunks(edges: Any, bounds: tuple[int, int], names: tuple[str, str], hints: tuple[str, str],
                        bar) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(src, dst) chunks of ``EDGE_CHUNK`` edges of a (2, E) array-like or a (src, dst) pair, every id checked
    against ``bounds`` (sources, destinations); ``names`` and ``hints`` word the errors."""
    for start in range(0, num_edges_of(edges), EDGE_CHUNK):
        if isinstance(edges, tuple):
            src, dst = (_to_numpy(ends[start:start + EDGE_CHUNK]) for ends in edges)
        else:  # one slice of both rows: an (E, 2) file seen as (2, E) is then read once, not once per row
            block = _to_numpy(edges[:, start:start + EDGE_CHUNK])
            src, dst = block[0], block[1]
        for ids, bound, name, hint in zip((src, dst), bounds, names, hints):
            _check_ids(ids, bound, name, start, hint)
        yield src, dst
        bar.update(src.size)


def _check_csr(indptr: Any, indices: Any, num_nodes: int) -> tuple[np.ndarray, Any]:
    if indptr is None or indices is None:
        raise ValueError("CSR topology needs both indptr and indices")
    indptr = _to_numpy(indptr)
    if indptr.shape != (num_nodes + 1,):
        raise ValueError(f"indptr must have num_nodes + 1 = {num_nodes + 1} entries (num_nodes from "
                         f"features.shape[0]), got shape {indptr.shape}")
    require_integer(indptr.dtype, "indptr")
    indices = _to_numpy(indices) if _is_tensor(indices) else array_like(indices)  # the writer slices numpy
    require_integer(dtype_of(indices), "indices")
    if len(indices.shape) != 1 or int(indptr[0]) != 0 or int(indptr[-1]) != int(indices.shape[0]):
        raise ValueError(f"indptr must start at 0 and end at len(indices); got indptr[0]={int(indptr[0])}, "
                         f"indptr[-1]={int(indptr[-1])}, indices shape {tuple(indices.shape)}")
    for start in range(0, num_nodes, VECTOR_CHUNK):
        if np.any(np.diff(indptr[start:start + VECTOR_CHUNK + 1]) < 0):
            raise ValueError("indptr must be non-decreasing (row v spans indices[indptr[v]:indptr[v+1]])")
    for start in range(0, int(indices.shape[0]), EDGE_CHUNK):
        _check_ids(_to_numpy(indices[start:start + EDGE_CHUNK]), num_nodes, "indices", start, range_hint(num_nodes))
    return indptr.astype(np.int64, copy=False), indices


def _csr_edge_chunks(indptr: np.ndarray, indices: Any, bar) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """CSR as (src, dst) chunks (row v lists the sources of edges into v), counted on ``bar``."""
    for src, dst in csr_edge_chunks(indptr, indices):
        yield src, dst
        bar.update(src.size)


def check_labels(labels: Any, num_nodes: int, num_classes: int | None, counted_by: str = "features.shape[0]"
                  ) -> tuple[np.ndarray, int]:
    """int64 labels, -1 for unlabeled. Floats (IGB stores them) must be integral; NaN means unlabeled (OGB)."""
    labels = array_like(labels)
    shape = tuple(labels.shape)
    if shape not in ((num_nodes,), (num_nodes, 1)):
        raise ValueError(f"labels must have one class id per node, shape ({num_nodes},) with num_nodes from "
                         f"{counted_by}, got shape {shape}")
    out = np.empty(num_nodes, dtype=np.int64)
    for start in range(0, num_nodes, VECTOR_CHUNK):
        block = _to_numpy(labels[start:start + VECTOR_CHUNK]).reshape(-1)
        if np.issubdtype(block.dtype, np.floating):
            missing = np.isnan(block)
            finite = np.where(missing, -1, block)
            if not np.all(np.isfinite(finite)) or np.any(finite != np.floor(finite)):
                bad = int(np.flatnonzero(~np.isfinite(finite) | (finite != np.floor(finite)))[0])
                raise ValueError(f"labels must be integral class ids; got {block[bad]} at position {start + bad} "
                                 "(float labels are accepted only when every value is a whole number or NaN)")
            block = finite
        elif not (np.issubdtype(block.dtype, np.integer) or block.dtype == np.bool_):
            raise ValueError(f"labels must be integer class ids, got dtype {block.dtype}")
        out[start:start + block.size] = block
    low = int(out.min())
    if low < -1:
        raise ValueError(f"labels must be class ids >= 0, or -1 for unlabeled nodes; got {low}")
    needed = int(out.max()) + 1
    if num_classes is None:
        num_classes = max(needed, 1)
    elif num_classes < needed:
        raise ValueError(f"num_classes={num_classes} but labels go up to {needed - 1}; pass num_classes >= {needed} "
                         "or leave it out to infer it")
    return out, int(num_classes)


def check_split(name: str, ids: Any, num_nodes: int, counted_by: str = "features.shape[0]") -> np.ndarray:
    """int64 ids from an id array or a boolean mask."""
    what = f"{name}_idx"
    array = _to_numpy(ids)
    if array.dtype == np.bool_:
        if array.shape != (num_nodes,):
            raise ValueError(f"{what} is a boolean mask of shape {array.shape}; a mask must have shape ({num_nodes},)")
        return np.flatnonzero(array).astype(np.int64)
    if array.ndim == 2 and array.shape[1] == 1:
        array = array.reshape(-1)
    if array.ndim != 1:
        raise ValueError(f"{what} must be a 1-D array of node ids or a boolean mask, got shape {array.shape}")
    require_integer(array.dtype, what)
    _check_ids(array, num_nodes, what, 0, range_hint(num_nodes, counted_by))
    return array.astype(np.int64, copy=False)


def check_split_fractions(fractions) -> tuple[float, float, float]:
    """``(train, val, test)`` as floats, each >= 0 and summing to at most 1."""
    fractions = tuple(float(f) for f in fractions)
    if len(fractions) != 3 or min(fractions) < 0 or sum(fractions) > 1 + 1e-9:
        raise ValueError(f"split fractions must be three numbers >= 0 (train, val, test) summing to at most 1, "
                         f"got {fractions}")
    return fractions


def random_split(num_nodes: int, fractions, *, seed: Any = 0, candidates: np.ndarray | None = None
                 ) -> dict[str, np.ndarray]:
    """Seeded random train/val/test split of ``candidates`` (default: all nodes).

    Returns sorted int64 ids per split; fractions may sum to less than 1
    (the rest is in no split). ``seed`` is an int or a tuple of ints.
    """
    fractions = check_split_fractions(fractions)
    rng = np.random.default_rng(seed)
    order = rng.permutation(num_nodes) if candidates is None else rng.permutation(np.asarray(candidates, np.int64))
    total = order.size
    sizes = [int(round(f * total)) for f in fractions]
    sizes[2] = min(sizes[2], total - sizes[0] - sizes[1])
    out, start = {}, 0
    for name, size in zip(SPLITS, sizes):
        if fractions[SPLITS.index(name)] > 0:
            out[name] = np.sort(order[start:start + size]).astype(np.int64)
        start += size
    return out


# -- the typed core: every converter's checks and writes -------------------------------------

@dataclass
class Csr:
    """A relation given as CSR, checked (:func:`_check_csr`): row v of its destination type lists v's sources."""
    indptr: np.ndarray
    indices: Any


@dataclass
class CheckedGraph:
    """What :func:`check_typed` found valid, ready for :func:`write_typed`. ``relations`` hold edges (a (2, E)
    array-like or a (src, dst) pair) or a :class:`Csr`; ``reverses`` map a relation to write to the one
    whose edges it reverses; ``end_names`` and ``count_sources`` word the errors about edge ids."""
    counts: dict[str, int]
    count_sources: dict[str, str]
    features: dict[str, Any]
    stored_dtypes: dict[str, np.dtype]
    relations: dict[Relation, Any]
    reverses: dict[Relation, Relation]
    end_names: Callable[[Relation], tuple[str, str]]
    labels: dict[str, np.ndarray]
    classes: dict[str, int]
    splits: dict[str, dict[str, np.ndarray]]
    scores: tuple[str, ...]
    named: bool  # whether messages name the node type (not where the user gave one type's arrays)

    def about(self, node_type: str):
        """Prefixes errors about ``node_type``'s data with its name, where :attr:`named`."""
        return errors_about(f"node type {node_type!r}") if self.named else nullcontext()

    def specs(self) -> dict[str, dict]:
        """Each type's ``{"num_nodes", "feature_dim", "feature_dtype"}``, as the writers declare types."""
        specs: dict[str, dict] = {t: {"num_nodes": n} for t, n in self.counts.items()}
        for t, dtype in self.stored_dtypes.items():
            specs[t].update(feature_dim=int(self.features[t].shape[1]), feature_dtype=dtype.name)
        return specs

    def num_edges(self, relation: Relation) -> int:
        edges = self.relations[relation]
        return int(edges.indptr[-1]) if isinstance(edges, Csr) else num_edges_of(edges)

    def edge_chunks(self, relation: Relation, bar) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The relation's (src, dst) chunks, counted on ``bar``; an edge list's ids checked against their types
        (a CSR's were checked whole)."""
        edges, (src, _, dst) = self.relations[relation], relation
        if isinstance(edges, Csr):
            return _csr_edge_chunks(edges.indptr, edges.indices, bar)
        return checked_edge_chunks(edges, (self.counts[src], self.counts[dst]), self.end_names(relation),
                                   (range_hint(self.counts[src], self.count_sources[src]),
                                    range_hint(self.counts[dst], self.count_sources[dst])), bar)


def check_typed(*, counts: dict[str, int], count_sources: dict[str, str], features: dict[str, Any],
                feature_dtypes: dict[str, Any], relations: dict[Relation, Any], end_names, labels: dict[str, Any],
                classes: dict[str, int], splits: dict[str, dict[str, Any]], target: str | None,
                random_split_fractions, seed: Any, scores, reverses: dict[Relation, Relation] | None = None,
                named: bool = True, progress: bool = True) -> CheckedGraph:
    """Checks every value of a typed graph whose arguments' forms its converter has checked: the stored
    feature dtypes, labels, splits (a target without any gets ``random_split_fractions`` of its labeled
    nodes, or of all its nodes if it has no labels), score names and edge ids; ``named`` prefixes errors
    with the node type they concern. A single relation's edges are checked as they are written (an error
    removes what the writer wrote); several relations' in one pass first, so a bad one is found before any
    is written."""
    graph = CheckedGraph(counts, count_sources, features, {}, relations, reverses or {}, end_names, {},
                         dict(classes), {}, (), named)
    for t, array in features.items():
        with graph.about(t):
            graph.stored_dtypes[t] = stored_feature_dtype(dtype_of(array), feature_dtypes.get(t))
    for t, values in labels.items():
        with graph.about(t):
            graph.labels[t], graph.classes[t] = check_labels(values, counts[t], graph.classes.get(t),
                                                             count_sources[t])
    for t, per_split in splits.items():
        with graph.about(t):
            graph.splits[t] = {split: check_split(split, ids, counts[t], count_sources[t])
                               for split, ids in per_split.items()}
    if target is not None and not graph.splits.get(target) and random_split_fractions is not None:
        labeled = np.flatnonzero(graph.labels[target] >= 0) if target in graph.labels else None
        graph.splits[target] = random_split(counts[target], random_split_fractions, seed=seed, candidates=labeled)
    graph.scores = check_score_names(scores)
    edge_lists = [r for r, edges in relations.items() if not isinstance(edges, Csr)]
    if len(relations) + len(graph.reverses) > 1:  # last: the one pass over every edge
        with converter_progress(progress, total=sum(graph.num_edges(r) for r in edge_lists),
                                desc="checking edges", unit="edge") as bar:
            for relation in edge_lists:
                with errors_about(f"relation {relation_key(relation)!r}"):
                    for _ in graph.edge_chunks(relation, bar):
                        pass
    return graph


def write_typed(writer: TypedDatasetWriter, graph: CheckedGraph, *, undirected: bool = False, dedup: bool = True,
                self_loops: bool = True, progress: bool = True) -> None:
    """Writes a checked graph through the typed methods of ``writer`` (a schema's writer, whose one-type
    shorthands wrap them): features, each relation (a CSR as given unless ``undirected`` or ``self_loops=False``
    sends it through the edge sort), reverses, labels and splits; scores and the commit are the caller's."""
    for t, array in graph.features.items():
        with graph.about(t), converter_progress(progress, total=graph.counts[t], unit="node",
                                                desc=f"features {t}" if graph.named else "features") as bar:
            write_feature_chunks(lambda rows, t=t: writer.write_type_features(t, rows), array,
                                 graph.stored_dtypes[t], bar)
    sort = undirected or not self_loops  # else a CSR is stored as given
    options = {"undirected": undirected, "dedup": dedup, "self_loops": self_loops}
    sorted_ = [r for r in [*graph.relations, *graph.reverses.values()]
               if sort or not isinstance(graph.relations[r], Csr)]
    with converter_progress(progress and bool(sorted_), total=sum(graph.num_edges(r) for r in sorted_),
                            desc="edges", unit="edge") as bar:
        for relation, edges in graph.relations.items():
            if isinstance(edges, Csr) and not sort:
                writer.write_relation_csr(relation, edges.indptr, edges.indices)
            else:
                writer.write_relation_edges(relation, graph.edge_chunks(relation, bar), **options)
        for reverse, forward in graph.reverses.items():
            chunks = ((dst, src) for src, dst in graph.edge_chunks(forward, bar))
            writer.write_relation_edges(reverse, chunks, **options)
    for t, values in graph.labels.items():
        writer.write_type_labels(t, values, graph.classes[t])
    graph.labels.clear()  # the largest per-node arrays, not needed by the scores
    for t, per_split in graph.splits.items():
        for split, ids in per_split.items():
            writer.write_type_split(t, split, ids)


# -- one node type and one relation --------------------------------------------------------

_ONE_TYPE_ENDS = ("edge_index[0] (sources)", "edge_index[1] (destinations)")


def from_numpy(path, *, features, edge_index=None, indptr=None, indices=None, labels=None,
               num_classes: int | None = None, train_idx=None, val_idx=None, test_idx=None, undirected: bool = False,
               dedup: bool = True, self_loops: bool = True, feature_dtype=None, random_split_fractions=None,
               seed: int = 0, scores=SCORE_NAMES, name: str | None = None, overwrite: bool = False,
               progress: bool = True, extra_meta: dict | None = None) -> Dataset:
    """Writes a dataset from array-likes (numpy, ``np.memmap``, torch tensors) and returns it opened.

    Topology is either ``edge_index`` of shape ``(2, E)`` (row 0 sources, row
    1 destinations, as in PyG) or CSR ``indptr``/``indices`` in the dataset's
    orientation (row v lists the nodes v aggregates from). ``undirected`` adds
    every reverse edge; ``dedup`` (default) keeps one of parallel edges;
    ``self_loops=False`` drops edges v -> v (kept by default). A CSR is stored
    exactly as given unless ``undirected`` or ``self_loops=False`` sends it
    through the same edge sort as an edge list (``dedup`` then applies). Splits take id arrays
    or boolean masks; with none given, ``random_split_fractions=(train, val,
    test)`` draws a seeded split of the labeled nodes. ``scores`` names the
    static scores to compute (``()`` for none).
    ``overwrite`` replaces an lsm-gnn dataset at ``path``, never anything else (see :class:`DatasetWriter`).

    The typed core (:func:`check_typed`, :func:`write_typed`) with the arrays as the one node type and the
    one relation, written in the one-type schema (:class:`DatasetWriter`).
    """
    features, num_nodes, dim = check_features(features)
    if (edge_index is None) == (indptr is None and indices is None):
        raise ValueError("pass the topology once: either edge_index=(2, E) or indptr= and indices= (CSR)")
    if edge_index is not None:
        topology = check_edge_index(edge_index, num_nodes)
    else:
        topology = Csr(*_check_csr(indptr, indices, num_nodes))
    if labels is None and num_classes is not None:
        raise ValueError("num_classes was given without labels; pass labels= too")
    one = ONE_TYPE
    graph = check_typed(
        counts={one: num_nodes}, count_sources={one: "features.shape[0]"}, features={one: features},
        feature_dtypes={one: feature_dtype}, relations={ONE_RELATION: topology}, end_names=lambda r: _ONE_TYPE_ENDS,
        labels={} if labels is None else {one: labels}, classes={} if num_classes is None else {one: num_classes},
        splits={one: {split: ids for split, ids in zip(SPLITS, (train_idx, val_idx, test_idx)) if ids is not None}},
        target=one, random_split_fractions=random_split_fractions, seed=seed, scores=scores,
        named=False, progress=progress)

    meta = dict(extra_meta or {})
    meta["converted"] = {"undirected": bool(undirected), "dedup": bool(dedup), "self_loops": bool(self_loops),
                         "source_feature_dtype": dtype_of(features).name, **meta.get("converted", {})}
    with DatasetWriter(path, num_nodes=num_nodes, feature_dim=dim, feature_dtype=graph.stored_dtypes[one].name,
                       name=name, overwrite=overwrite, extra_meta=meta, scores=graph.scores) as writer:
        write_typed(writer, graph, undirected=undirected, dedup=dedup, self_loops=self_loops, progress=progress)
        return writer.commit()


# -- files and folders ------------------------------------------------------------------

def _is_path(value: Any) -> bool:
    return isinstance(value, (str, bytes, os.PathLike))


def open_npy(file_path: Any, what: str) -> Any:
    """A .npy file opened memory-mapped; an array-like given instead of a path passes through."""
    if not _is_path(file_path):
        return file_path
    file_path = os.fsdecode(file_path)
    if os.path.isdir(file_path):
        raise ValueError(f"{what}: {file_path} is a directory; give the .npy file in it")
    if not os.path.isfile(file_path):
        raise FileNotFoundError(f"{what}: no such file {file_path}")
    if not file_path.endswith(".npy"):
        raise ValueError(f"{what}: {file_path} is not a .npy file; save the array with np.save(path, array)")
    try:
        return np.load(file_path, mmap_mode="r")
    except ValueError as exc:
        if "Python objects" not in str(exc):
            raise
        # numpy's own "Array can't be memory-mapped" names neither the file nor the dtype it needs
        raise ValueError(f"{what}: {file_path} holds Python objects (dtype object), which cannot be read "
                         "memory-mapped; save it with a numeric dtype: integers for ids, labels and edges "
                         "(array.astype(np.int64)), floats for features (array.astype(np.float32))") from None


#: an edge file's ``layout``: which axis of the array runs over the edges
EDGE_LAYOUTS = {"rows": "(2, E): row 0 the src ids, row 1 the dst ids",
                "pairs": "(E, 2): one (src, dst) pair a row"}


def edges_in_layout(pairs: np.ndarray, layout: str | None, where: str, option: str = "layout") -> np.ndarray:
    """An edge file's array as (2, E). The shape tells the layout (``rows`` or ``pairs``, :data:`EDGE_LAYOUTS`)
    unless it is 2 x 2 (two edges), which either reading fits: there ``layout`` must say, as a wrong guess would
    swap two edges' ends silently; a layout the shape contradicts is refused."""
    if layout is not None and layout not in EDGE_LAYOUTS:
        raise ValueError(f"{where}: {option} must be rows or pairs, got {layout!r}")
    if pairs.ndim != 2 or 2 not in pairs.shape:
        raise ValueError(f"{where}: must be a (2, E) or (E, 2) array of (src, dst) ids, got shape {pairs.shape}")
    fits = [name for name, axis in (("rows", 0), ("pairs", 1)) if pairs.shape[axis] == 2]
    if layout is None and len(fits) > 1:
        raise ValueError(f"{where}: shape {pairs.shape} reads either way; say which with {option} rows for "
                         f"{EDGE_LAYOUTS['rows']}, or {option} pairs for {EDGE_LAYOUTS['pairs']}")
    layout = layout or fits[0]
    if layout not in fits:
        raise ValueError(f"{where}: {option} {layout} means {EDGE_LAYOUTS[layout]}, but the array's shape is "
                         f"{pairs.shape}; fix the {option} or the file")
    return pairs if layout == "rows" else pairs.T


def from_npy_files(path, *, features: str, edge_index: str | None = None, indptr: str | None = None,
                   indices: str | None = None, labels: str | None = None, train_idx: str | None = None,
                   val_idx: str | None = None, test_idx: str | None = None, edge_layout: str | None = None,
                   **kw) -> Dataset:
    """:func:`from_numpy` over ``.npy`` files, opened memory-mapped (an array may stand in for
    any file). A file's ``edge_index`` may be (2, E) or (E, 2); ``edge_layout`` (``rows`` or ``pairs``) says
    which where the shape cannot (:func:`edges_in_layout`)."""
    files = {"features": features, "edge_index": edge_index, "indptr": indptr, "indices": indices,
             "labels": labels, "train_idx": train_idx, "val_idx": val_idx, "test_idx": test_idx}
    arrays = {key: open_npy(value, key) for key, value in files.items() if value is not None}
    if _is_path(edge_index):
        arrays["edge_index"] = edges_in_layout(arrays["edge_index"], edge_layout, f"edge_index {edge_index}",
                                               "edge_layout (--edge-layout)")
    extra = kw.pop("extra_meta", None) or {}
    extra.setdefault("converted", {})["files"] = {k: os.path.abspath(os.fsdecode(v)) for k, v in files.items()
                                                  if _is_path(v)}
    return from_numpy(path, **arrays, extra_meta=extra, **kw)


def find_folder_files(folder: str) -> dict[str, list[str]]:
    """Every file under ``folder`` (recursively, hidden folders skipped) matching a role in
    :data:`FOLDER_PATTERNS`; paths relative to ``folder``, sorted."""
    found: dict[str, list[str]] = {role: [] for role in FOLDER_PATTERNS}
    for root, dirs, files in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for file_name in sorted(files):
            for role, patterns in FOLDER_PATTERNS.items():
                if any(fnmatch.fnmatch(file_name.lower(), p) for p in patterns):
                    found[role].append(os.path.relpath(os.path.join(root, file_name), folder))
                    break
    return found


def from_folder(path, folder, *, features: str | None = None, edge_index: str | None = None,
                labels: str | None = None, train_idx: str | None = None, val_idx: str | None = None,
                test_idx: str | None = None, **kw) -> Dataset:
    """Converts an OGB/IGB-style folder of ``.npy`` files (see :data:`FOLDER_PATTERNS`).

    Files are found recursively (IGB keeps them in ``processed/paper/`` and
    ``processed/paper__cites__paper/``). A role given explicitly (a path
    relative to ``folder``, or an array) overrides the search; a role matched by several
    files must be given explicitly. Other keywords go to :func:`from_npy_files` (``edge_layout``) and
    :func:`from_numpy`.
    """
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise ValueError(f"{folder} is not a directory; pass the folder that holds the dataset's .npy files")
    explicit = {"features": features, "edge_index": edge_index, "labels": labels, "train_idx": train_idx,
                "val_idx": val_idx, "test_idx": test_idx}
    found = find_folder_files(folder)
    chosen: dict[str, str] = {}
    for role, patterns in FOLDER_PATTERNS.items():
        if explicit[role] is not None:  # a path inside folder, or an array (e.g. splits IGB does not ship)
            chosen[role] = os.path.join(folder, explicit[role]) if _is_path(explicit[role]) else explicit[role]
        elif len(found[role]) == 1:
            chosen[role] = os.path.join(folder, found[role][0])
        elif len(found[role]) > 1:
            raise ValueError(f"{folder}: several files could be the {role}: {', '.join(found[role])}; "
                             f"pass {role}='<one of them>' (CLI: --{role.replace('_', '-')}) to choose")
        elif role in _REQUIRED_IN_FOLDER:
            all_npy = sorted(p for files in found.values() for p in files)
            raise ValueError(f"{folder}: unknown layout, found no {role} file; looked recursively for "
                             f"{', '.join(patterns)} (recognised files found: {', '.join(all_npy) or 'none'}). "
                             f"Rename the file or pass {role}='relative/path.npy'")
    extra = kw.pop("extra_meta", None) or {}
    extra.setdefault("converted", {})["folder"] = os.path.abspath(folder)
    return from_npy_files(path, **chosen, extra_meta=extra, **kw)


# -- graph libraries -------------------------------------------------------------------

def first_attr(obj: Any, *names: str) -> Any:
    for attr in names:
        value = getattr(obj, attr, None)
        if value is not None:
            return value
    return None


_SPLIT_PREFIXES = {"train": ("train",), "val": ("val", "valid"), "test": ("test",)}


def pyg_splits(store: Any) -> dict[str, Any]:
    """Each split's ``<split>_mask`` (or ``<split>_idx``; ``valid`` for ``val``) of a PyG data object or node
    store, None where it has none."""
    return {split: first_attr(store, *[f"{p}_mask" for p in names], *[f"{p}_idx" for p in names])
            for split, names in _SPLIT_PREFIXES.items()}


def dgl_splits(ndata: Any) -> dict[str, Any]:
    """Each split's ``<split>_mask`` (``valid_mask`` for ``val``) of DGL node data, None where it has none."""
    return {split: next((ndata[f"{p}_mask"] for p in names if f"{p}_mask" in ndata), None)
            for split, names in _SPLIT_PREFIXES.items()}


def from_pyg(path, data, **kw) -> Dataset:
    """Converts a homogeneous torch_geometric ``Data``: ``x``, ``edge_index``, ``y`` and
    ``train_mask``/``val_mask``/``test_mask`` (or ``*_idx``). Keywords override what ``data`` holds."""
    try:
        from torch_geometric.data import HeteroData
    except ImportError:  # a Data-like object without PyG installed still converts
        HeteroData = ()
    if HeteroData and isinstance(data, HeteroData):
        raise ValueError("from_pyg needs a homogeneous Data; convert with data.to_homogeneous() first")
    args: dict[str, Any] = {"features": first_attr(data, "x"), "edge_index": first_attr(data, "edge_index"),
                            "labels": first_attr(data, "y")}
    if args["features"] is None:
        raise ValueError("data.x is missing: from_pyg needs node features [num_nodes, feature_dim] in data.x")
    if args["edge_index"] is None:
        raise ValueError("data.edge_index is missing: from_pyg needs the edges as data.edge_index (2, E)")
    for split, ids in pyg_splits(data).items():
        args[f"{split}_idx"] = ids
    args.update(kw)
    extra = args.pop("extra_meta", None) or {}
    extra.setdefault("converted", {})["from"] = "pyg"
    return from_numpy(path, extra_meta=extra, **args)


def from_dgl(path, graph, feat_key: str = "feat", label_key: str = "label", **kw) -> Dataset:
    """Converts a homogeneous DGL graph: ``ndata[feat_key]``, ``ndata[label_key]``, edges
    (src -> dst) and ``ndata['train_mask'|'val_mask'|'test_mask']``. Keywords override these."""
    if len(graph.ntypes) != 1 or len(graph.canonical_etypes) != 1:
        raise ValueError(f"from_dgl needs a homogeneous graph, got node types {graph.ntypes} and edge types "
                         f"{graph.canonical_etypes}; convert with dgl.to_homogeneous(graph) first")
    ndata = graph.ndata
    if feat_key not in ndata:
        raise ValueError(f"graph.ndata has no {feat_key!r}; its keys are {sorted(ndata.keys())}: pass feat_key=")
    src, dst = graph.edges(order="eid")
    args: dict[str, Any] = {
        "features": ndata[feat_key],
        "edge_index": np.stack([_to_numpy(src).astype(np.int64), _to_numpy(dst).astype(np.int64)]),
        "labels": ndata[label_key] if label_key in ndata else None,
    }
    for split, mask in dgl_splits(ndata).items():
        args[f"{split}_idx"] = mask
    args.update(kw)
    extra = args.pop("extra_meta", None) or {}
    extra.setdefault("converted", {})["from"] = "dgl"
    return from_numpy(path, extra_meta=extra, **args)
