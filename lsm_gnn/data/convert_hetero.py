"""Converters into heterogeneous (schema-2) datasets: numpy arrays, PyG ``HeteroData``, DGL heterographs and
IGBH folders.

Every converter ends in :func:`hetero_from_numpy`, which checks the form of
its per-type arguments and hands them to the typed core that
:func:`~lsm_gnn.data.convert.from_numpy` uses too
(:func:`~lsm_gnn.data.convert.check_typed`, then
:func:`~lsm_gnn.data.convert.write_typed` into a
:class:`~lsm_gnn.data.hetero_writer.HeteroDatasetWriter`): every input is
validated first (each error names its node type or relation), then
streamed in bounded memory, so inputs opened with
``np.load(mmap_mode="r")`` convert whatever their size.

A relation ``(src, name, dst)`` follows PyG's edge-type convention: its
edges are (src id, dst id) pairs, messages flow from ``src`` to ``dst``, and
dst's CSR row lists its src neighbors. ``add_reverse=True`` adds
``(dst, "rev_" + name, src)`` for every relation without a reverse, the
names PyG's ``ToUndirected`` gives (a same-type relation gets its own
``rev_`` relation, as with ``ToUndirected(merge=False)``); the reverse of a
``rev_<r>`` relation is ``(dst, r, src)``, so either of a pair given counts.
"""
from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np

from lsm_gnn.data.convert import (
    FOLDER_PATTERNS, array_like, check_edge_index, check_features, check_typed, dgl_splits, dtype_of,
    edges_in_layout, first_attr, open_npy, pyg_splits, require_integer, write_typed,
)
from lsm_gnn.data.format import SPLITS
from lsm_gnn.data.dataset import Dataset, Relation, parse_relation, relation_key
from lsm_gnn.data.hetero import check_name
from lsm_gnn.data.hetero_writer import HeteroDatasetWriter, hetero_scores
from lsm_gnn.data.writer import errors_about
from lsm_gnn.data.scores import SCORE_NAMES

REVERSE_PREFIX = "rev_"     # PyG's ToUndirected names the reverse of relation r "rev_r"
IGB_EMBEDDING_DIM = 1024    # width of IGB's headerless feature files (sizes large and full)
_NPY_MAGIC = b"\x93NUMPY"
_SPLIT_ALIASES = {"valid": "val"}  # OGB's name


def _typed(value: Any, node_types: list[str], what: str) -> dict[str, Any]:
    """A per-type argument as a dict, None as empty; a key that is not a node type is refused."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{what} must map node type names to values, got {type(value).__name__}")
    unknown = [t for t in value if t not in node_types]
    if unknown:
        raise ValueError(f"{what} names node type(s) {', '.join(map(repr, unknown))}, which are not node types "
                         f"({', '.join(node_types)}); give their features or num_nodes")
    return value


def reverse_relation(relation: Relation) -> Relation:
    """``(dst, "rev_" + name, src)``; the reverse of a ``rev_<r>`` relation is ``(dst, r, src)``."""
    src, name, dst = relation
    stripped = name[len(REVERSE_PREFIX):]
    if name.startswith(REVERSE_PREFIX) and stripped[:1].isalnum():
        return dst, stripped, src
    return dst, REVERSE_PREFIX + name, src


def missing_reverses(relations: list[Relation]) -> dict[Relation, Relation]:
    """``{reverse: relation}`` for each relation whose :func:`reverse_relation` is not among ``relations``."""
    present = set(relations)
    return {reverse_relation(r): r for r in relations if reverse_relation(r) not in present}


def _relation_edges(value: Any) -> Any:
    """Edges of one relation as a (2, E) array-like or a (src, dst) pair of equally long 1-D id arrays."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"edges must be a (src, dst) pair or a (2, num_edges) array, got a sequence of "
                             f"{len(value)}")
        src, dst = (array_like(v) for v in value)
        shapes = tuple(src.shape), tuple(dst.shape)
        if len(shapes[0]) != 1 or shapes[0] != shapes[1]:
            raise ValueError(f"(src, dst) must be two 1-D id arrays of one length, got shapes {shapes[0]} and "
                             f"{shapes[1]}")
        for ends, role in ((src, "src"), (dst, "dst")):
            require_integer(dtype_of(ends), role)
        return src, dst
    return check_edge_index(value, 0)


