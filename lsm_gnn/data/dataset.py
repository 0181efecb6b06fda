"""The one dataset class: a graph of typed nodes and typed relations, opened from either schema.

A schema-1 directory (:mod:`lsm_gnn.data.format`) is a graph with one node type, :data:`ONE_TYPE`, and one
relation, :data:`ONE_RELATION`; a schema-2 directory (:mod:`lsm_gnn.data.hetero`) has several of each. Both
open as :class:`Dataset`, and every question takes the node type (``None``: the target type, which a one-type
graph's only type is) or the relation (``None``: the only one), so a reader never asks which kind it holds::

    ds.node_types, ds.relations, ds.target
    ds.num_nodes_of(t), ds.labels(t), ds.num_classes(t), ds.split("train", t), ds.score("degree", t)
    ds.csr(relation)                         # (indptr, indices): row v of dst lists the src nodes v reads

``num_nodes`` and ``num_edges`` count the whole graph: nodes of every type, laid one type after another in
``node_types`` order (``offsets``), the global id space the cache and the communication layer key rows by.
``features``, ``feature_path``, ``feature_dim``, ``indptr`` and ``indices`` are the target type's and the
only relation's, for code that works on one type.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

# ONE_TYPE, ONE_RELATION and relation_key are re-exported: the format defines them, readers name them here.
from lsm_gnn.data.format import (  # noqa: F401
    ONE_RELATION, ONE_TYPE, DatasetError, FeatureLayout, read_rows_direct, relation_key, typed_entries,
    verify_checksums,
)
from lsm_gnn.utils.fileio import contained_path

Relation = tuple[str, str, str]


def parse_relation(key: str | tuple) -> Relation:
    """A relation from a ``(src, name, dst)`` tuple or its ``src__name__dst`` key."""
    parts = tuple(key.split("__")) if isinstance(key, str) else tuple(key)
    if len(parts) != 3 or not all(isinstance(p, str) and p for p in parts):
        raise ValueError(f"a relation is (src_type, name, dst_type) or 'src__name__dst', got {key!r}")
    return parts  # type: ignore[return-value]


def type_offsets(num_nodes: dict[str, int]) -> dict[str, int]:
    """First global id of each node type: the types one after another, in the dict's order."""
    offsets, total = {}, 0
    for t, n in num_nodes.items():
        offsets[t], total = total, total + n
    return offsets


def _layout(features: dict | None) -> FeatureLayout | None:
    if features is None:
        return None
    return FeatureLayout(file=features["file"], dtype=features["dtype"], dim=int(features["dim"]),
                         row_bytes=int(features["row_bytes"]), row_stride=int(features["row_stride"]),
                         page_size=int(features["page_size"]), file_bytes=int(features["file_bytes"]))


class NodeType:
    """One node type: what a storage backend reads (``features``, ``feature_path``, ``num_nodes``), so
    :func:`lsm_gnn.storage.open_storage` opens any type's feature file the same way."""

    def __init__(self, dataset: Dataset, entry: dict):
        self.dataset = dataset
        self.name: str = entry["name"]
        self.num_nodes = int(entry["num_nodes"])
        self.features = _layout(entry.get("features"))
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
        """Rows by plain buffered reads: slow, simple, the ground truth every storage and cache path is
        compared to."""
        if self.features is None:
            raise ValueError(f"node type '{self.name}' of {self.dataset.path} has no features")
        return read_rows_direct(self.feature_path, self.features, self.num_nodes, ids)


