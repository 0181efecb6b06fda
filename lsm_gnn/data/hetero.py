"""Heterogeneous datasets (schema 2): several node types and typed relations, as IGBH and MAG240M have.

Layout (every name is recorded in ``meta.json``; these are the defaults)::

    meta.json                                    schema 2: node types, relations, target type
    nodes/<type>/features.bin                    the type's feature rows, as in schema 1 (fixed
                                                 stride, small rows packed per 512-byte block,
                                                 page padded); optional
    nodes/<type>/labels.npy                      int64 class per node, -1 unlabeled (optional)
    nodes/<type>/{train,val,test}_idx.npy        int64 node ids of that type (optional)
    nodes/<type>/scores/<name>.npy               float32 static score per node (optional)
    relations/<src>__<name>__<dst>/indptr.npy    the relation's CSR: row v (a ``dst`` node) lists
    relations/<src>__<name>__<dst>/indices.npy   the ``src`` nodes v aggregates from

Node ids are local to their type, ``[0, num_nodes[type])``. A relation
``(src, name, dst)`` follows PyG's edge-type convention: messages flow from
``src`` nodes to ``dst`` nodes. Feature dims and dtypes may differ between
types, and a type may have no features. Labels and splits may live on any
type; ``target`` names the type a trainer classifies by default.

The global id space puts the types one after another in ``node_types``
order (:attr:`HeteroDataset.offsets`); the cache and the communication
layer key rows by it. Schema-1 datasets keep opening as
:class:`~lsm_gnn.data.format.Dataset`; :func:`~lsm_gnn.data.open_dataset`
returns a :class:`HeteroDataset` for schema 2.
"""
from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

from lsm_gnn.data.format import (
    CHECKS, MAX_CLASSES, SPLITS, DatasetError, FeatureLayout, _REDO, _check_file_name, _fail, _get, _get_files,
    _get_int, _name, _show, check_block_sums_file, check_checksums_meta, check_csr, check_feature_file,
    check_feature_meta, check_node_arrays, read_rows_direct, verify_checksums,
)
from lsm_gnn.fileio import contained_path

Relation = tuple[str, str, str]
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def relation_key(relation: Relation) -> str:
    """``src__name__dst``: a relation as one string (directory names, config keys)."""
    return "__".join(relation)


def type_offsets(num_nodes: dict[str, int]) -> dict[str, int]:
    """First global id of each node type: the types one after another, in the dict's order."""
    offsets, total = {}, 0
    for t, n in num_nodes.items():
        offsets[t], total = total, total + n
    return offsets


def parse_relation(key: str | tuple) -> Relation:
    """A relation from a ``(src, name, dst)`` tuple or its ``src__name__dst`` key."""
    if isinstance(key, str):
        parts = tuple(key.split("__"))
    else:
        parts = tuple(key)
    if len(parts) != 3 or not all(isinstance(p, str) and p for p in parts):
        raise ValueError(f"a relation is (src_type, name, dst_type) or 'src__name__dst', got {key!r}")
    return parts  # type: ignore[return-value]


def check_name(name: Any, what: str) -> str:
    """Node type and relation names: letters, digits, '_' and '-'; no '__' (it joins relation keys) and no
    '.' (PyG and torch module names cannot hold one)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or "__" in name:
        raise ValueError(f"{what} {name!r} is not a valid name: use letters, digits, '_' and '-', starting "
                         "with a letter or digit, without '__'")
    return name


class NodeType:
    """One node type of a :class:`HeteroDataset`: what a storage backend reads (``features``,
    ``feature_path``, ``num_nodes``), so :func:`lsm_gnn.storage.open_storage` opens its feature file
    like a schema-1 dataset's."""

    def __init__(self, dataset: HeteroDataset, entry: dict):
        self.dataset = dataset
        self.name: str = entry["name"]
        self.num_nodes = int(entry["num_nodes"])
        f = entry.get("features")
        self.features = None if f is None else FeatureLayout(
            file=f["file"], dtype=f["dtype"], dim=int(f["dim"]), row_bytes=int(f["row_bytes"]),
            row_stride=int(f["row_stride"]), page_size=int(f["page_size"]), file_bytes=int(f["file_bytes"]))
        self.entry = entry
        self.path = dataset.path

    def __repr__(self) -> str:
        feats = "no features" if self.features is None else f"{self.features.dim} x {self.features.dtype}"
        return f"NodeType({self.name!r}, num_nodes={self.num_nodes}, {feats})"

    @property
    def feature_path(self) -> str:
        if self.features is None:
            raise ValueError(f"node type '{self.name}' of {self.dataset.path} has no features")
        return self.dataset.file_path(self.features.file)

    @property
    def feature_dim(self) -> int:
        return 0 if self.features is None else self.features.dim

    @property
    def feature_dtype(self) -> np.dtype | None:
        return None if self.features is None else self.features.numpy_dtype

    def read_features_direct(self, ids: np.ndarray) -> np.ndarray:
        """Rows by plain buffered reads: the ground truth the tests compare every storage path to."""
        return read_rows_direct(self.feature_path, self.features, self.num_nodes, ids)