def _count_source(name: str, features: Any) -> str:
    return f"features[{name!r}].shape[0]" if features is not None else f"num_nodes[{name!r}]"


def _node_types(features: dict, num_nodes: dict) -> tuple[list[str], dict[str, int], dict[str, Any]]:
    """Node types (features' order, then num_nodes' others), their counts and their checked feature arrays."""
    if not isinstance(features, dict):
        raise ValueError(f"features must map node type names to arrays (or None), got {type(features).__name__}")
    if num_nodes is not None and not isinstance(num_nodes, dict):
        raise ValueError(f"num_nodes must map node type names to counts, got {type(num_nodes).__name__}")
    num_nodes = num_nodes or {}
    names = list(features) + [t for t in num_nodes if t not in features]
    if not names:
        raise ValueError("no node types: give features={type: array or None} and/or num_nodes={type: count}")
    counts, arrays = {}, {}
    for name in names:
        check_name(name, "node type")
        with errors_about(f"node type {name!r}"):
            given = num_nodes.get(name)
            if given is not None and (isinstance(given, bool) or not isinstance(given, (int, np.integer))
                                      or given <= 0):
                raise ValueError(f"num_nodes must be a positive integer, got {given!r}")
            if features.get(name) is not None:
                arrays[name], rows, _ = check_features(features[name])
                if given is not None and given != rows:
                    raise ValueError(f"features have {rows} rows but num_nodes[{name!r}]={given}; give one "
                                     "feature row per node")
                counts[name] = rows
            elif given is None:
                raise ValueError(f"it has neither features nor a node count; pass num_nodes={{{name!r}: n}}")
            else:
                counts[name] = int(given)
    return names, counts, arrays


def _default_target(target: str | None, labeled: list[str], where: str) -> str | None:
    """The node type to classify: ``target``, else the only type with labels."""
    if target is not None:
        return target
    if len(labeled) > 1:
        raise ValueError(f"several node types have labels ({', '.join(labeled)}) in {where}; pass target= to name "
                         "the one to classify")
    return labeled[0] if labeled else None


# -- the core converter ------------------------------------------------------------

