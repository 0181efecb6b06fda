"""The schema-2 format: several node types and typed relations, as IGBH and MAG240M have, and its checks.

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
order (:attr:`Dataset.offsets <lsm_gnn.data.dataset.Dataset>`); the cache
and the communication layer key rows by it. Both schemas open as the one
:class:`~lsm_gnn.data.dataset.Dataset`; a schema-1 dataset is the case of
one node type and one relation.
"""
from __future__ import annotations

import re
from typing import Any

from lsm_gnn.data.dataset import relation_key
from lsm_gnn.data.format import (
    CHECKS, MAX_CLASSES, SPLITS, _REDO, _check_file_name, _fail, _get, _get_files, _get_int, _name, _show,
    check_block_sums_file, check_checksums_meta, check_csr, check_feature_file, check_feature_meta,
    check_node_arrays,
)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def check_name(name: Any, what: str) -> str:
    """Node type and relation names: letters, digits, '_' and '-'; no '__' (it joins relation keys) and no
    '.' (PyG and torch module names cannot hold one)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or "__" in name:
        raise ValueError(f"{what} {name!r} is not a valid name: use letters, digits, '_' and '-', starting "
                         "with a letter or digit, without '__'")
    return name


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


def check_schema2(path: str, meta: dict, meta_path: str, check: str) -> None:
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
    target = meta.get("target")
    if target is not None and next(e for e in meta["node_types"] if e["name"] == target).get("labels") is None:
        raise _fail(meta_path, f"target type '{target}' has no labels",
                    "Write labels for it or name another target; " + _REDO)


__all__ = ["check_name", "check_schema2"]