class HeteroDataset:
    """An opened, validated schema-2 dataset directory; arrays are memory-mapped on first use."""

    def __init__(self, path: str, meta: dict[str, Any]):
        self.path = os.path.abspath(path)
        self.meta = meta
        self.name = meta.get("name", os.path.basename(self.path))
        self.types: dict[str, NodeType] = {e["name"]: NodeType(self, e) for e in meta["node_types"]}
        self.node_types: list[str] = list(self.types)
        self.num_nodes: dict[str, int] = {t: nt.num_nodes for t, nt in self.types.items()}
        self._relations = {(r["src"], r["name"], r["dst"]): r for r in meta["relations"]}
        self.relations: list[Relation] = list(self._relations)
        self.num_edges: dict[Relation, int] = {rel: int(r["num_edges"]) for rel, r in self._relations.items()}
        self.target: str | None = meta.get("target")
        self.offsets: dict[str, int] = type_offsets(self.num_nodes)
        self.total_nodes = sum(self.num_nodes.values())
        self._cache: dict[str, np.ndarray] = {}

    def __repr__(self) -> str:
        return (f"HeteroDataset(name={self.name!r}, node_types={self.num_nodes}, relations={len(self.relations)}, "
                f"target={self.target!r}, path={self.path!r})")

    is_hetero = True

    def file_path(self, name: str) -> str:
        return contained_path(self.path, name, DatasetError)

    def _array(self, name: str) -> np.ndarray:
        if name not in self._cache:
            self._cache[name] = np.load(self.file_path(name), mmap_mode="r")
        return self._cache[name]

    def node_type(self, name: str | None = None) -> NodeType:
        """A node type by name (None: the target type)."""
        name = self._type_name(name)
        return self.types[name]

    def _type_name(self, name: str | None) -> str:
        if name is None:
            if self.target is None:
                raise ValueError(f"dataset {self.path} has no target type; name the node type")
            return self.target
        if name not in self.types:
            raise KeyError(f"dataset {self.path} has no node type {name!r}; it has: {', '.join(self.node_types)}")
        return name

    @property
    def feature_types(self) -> list[str]:
        """Node types that have features, in ``node_types`` order."""
        return [t for t in self.node_types if self.types[t].features is not None]

    def csr(self, relation: Relation | str) -> tuple[np.ndarray, np.ndarray]:
        """(indptr, indices) of a relation: row v of ``dst`` lists the ``src`` nodes it aggregates from."""
        relation = parse_relation(relation)
        if relation not in self._relations:
            raise KeyError(f"dataset {self.path} has no relation {relation}; it has: "
                           f"{', '.join(map(relation_key, self.relations))}")
        entry = self._relations[relation]
        return self._array(entry["indptr"]), self._array(entry["indices"])

    def labels(self, node_type: str | None = None) -> np.ndarray | None:
        name = self.types[self._type_name(node_type)].entry.get("labels")
        return None if name is None else self._array(name)

    def num_classes(self, node_type: str | None = None) -> int | None:
        return self.types[self._type_name(node_type)].entry.get("num_classes")

    def split(self, name: str, node_type: str | None = None) -> np.ndarray:
        """Node ids (of ``node_type``, default the target) of split ``name``."""
        t = self._type_name(node_type)
        splits = self.types[t].entry.get("splits") or {}
        if name not in splits:
            raise KeyError(f"node type '{t}' of {self.path} has no '{name}' split; it has: {sorted(splits) or 'none'}")
        return self._array(splits[name])

    def score_names(self, node_type: str) -> list[str]:
        return sorted(self.types[self._type_name(node_type)].entry.get("scores") or {})

    def score(self, name: str, node_type: str) -> np.ndarray:
        t = self._type_name(node_type)
        scores = self.types[t].entry.get("scores") or {}
        if name not in scores:
            raise KeyError(f"node type '{t}' of {self.path} has no '{name}' score; it has: "
                           f"{sorted(scores) or 'none'}")
        return self._array(scores[name])

    def verify_checksums(self) -> None:
        """Re-reads every file and compares it to the checksum in meta.json."""
        verify_checksums(self.path, self.meta)


# -- validation of schema 2 ---------------------------------------------------