def hetero_from_numpy(path, *, features: dict, edges: dict, num_nodes: dict | None = None, labels: dict | None = None,
                      num_classes: int | dict | None = None, splits: dict | None = None, target: str | None = None,
                      random_split_fractions=None, seed: int = 0, scores=SCORE_NAMES, feature_dtype=None,
                      add_reverse: bool = False, dedup: bool = True, name: str | None = None,
                      overwrite: bool = False, progress: bool = True, extra_meta: dict | None = None
                      ) -> Dataset:
    """Writes a heterogeneous dataset from array-likes (numpy, ``np.memmap``, torch tensors); returns it opened.

    ``features`` maps each node type to its ``[num_nodes, dim]`` rows or None
    (a featureless type, whose count then comes from ``num_nodes``); the
    types' order is the global id order (``features``' keys, then other keys
    of ``num_nodes``). ``edges`` maps each relation, ``(src, name, dst)`` or
    ``"src__name__dst"``, to its edges as a ``(src ids, dst ids)`` pair or a
    ``(2, E)`` array (row 0 src); ids are local to their type. ``labels``
    and ``splits`` (``{type: {"train"|"val"|"test": ids or boolean mask}}``)
    may be given for any type; ``num_classes`` is an int for the target or a
    ``{type: n}`` dict. ``target`` defaults to the only labeled type; with
    ``random_split_fractions=(train, val, test)`` a target without splits
    gets a seeded split of its labeled nodes. ``feature_dtype`` is one dtype
    or ``{type: dtype}``. ``add_reverse`` adds ``(dst, "rev_" + name, src)``
    for every relation lacking a reverse; ``dedup`` drops parallel edges.
    ``scores`` are computed per type on the union of all relations
    (:func:`hetero_scores`). ``overwrite`` replaces only an lsm-gnn dataset.
    """
    names, counts, arrays = _node_types(features, num_nodes)
    if isinstance(feature_dtype, dict):
        requested = _typed(feature_dtype, names, "feature_dtype")
    else:
        requested = {t: feature_dtype for t in arrays}
    relations = _parse_relations(edges, names, counts)
    reverses = missing_reverses(list(relations)) if add_reverse else {}
    labels = _typed(labels, names, "labels")
    target = _default_target(target, list(labels), "labels")
    if target is not None and target not in names:
        raise ValueError(f"target type {target!r} is not a node type ({', '.join(names)})")
    if target is not None and target not in labels:
        raise ValueError(f"target type {target!r} has no labels; pass labels={{{target!r}: ...}} or another target")
    graph = check_typed(
        counts=counts, count_sources={t: _count_source(t, arrays.get(t)) for t in names}, features=arrays,
        feature_dtypes=requested, relations=relations, reverses=reverses,
        end_names=lambda r: (f"src ({r[0]})", f"dst ({r[2]})"), labels=labels,
        classes=_classes_per_type(num_classes, target, labels, names),
        splits=_split_names(_typed(splits, names, "splits")), target=target,
        random_split_fractions=random_split_fractions, seed=seed, scores=scores, progress=progress)

    meta = dict(extra_meta or {})
    meta["converted"] = {"dedup": bool(dedup), "reverse_relations": [relation_key(r) for r in reverses],
                         "source_feature_dtypes": {t: dtype_of(a).name for t, a in arrays.items()},
                         **meta.get("converted", {})}
    with HeteroDatasetWriter(path, node_types=graph.specs(), target=target, name=name, overwrite=overwrite,
                             extra_meta=meta) as writer:
        write_typed(writer, graph, dedup=dedup, progress=progress)
        if graph.scores:
            writer.write_union_scores(graph.scores, progress=progress)
        return writer.commit()


def _parse_relations(edges: dict, names: list[str], counts: dict[str, int]) -> dict[Relation, Any]:
    """Each relation's edges as a (2, E) array-like or a (src, dst) pair, its types known."""
    if not isinstance(edges, dict):
        raise ValueError(f"edges must map relations (src, name, dst) to their edges, got {type(edges).__name__}")
    relations: dict[Relation, Any] = {}
    for key, value in edges.items():
        relation = parse_relation(key)
        label = f"relation {relation_key(relation)!r}"
        with errors_about(label):
            for role, t in (("source", relation[0]), ("destination", relation[2])):
                if t not in counts:
                    raise ValueError(f"its {role} type {t!r} is not a node type ({', '.join(names)}); give its "
                                     f"features or num_nodes={{{t!r}: n}}")
            check_name(relation[1], "relation name")
            if relation in relations:
                raise ValueError("it is given twice (as a tuple and as a 'src__name__dst' key)")
            relations[relation] = _relation_edges(value)
    return relations


def _classes_per_type(num_classes: int | dict | None, target: str | None, labels: dict, names: list[str]
                      ) -> dict[str, int]:
    if num_classes is None:
        return {}
    if isinstance(num_classes, dict):
        per_type = dict(_typed(num_classes, names, "num_classes"))
    elif target is None:
        raise ValueError("num_classes was given without labels; pass labels= too (num_classes as an int "
                         "applies to the target type)")
    else:
        per_type = {target: num_classes}
    for t in per_type:
        if t not in labels:
            raise ValueError(f"num_classes is given for node type {t!r}, which has no labels")
    return per_type


def _split_names(splits: dict) -> dict[str, dict[str, Any]]:
    """Each type's splits under their names (OGB's ``valid`` as ``val``), None values left out."""
    out: dict[str, dict[str, Any]] = {}
    for t, per_split in splits.items():
        with errors_about(f"node type {t!r}"):
            if not isinstance(per_split, dict):
                raise ValueError(f"splits must map split names ({', '.join(SPLITS)}) to ids or masks, got "
                                 f"{type(per_split).__name__}")
            out[t] = {}
            for split, ids in per_split.items():
                split = _SPLIT_ALIASES.get(split, split)
                if split not in SPLITS:
                    raise ValueError(f"unknown split {split!r}; splits are {', '.join(SPLITS)}")
                if ids is not None:
                    out[t][split] = ids
    return out