class Dataset:
    """An opened, validated dataset directory (open it with :func:`lsm_gnn.data.open_dataset`).

    Arrays are memory-mapped and loaded on first use, so opening a dataset of 10^8 nodes costs only its
    validation. Read features through a storage backend (:func:`lsm_gnn.storage.open_storage`).
    """

    def __init__(self, path: str, meta: dict[str, Any]):
        self.path = os.path.abspath(path)
        self.meta = meta
        self.name = meta.get("name", os.path.basename(self.path))
        types, relations, self.target = typed_entries(meta)
        self.types: dict[str, NodeType] = {e["name"]: NodeType(self, e) for e in types}
        self.node_types: list[str] = list(self.types)
        self._relations = {(r["src"], r["name"], r["dst"]): r for r in relations}
        self.relations: list[Relation] = list(self._relations)
        self.offsets: dict[str, int] = type_offsets({t: nt.num_nodes for t, nt in self.types.items()})
        self.num_nodes = sum(nt.num_nodes for nt in self.types.values())
        self.num_edges = sum(int(r["num_edges"]) for r in relations)
        self._cache: dict[str, np.ndarray] = {}

    def __repr__(self) -> str:
        if len(self.types) == 1:
            return (f"Dataset(name={self.name!r}, num_nodes={self.num_nodes}, num_edges={self.num_edges}, "
                    f"feature_dim={self.feature_dim}, feature_dtype={self.features.dtype}, path={self.path!r})")
        return (f"Dataset(name={self.name!r}, node_types={ {t: n.num_nodes for t, n in self.types.items()} }, "
                f"relations={len(self.relations)}, target={self.target!r}, path={self.path!r})")

    @property
    def is_homogeneous(self) -> bool:
        """One node type and one relation (DGL's term): what the one-type loader, sampler and models take."""
        return len(self.types) == 1 and len(self.relations) == 1

    def describe_nodes(self) -> str:
        """Its nodes for a log line: their count, and on a typed graph the number of types and the target."""
        if self.is_homogeneous:
            return f"{self.num_nodes:,} nodes"
        return f"{self.num_nodes:,} nodes of {len(self.types)} types, target {self.target}"

    # -- files ---------------------------------------------------------------------------------------------------
    def file_path(self, name: str) -> str:
        return contained_path(self.path, name, DatasetError)

    def _array(self, name: str) -> np.ndarray:
        if name not in self._cache:
            self._cache[name] = np.load(self.file_path(name), mmap_mode="r")
        return self._cache[name]

    def verify_checksums(self) -> None:
        """Re-reads every file and compares it to the checksum in meta.json."""
        verify_checksums(self.path, self.meta)

    # -- node types ----------------------------------------------------------------------------------------------
    def node_type(self, name: str | None = None) -> NodeType:
        """A node type by name (None: the target type)."""
        return self.types[self._type_name(name)]

    def _type_name(self, name: str | None) -> str:
        if name is None:
            if self.target is None:
                raise ValueError(f"dataset {self.path} has no target type; name the node type")
            return self.target
        if name not in self.types:
            raise KeyError(f"dataset {self.path} has no node type {name!r}; it has: {', '.join(self.node_types)}")
        return name

    def num_nodes_of(self, node_type: str | None = None) -> int:
        """Nodes of one type (None: the target); ``num_nodes`` counts every type's."""
        return self.node_type(node_type).num_nodes

    @property
    def feature_types(self) -> list[str]:
        """Node types that have features, in ``node_types`` order."""
        return [t for t in self.node_types if self.types[t].features is not None]

    def labels(self, node_type: str | None = None) -> np.ndarray | None:
        """Class per node of the type (None: the target), -1 where unlabeled; None if it has no labels."""
        name = self.node_type(node_type).entry.get("labels")
        return None if name is None else self._array(name)

    def num_classes(self, node_type: str | None = None) -> int | None:
        return self.node_type(node_type).entry.get("num_classes")

    def split_names(self, node_type: str | None = None) -> list[str]:
        return sorted(self.node_type(node_type).entry.get("splits") or {})

    def split(self, name: str, node_type: str | None = None) -> np.ndarray:
        """Node ids (of ``node_type``, default the target) of split ``name`` (train, val or test)."""
        t = self._type_name(node_type)
        return self._named_array(self.types[t].entry.get("splits") or {}, name, "split", self.where(t))

    def score_names(self, node_type: str | None = None) -> list[str]:
        return sorted(self.node_type(node_type).entry.get("scores") or {})

    def score(self, name: str, node_type: str | None = None) -> np.ndarray:
        """Static per-node score ``name`` (e.g. ``reverse_pagerank``, ``degree``) of a node type."""
        t = self._type_name(node_type)
        return self._named_array(self.types[t].entry.get("scores") or {}, name, "score", self.where(t),
                                 "Compute it with 'lsm-gnn prepare scores <dataset>'")

    def _named_array(self, entries: dict, name: str, what: str, where: str, how: str | None = None) -> np.ndarray:
        """The array of entry ``name``; a KeyError naming the entries there are (and ``how`` to add one) if absent."""
        if name not in entries:
            raise KeyError(f"{where} has no '{name}' {what}; it has: {sorted(entries) or 'none'}"
                           + (f". {how}" if how else ""))
        return self._array(entries[name])

    def where(self, node_type: str) -> str:
        """Where ``node_type``'s nodes are, as a message names it: the dataset of a graph of one type, else the
        type of the dataset."""
        return f"dataset {self.path}" if len(self.types) == 1 else f"node type '{node_type}' of {self.path}"

    # -- the target type's features ------------------------------------------------------------------------------
    @property
    def features(self) -> FeatureLayout | None:
        return self.node_type().features

    @property
    def feature_path(self) -> str:
        return self.node_type().feature_path

    @property
    def feature_dim(self) -> int:
        return self.node_type().feature_dim

    @property
    def feature_dtype(self) -> np.dtype | None:
        return self.node_type().feature_dtype

    def read_features_direct(self, ids: np.ndarray) -> np.ndarray:
        return self.node_type().read_features_direct(ids)

    # -- relations -----------------------------------------------------------------------------------------------
    def _relation(self, relation: Relation | str | None) -> dict:
        if relation is None:
            if len(self.relations) != 1:
                raise ValueError(f"dataset {self.path} has {len(self.relations)} relations; name one of: "
                                 f"{', '.join(map(relation_key, self.relations))}")
            return self._relations[self.relations[0]]
        relation = parse_relation(relation)
        if relation not in self._relations:
            raise KeyError(f"dataset {self.path} has no relation {relation}; it has: "
                           f"{', '.join(map(relation_key, self.relations))}")
        return self._relations[relation]

    def csr(self, relation: Relation | str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(indptr, indices) of a relation (None: the only one): row v of ``dst`` lists the ``src`` nodes it
        aggregates from."""
        entry = self._relation(relation)
        return self._array(entry["indptr"]), self._array(entry["indices"])

    def num_edges_of(self, relation: Relation | str | None = None) -> int:
        return int(self._relation(relation)["num_edges"])

    @property
    def indptr(self) -> np.ndarray:
        return self.csr()[0]

    @property
    def indices(self) -> np.ndarray:
        return self.csr()[1]

    # -- link prediction (user-item datasets) --------------------------------------------------------------------
    @property
    def num_users(self) -> int | None:
        """Users are nodes ``[0, num_users)`` of a user-item dataset; None for other graphs."""
        return self.meta.get("num_users")

    @property
    def num_items(self) -> int | None:
        """Items are nodes ``[num_users, num_nodes)`` of a user-item dataset; None for other graphs."""
        return self.meta.get("num_items")

    @property
    def edge_split_names(self) -> list[str]:
        return sorted(self.meta.get("edge_splits", {}))

    def edge_split(self, name: str) -> np.ndarray:
        """Held-out node pairs of split ``name`` (val or test): int64, shape ``(E, 2)``, not in the CSR."""
        return self._named_array(self.meta.get("edge_splits", {}), name, "edge split", f"dataset {self.path}",
                                 "Generate a user-item dataset with lsm_gnn.data.bipartite.generate_bipartite, or "
                                 "write held-out pairs with DatasetWriter.write_edge_split")


__all__ = ["ONE_RELATION", "ONE_TYPE", "Dataset", "NodeType", "Relation", "parse_relation", "relation_key",
           "type_offsets"]