def _check_hetero_meta(meta: dict, meta_path: str) -> None:
    """Every known key of a schema-2 meta.json; each error names the node type or relation."""
    for key in ("name", "created_by"):
        _get(meta, key, str, meta_path, optional=True)
    entries = meta.get("node_types")
    if not isinstance(entries, list) or not entries:
        raise _fail(meta_path, f"key 'node_types' must be a non-empty list, got {_show(entries)}", _REDO)
    seen: set[str] = set()
    for k, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise _fail(meta_path, f"node_types[{k}] must be an object, got {_show(entry)}", _REDO)
        name = _get(entry, "name", str, meta_path, f"node_types[{k}].")
        try:
            check_name(name, "node type")
        except ValueError as exc:
            raise _fail(meta_path, f"node_types[{k}]: {exc}", _REDO) from None
        if name in seen:
            raise _fail(meta_path, f"node type '{name}' is listed twice in 'node_types'", _REDO)
        seen.add(name)
        prefix = f"node_types.{name}."
        _get_int(entry, "num_nodes", meta_path, 1, prefix=prefix)
        feats = _get(entry, "features", dict, meta_path, prefix, nullable=True)
        if feats is not None:
            check_feature_meta(feats, meta_path, prefix + "features.")
        labels = _get(entry, "labels", str, meta_path, prefix, optional=True, nullable=True)
        if labels is not None:
            _check_file_name(labels, prefix + "labels", meta_path)
            if _get_int(entry, "num_classes", meta_path, 1, MAX_CLASSES, prefix=prefix, nullable=True) is None:
                raise _fail(meta_path, f"key '{prefix}labels' names a file but '{prefix}num_classes' is missing",
                            "Set num_classes to the number of classes or re-create the dataset")
        _get_files(entry, "splits", meta_path, SPLITS, "split")
        _get_files(entry, "scores", meta_path)
    relations = meta.get("relations")
    if not isinstance(relations, list):
        raise _fail(meta_path, f"key 'relations' must be a list, got {_show(relations)}", _REDO)
    seen_relations: set[tuple] = set()
    for k, entry in enumerate(relations):
        if not isinstance(entry, dict):
            raise _fail(meta_path, f"relations[{k}] must be an object, got {_show(entry)}", _REDO)
        parts = tuple(_get(entry, key, str, meta_path, f"relations[{k}].") for key in ("src", "name", "dst"))
        key = relation_key(parts)
        for role, type_name in (("src", parts[0]), ("dst", parts[2])):
            if type_name not in seen:
                raise _fail(meta_path, f"relation '{key}' names {role} type '{_name(type_name)}', which is not in "
                            f"'node_types' ({', '.join(sorted(seen))})", _REDO)
        try:
            check_name(parts[1], "relation name")
        except ValueError as exc:
            raise _fail(meta_path, f"relation '{key}': {exc}", _REDO) from None
        if parts in seen_relations:
            raise _fail(meta_path, f"relation '{key}' is listed twice in 'relations'", _REDO)
        seen_relations.add(parts)
        _get_int(entry, "num_edges", meta_path, 0, prefix=f"relations.{key}.")
        for file_key in ("indptr", "indices"):
            _check_file_name(_get(entry, file_key, str, meta_path, f"relations.{key}."),
                             f"relations.{key}.{file_key}", meta_path)
    target = _get(meta, "target", str, meta_path, optional=True, nullable=True)
    if target is not None and target not in seen:
        raise _fail(meta_path, f"target type '{_name(target)}' is not in 'node_types' ({', '.join(sorted(seen))})",
                    _REDO)
    check_checksums_meta(meta, meta_path)


def open_hetero(path: str, meta: dict, meta_path: str, check: str) -> HeteroDataset:
    """Validates a schema-2 dataset (called by :func:`lsm_gnn.data.open_dataset`): the same checks as
    schema 1, per node type and per relation."""
    if check not in CHECKS:
        raise ValueError(f"check must be one of {CHECKS}, got {check!r}")
    _check_hetero_meta(meta, meta_path)
    num_nodes = {e["name"]: e["num_nodes"] for e in meta["node_types"]}
    for entry in meta["node_types"]:
        name = entry["name"]
        if entry.get("features") is not None:
            check_feature_file(path, meta_path, entry["features"], num_nodes[name], f"node_types.{name}.features.")
        check_node_arrays(path, entry, num_nodes[name], entry.get("num_classes"))
    check_block_sums_file(path, meta, meta_path)
    for entry in meta["relations"]:
        check_csr(path, entry["indptr"], entry["indices"], num_nodes[entry["dst"]], num_nodes[entry["src"]],
                  entry["num_edges"], check)
    dataset = HeteroDataset(path, meta)
    if dataset.target is not None and dataset.labels(dataset.target) is None:
        raise _fail(meta_path, f"target type '{dataset.target}' has no labels",
                    "Write labels for it or name another target; " + _REDO)
    return dataset


__all__ = ["HeteroDataset", "NodeType", "Relation", "check_name", "open_hetero", "parse_relation", "relation_key",
           "type_offsets"]