# -- graph libraries ----------------------------------------------------------------------

def _convert(path, args: dict, kw: dict, **converted) -> Dataset:
    """:func:`hetero_from_numpy` over what a source held (``args``), overridden by the caller's keywords;
    ``converted`` is recorded in meta.json."""
    args.update(kw)
    extra = args.pop("extra_meta", None) or {}
    extra.setdefault("converted", {}).update(converted)
    return hetero_from_numpy(path, extra_meta=extra, **args)


def hetero_from_pyg(path, data, *, target: str | None = None, **kw) -> Dataset:
    """Converts a torch_geometric ``HeteroData``: per node type ``x`` (a type without one is featureless),
    ``num_nodes``, ``y`` and ``train_mask``/``val_mask``/``test_mask`` (or ``*_idx``); per edge type its
    ``edge_index``. ``target`` defaults to the only type with ``y``. Keywords go to :func:`hetero_from_numpy`
    and override what ``data`` holds."""
    if not hasattr(data, "node_types") or not hasattr(data, "edge_types"):
        raise ValueError(f"hetero_from_pyg needs a torch_geometric HeteroData, got {type(data).__name__}; "
                         "convert a homogeneous Data with lsm_gnn.data.convert.from_pyg")
    features, num_nodes, labels, splits = {}, {}, {}, {}
    for t in data.node_types:
        store = data[t]
        features[t] = first_attr(store, "x")
        with warnings.catch_warnings():  # PyG warns when it cannot infer a count; we say so below
            warnings.simplefilter("ignore")
            count = store.num_nodes
        if count is None:
            raise ValueError(f"node type {t!r} has no x and no num_nodes; set data[{t!r}].num_nodes")
        num_nodes[t] = int(count)
        if first_attr(store, "y") is not None:
            labels[t] = store.y
        per_split = {split: ids for split, ids in pyg_splits(store).items() if ids is not None}
        if per_split:
            splits[t] = per_split
    target = _default_target(target, list(labels), "data (y)")
    edges = {relation: data[relation].edge_index for relation in data.edge_types if "edge_index" in data[relation]}
    args = {"features": features, "num_nodes": num_nodes, "edges": edges, "labels": labels, "splits": splits,
            "target": target}
    return _convert(path, args, kw, **{"from": "pyg"})


def hetero_from_dgl(path, graph, *, target: str | None = None, feature_key: str = "feat", label_key: str = "label",
                    **kw) -> Dataset:
    """Converts a DGL heterograph: per node type ``nodes[t].data[feature_key]`` (a type without it is
    featureless), ``[label_key]`` and ``train_mask``/``val_mask``/``test_mask``; per canonical edge type its
    edges (src -> dst). ``target`` defaults to the only type with labels. Keywords go to
    :func:`hetero_from_numpy` and override what ``graph`` holds."""
    features, num_nodes, labels, splits = {}, {}, {}, {}
    for t in graph.ntypes:
        data = graph.nodes[t].data
        features[t] = data[feature_key] if feature_key in data else None
        num_nodes[t] = int(graph.num_nodes(t))
        if label_key in data:
            labels[t] = data[label_key]
        per_split = {split: mask for split, mask in dgl_splits(data).items() if mask is not None}
        if per_split:
            splits[t] = per_split
    edges = {}
    for relation in graph.canonical_etypes:
        src, dst = graph.edges(etype=relation, order="eid")
        edges[relation] = (src, dst)
    target = _default_target(target, list(labels), f"nodes[...].data[{label_key!r}]")
    args = {"features": features, "num_nodes": num_nodes, "edges": edges, "labels": labels, "splits": splits,
            "target": target}
    return _convert(path, args, kw, **{"from": "dgl"})


# -- IGBH folders ---------------------------------------------------------------------------

def _open_igb_array(file_path: str, row_dim: int | None) -> np.ndarray:
    """A .npy file memory-mapped; a headerless file (IGB's large and full sizes store paper and author
    features and labels so) as float32 rows of ``row_dim`` values (None: a vector)."""
    with open(file_path, "rb") as f:
        magic = f.read(len(_NPY_MAGIC))
    if magic == _NPY_MAGIC:
        return np.load(file_path, mmap_mode="r")
    size, row_bytes = os.path.getsize(file_path), 4 * (row_dim or 1)
    if size == 0 or size % row_bytes:
        layout = f"float32 rows of {row_dim} values" if row_dim else "float32 values"
        raise ValueError(f"{file_path} is neither a .npy file nor headerless {layout} ({size} bytes); "
                         "pass raw_feature_dim= for other widths")
    shape = (size // row_bytes, row_dim) if row_dim else (size // 4,)
    return np.memmap(file_path, dtype=np.float32, mode="r", shape=shape)


def _igbh_folder(root: str, size: str | None) -> str:
    """The ``processed`` folder: ``<root>/<size>/processed``; without ``size``, ``root`` itself, its
    ``processed/`` or its only ``<size>/processed``."""
    if not os.path.isdir(root):
        raise ValueError(f"{root} is not a directory; pass the IGBH root (holding <size>/processed/)")
    sizes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d, "processed")))
    if size is not None:
        folder = os.path.join(root, size, "processed")
        if not os.path.isdir(folder):
            raise ValueError(f"{root} has no {size}/processed folder; sizes found: {', '.join(sizes) or 'none'}")
        return folder
    if os.path.isdir(os.path.join(root, "processed")):
        return os.path.join(root, "processed")
    if any(os.path.isfile(os.path.join(root, d, "node_feat.npy")) for d in os.listdir(root)):
        return root
    if len(sizes) == 1:
        return os.path.join(root, sizes[0], "processed")
    raise ValueError(f"{root}: pass size= to choose the dataset size; found {', '.join(sizes) or 'none'} "
                     "(an IGBH root holds <size>/processed/<type>/node_feat.npy)")


def _label_file(files: list[str], label_file: str | None, num_classes: int | None, where: str) -> str:
    """``label_file`` if given; else the file of ``num_classes`` (IGB: node_label_19.npy, node_label_2K.npy for
    2983 classes); else the first in sorted order."""
    if label_file is not None:
        if label_file not in files:
            raise ValueError(f"{where} has no {label_file}; its label files are {', '.join(files) or 'none'}")
        return label_file
    if num_classes is not None:
        names = [f"node_label_{num_classes}.npy"] + [f"node_label_{num_classes // 1000}K.npy"] * (num_classes >= 1000)
        for file_name in names:
            if file_name in files:
                return file_name
        raise ValueError(f"{where} has no label file for num_classes={num_classes} ({' or '.join(names)}); its "
                         f"label files are {', '.join(files)}: pass label_file=")
    return files[0]


def _split_files(folder: str) -> dict[str, str]:
    found = {}
    for split in SPLITS:
        matches = [f for f in FOLDER_PATTERNS[f"{split}_idx"] if os.path.isfile(os.path.join(folder, f))]
        if len(matches) > 1:
            raise ValueError(f"{folder}: several files could be the {split} split: {', '.join(matches)}; "
                             "keep one")
        if matches:
            found[split] = os.path.join(folder, matches[0])
    return found


def hetero_from_igbh(path, root, *, size: str | None = None, target: str | None = None, label_file: str | None = None,
                     num_classes: int | None = None, num_nodes: dict | None = None,
                     split_fractions=(0.6, 0.2, 0.2), seed: int = 0, add_reverse: bool = True,
                     raw_feature_dim: int = IGB_EMBEDDING_DIM, **kw) -> Dataset:
    """Converts an IGBH folder as the IGB repository lays it out, every file memory-mapped.

    Reads ``<root>/<size>/processed/``: each node type is a subfolder with
    ``node_feat.npy`` (or only ``node_label_*.npy``, or a count in
    ``num_nodes``); each relation a ``src__name__dst`` subfolder with
    ``edge_index.npy`` of (src, dst) rows, shape (E, 2) or (2, E). The target
    (default: the only type with ``node_label_*.npy``) takes its labels from
    ``label_file``, else the file of ``num_classes`` (``node_label_19.npy``,
    ``node_label_2K.npy`` for 2983), else the first sorted; its splits from
    ``train_idx.npy``/``val_idx.npy``/``test_idx.npy`` beside them, else a
    seeded random split of its labeled nodes by ``split_fractions``. IGB's
    headerless feature and label files (sizes large and full) are read as
    float32 (``raw_feature_dim`` columns). Reverse relations are added by
    default, as IGB's baselines use them. Other keywords go to
    :func:`hetero_from_numpy`.
    """
    root = os.fspath(root)
    folder = _igbh_folder(root, size)
    subfolders = sorted(d for d in os.listdir(folder)
                        if not d.startswith(".") and os.path.isdir(os.path.join(folder, d)))
    label_files, features, edges = {}, {}, {}
    for sub in subfolders:
        sub_path = os.path.join(folder, sub)
        files = sorted(os.listdir(sub_path))
        if "__" in sub:
            if "edge_index.npy" in files:
                edge_index = np.load(os.path.join(sub_path, "edge_index.npy"), mmap_mode="r")
                if edge_index.ndim == 2 and edge_index.shape[1] == 2:  # IGB's (E, 2); (2, 2) read as IGB's too
                    edge_index = edge_index.T
                edges[parse_relation(sub)] = edge_index
            continue
        labels_here = [f for f in files if f.startswith("node_label") and f.endswith(".npy")]
        if "node_feat.npy" in files:
            features[sub] = _open_igb_array(os.path.join(sub_path, "node_feat.npy"), raw_feature_dim)
        elif labels_here or sub in (num_nodes or {}):
            features[sub] = None
        if labels_here:
            label_files[sub] = labels_here
    if not features or not edges:
        raise ValueError(f"{folder}: unknown layout, found {len(features)} node type(s) and {len(edges)} "
                         "relation(s); expected <type>/node_feat.npy and <src>__<name>__<dst>/edge_index.npy "
                         f"subfolders (found: {', '.join(subfolders) or 'none'})")
    target = _default_target(target, sorted(label_files), folder)
    counts = dict(num_nodes or {})
    labels, splits, converted = {}, {}, {"folder": os.path.abspath(folder)}
    if target is not None:
        if target not in label_files:
            raise ValueError(f"target type {target!r} has no node_label_*.npy in {folder}/{target}")
        target_folder = os.path.join(folder, target)
        converted["label_file"] = _label_file(label_files[target], label_file, num_classes, target_folder)
        labels[target] = _open_igb_array(os.path.join(target_folder, converted["label_file"]), None)
        if features[target] is None:
            counts.setdefault(target, int(labels[target].shape[0]))
        splits[target] = {split: np.load(file_path, mmap_mode="r")
                          for split, file_path in _split_files(target_folder).items()}
    # the target first in the global id space, the other types sorted
    order = ([target] if target is not None else []) + [t for t in sorted(features) if t != target]
    args = {"features": {t: features[t] for t in order}, "num_nodes": counts, "edges": edges, "labels": labels,
            "num_classes": num_classes if target is not None else None, "splits": splits, "target": target,
            "random_split_fractions": split_fractions, "seed": seed, "add_reverse": add_reverse}
    return _convert(path, args, kw, **converted)


__all__ = ["REVERSE_PREFIX", "hetero_from_dgl", "hetero_from_igbh", "hetero_from_numpy", "hetero_from_pyg",
           "hetero_scores", "missing_reverses", "reverse_relation"]


#: what a manifest of :func:`hetero_from_manifest` may hold, per level
MANIFEST_KEYS = {"top": ("node_types", "relations", "target", "name"),
                 "node_type": ("features", "num_nodes", "labels", "num_classes", "splits"),
                 "relation": ("file", "layout")}


def hetero_from_manifest(path, manifest: str, *, add_reverse: bool = True, **kw) -> Dataset:
    """Writes a heterogeneous dataset from a folder of ``.npy`` files that a small manifest (YAML or JSON)
    names; returns it opened. Paths are relative to the manifest's folder; every file is memory-mapped::

        target: paper                       # the labeled type trained on (default: the only labeled one)
        node_types:
          paper:  {features: paper_x.npy, labels: paper_y.npy, num_classes: 3,
                   splits: {train: train.npy, val: val.npy, test: test.npy}}   # ids or boolean masks
          author: {features: author_x.npy}
          topic:  {num_nodes: 30}           # no features: a count
        relations:
          author__writes__paper: writes.npy # (2, E) or (E, 2): (src, dst) ids local to their types
          paper__cites__paper: {file: cites.npy, layout: pairs}  # rows: (2, E), pairs: (E, 2); needed for 2 x 2

    ``add_reverse`` adds ``rev_<name>`` for every relation without a reverse (so every type receives
    messages); ``kw`` goes to :func:`hetero_from_numpy` (``scores``, ``overwrite``, ``progress``, ...)."""
    import yaml

    folder = os.path.dirname(os.path.abspath(manifest))
    try:
        with open(manifest, "rb") as fh:  # bytes: yaml names the file and the position of a byte that is not UTF-8
            spec = yaml.safe_load(fh)
    except OSError as exc:
        raise FileNotFoundError(f"cannot read the manifest {manifest}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{manifest} is not YAML or JSON: {exc}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("node_types"), dict) or \
            not isinstance(spec.get("relations"), dict):
        raise ValueError(f"{manifest} must map node_types (type: its files) and relations (src__name__dst: a "
                         "file); see lsm-gnn prepare hetero arrays --help")
    _known_keys(spec, MANIFEST_KEYS["top"], manifest)

    def array(entry: Any, what: str) -> np.ndarray:
        if not isinstance(entry, str):
            raise ValueError(f"{manifest}: {what} must name a .npy file, got {entry!r}")
        return open_npy(entry if os.path.isabs(entry) else os.path.join(folder, entry), f"{manifest}: {what}")

    def whole(value: Any, what: str) -> int:  # int() would read 2.5 as 2 and stop at "many" with no key named
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{manifest}: {what} must be a whole number, got {value!r}")
        return value

    features, num_nodes, labels, num_classes, splits = {}, {}, {}, {}, {}
    for t, entry in spec["node_types"].items():
        entry = entry or {}
        if not isinstance(entry, dict):
            raise ValueError(f"{manifest}: node type {t!r} must map its files, got {entry!r}")
        _known_keys(entry, MANIFEST_KEYS["node_type"], f"{manifest}, node type {t!r}")
        if "features" in entry:
            features[t] = array(entry["features"], f"node type {t!r} features")
        elif "num_nodes" in entry:
            num_nodes[t] = whole(entry["num_nodes"], f"node type {t!r} num_nodes")
        else:
            raise ValueError(f"{manifest}: node type {t!r} needs features (a .npy file) or num_nodes")
        if "labels" in entry:
            labels[t] = array(entry["labels"], f"node type {t!r} labels")
        if "num_classes" in entry:
            num_classes[t] = whole(entry["num_classes"], f"node type {t!r} num_classes")
        if "splits" in entry:
            if not isinstance(entry["splits"], dict):
                raise ValueError(f"{manifest}: the splits of {t!r} must map split names to files")
            splits[t] = {s: array(f, f"node type {t!r} split {s!r}") for s, f in entry["splits"].items()}
    edges = {}
    for relation, entry in spec["relations"].items():
        file, layout = entry, None
        if isinstance(entry, dict):
            _known_keys(entry, MANIFEST_KEYS["relation"], f"{manifest}, relation {relation!r}")
            file, layout = entry.get("file"), entry.get("layout")
        edges[relation] = edges_in_layout(array(file, f"relation {relation!r}"), layout,
                                          f"{manifest}: relation {relation!r} ({file})")
    return hetero_from_numpy(path, features=features, edges=edges, num_nodes=num_nodes or None,
                             labels=labels or None, num_classes=num_classes or None, splits=splits or None,
                             target=spec.get("target"), name=spec.get("name"), add_reverse=add_reverse, **kw)


def _known_keys(entry: dict, known: tuple, where: str) -> None:
    unknown = sorted(set(entry) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; known: {', '.join(known)}")
