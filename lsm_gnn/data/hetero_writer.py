"""Writes heterogeneous (schema-2) datasets atomically and in bounded memory.

The same guarantees as :class:`~lsm_gnn.data.writer.DatasetWriter`, whose
parts it reuses: everything goes to a hidden temporary directory that
:meth:`HeteroDatasetWriter.commit` validates and renames into place, an
error removes it, a full disk is named by file. Layout: :mod:`lsm_gnn.data.hetero`.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Iterable

import numpy as np

from lsm_gnn.data.format import FORMAT_NAME, HETERO_SCHEMA_VERSION
from lsm_gnn.data.dataset import Relation, parse_relation, relation_key, type_offsets
from lsm_gnn.data.hetero import check_name
from lsm_gnn.data.writer import (
    AtomicDatasetWriter, DatasetError, FeatureFileWriter, build_csr_files, csr_edge_chunks, label_array,
    save_npy, score_array, split_ids, write_csr_files,
)
from lsm_gnn.fileio import make_temporary
from lsm_gnn.progress import progress_bar
from lsm_gnn.version import __version__


class HeteroDatasetWriter(AtomicDatasetWriter):
    """Builds one schema-2 dataset directory.

    ``node_types`` maps each type (in the order of the global id space) to
    ``{"num_nodes": n}``, plus ``"feature_dim"`` (and ``"feature_dtype"``,
    default float32) for a type that has features. Then, in any order:
    :meth:`write_features` per featured type (consecutive row chunks),
    :meth:`write_edges` or :meth:`write_csr` per relation, and optionally
    :meth:`write_labels`, :meth:`write_split` and :meth:`write_score` per
    type; finally :meth:`commit`. ``target`` names the type a trainer
    classifies by default (it needs labels).
    """

    def __init__(self, path: str | os.PathLike, *, node_types: dict[str, dict], target: str | None = None,
                 name: str | None = None, overwrite: bool = False, row_alignment: int | None = None,
                 extra_meta: dict | None = None):
        if not isinstance(node_types, dict) or not node_types:
            raise ValueError("node_types must map at least one node type name to {'num_nodes': ..., ...}")
        specs = {}
        for type_name, spec in node_types.items():
            check_name(type_name, "node type")
            if not isinstance(spec, dict) or set(spec) - {"num_nodes", "feature_dim", "feature_dtype"}:
                raise ValueError(f"node type '{type_name}' must be given as {{'num_nodes': n, 'feature_dim': d, "
                                 f"'feature_dtype': ...}} (features optional), got {spec!r}")
            n = spec.get("num_nodes")
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0:
                raise ValueError(f"node type '{type_name}' needs a positive num_nodes, got {n!r}")
            specs[type_name] = spec
        if target is not None and target not in specs:
            raise ValueError(f"target type {target!r} is not one of the node types ({', '.join(specs)})")
        super().__init__(path, overwrite)
        self.type_sizes = {t: int(spec["num_nodes"]) for t, spec in specs.items()}  # node count per type
        self._features: dict[str, FeatureFileWriter] = {}
        self._relations: dict[Relation, dict] = {}
        entries = []
        try:
            for t, spec in specs.items():
                os.makedirs(os.path.join(self.tmp, "nodes", t))
                entry = {"name": t, "num_nodes": self.type_sizes[t], "features": None, "labels": None,
                         "num_classes": None, "splits": {}, "scores": {}}
                if spec.get("feature_dim") is not None:
                    writer = FeatureFileWriter(os.path.join(self.tmp, "nodes", t, "features.bin"), self.type_sizes[t],
                                               spec["feature_dim"], spec.get("feature_dtype", "float32"),
                                               row_alignment, what=f"node type '{t}'")
                    self._features[t] = writer
                    entry["features"] = writer.layout(f"nodes/{t}/features.bin")
                elif "feature_dtype" in spec:
                    raise ValueError(f"node type '{t}' has a feature_dtype but no feature_dim")
                entries.append(entry)
        except BaseException:
            self.abort()
            raise
        self._entries = {e["name"]: e for e in entries}
        self.meta = {
            "format": FORMAT_NAME, "version": HETERO_SCHEMA_VERSION, "name": name or os.path.basename(self.path),
            "node_types": entries, "relations": [], "target": target, "checksums": {},
            "created_by": "lsm-gnn " + __version__, **(extra_meta or {}),
        }

    def _close_files(self) -> None:
        for writer in self._features.values():
            writer.close()

    def _entry(self, node_type: str) -> dict:
        if node_type not in self._entries:
            raise KeyError(f"no node type {node_type!r}; the node types are {', '.join(self._entries)}")
        return self._entries[node_type]

    # -- features ------------------------------------------------------------
    def rows_written(self, node_type: str) -> int:
        self._entry(node_type)
        return self._features[node_type].rows_written if node_type in self._features else 0

    def write_features(self, node_type: str, rows: np.ndarray) -> None:
        """Appends the next ``len(rows)`` feature rows of ``node_type``."""
        self._entry(node_type)
        if node_type not in self._features:
            raise ValueError(f"node type '{node_type}' was declared without features (give it a feature_dim)")
        self._features[node_type].write(rows)

    # -- relations -----------------------------------------------------------
    def _relation(self, relation) -> tuple[Relation, str]:
        relation = parse_relation(relation)
        src, name, dst = relation
        key = relation_key(relation)
        for role, t in (("source", src), ("destination", dst)):
            if t not in self._entries:
                raise ValueError(f"relation '{key}': its {role} type '{t}' is not a node type "
                                 f"({', '.join(self._entries)})")
        check_name(name, f"relation '{key}': name")
        if relation in self._relations:
            raise ValueError(f"relation '{key}' was already written")
        os.makedirs(os.path.join(self.tmp, "relations", key))
        return relation, f"relations/{key}/"

    def _add_relation(self, relation: Relation, prefix: str, num_edges: int) -> None:
        entry = {"src": relation[0], "name": relation[1], "dst": relation[2], "num_edges": num_edges,
                 "indptr": prefix + "indptr.npy", "indices": prefix + "indices.npy"}
        self._relations[relation] = entry
        self.meta["relations"].append(entry)

    def write_edges(self, relation, chunks: Iterable[tuple[np.ndarray, np.ndarray]], *, dedup: bool = True,
                    self_loops: bool = True) -> None:
        """Builds the CSR of ``relation`` (``(src, name, dst)`` or ``'src__name__dst'``) from (src ids,
        dst ids) chunks in bounded memory: dst's row lists src. Write a reverse relation explicitly."""
        relation, prefix = self._relation(relation)
        src, _, dst = relation
        try:
            num_edges = build_csr_files(self.tmp, prefix, chunks, self.type_sizes[dst], self.type_sizes[src],
                                        dedup=dedup, self_loops=self_loops or src != dst)
        except ValueError as exc:
            raise ValueError(f"relation '{relation_key(relation)}': {exc}") from None
        self._add_relation(relation, prefix, num_edges)

    def write_csr(self, relation, indptr: np.ndarray, indices: np.ndarray) -> None:
        """Stores the CSR of ``relation`` as given: ``num_nodes[dst] + 1`` indptr entries, src ids."""
        relation, prefix = self._relation(relation)
        src, _, dst = relation
        try:
            num_edges = write_csr_files(self.tmp, prefix, indptr, indices, self.type_sizes[dst], self.type_sizes[src])
        except ValueError as exc:
            raise ValueError(f"relation '{relation_key(relation)}': {exc}") from None
        self._add_relation(relation, prefix, num_edges)

    def csr(self, relation) -> tuple[np.ndarray, np.ndarray]:
        """A relation's CSR written so far (memory-mapped), e.g. to compute scores before commit."""
        relation = parse_relation(relation)
        if relation not in self._relations:
            raise KeyError(f"relation '{relation_key(relation)}' has not been written")
        entry = self._relations[relation]
        return (np.load(os.path.join(self.tmp, entry["indptr"]), mmap_mode="r"),
                np.load(os.path.join(self.tmp, entry["indices"]), mmap_mode="r"))

    # -- labels, splits, scores ----------------------------------------------
    def write_labels(self, node_type: str, labels: np.ndarray, num_classes: int | None = None) -> None:
        """Class per node of ``node_type``, -1 for unlabeled nodes."""
        entry = self._entry(node_type)
        labels, num_classes = label_array(labels, self.type_sizes[node_type], num_classes,
                                          f"labels of node type '{node_type}'")
        file_name = f"nodes/{node_type}/labels.npy"
        save_npy(os.path.join(self.tmp, file_name), labels)
        entry["labels"], entry["num_classes"] = file_name, num_classes

    def write_split(self, node_type: str, name: str, ids: np.ndarray) -> None:
        entry = self._entry(node_type)
        ids = split_ids(name, ids, self.type_sizes[node_type], f" of node type '{node_type}'")
        file_name = f"nodes/{node_type}/{name}_idx.npy"
        save_npy(os.path.join(self.tmp, file_name), ids)
        entry["splits"][name] = file_name

    def write_score(self, node_type: str, name: str, scores: np.ndarray) -> None:
        entry = self._entry(node_type)
        scores = score_array(name, scores, self.type_sizes[node_type], f" of node type '{node_type}'")
        os.makedirs(os.path.join(self.tmp, "nodes", node_type, "scores"), exist_ok=True)
        file_name = f"nodes/{node_type}/scores/{name}.npy"
        save_npy(os.path.join(self.tmp, file_name), scores)
        entry["scores"][name] = file_name

    def write_union_scores(self, names=None, progress: bool = False) -> None:
        """Computes static scores (default: all of :data:`~lsm_gnn.data.scores.SCORE_NAMES`) on the union of
        the relations written so far (:func:`hetero_scores`) and writes each type's slice."""
        for t, per_type in hetero_scores(self, names, progress=progress).items():
            for name, scores in per_type.items():
                self.write_score(t, name, scores)

    # -- commit --------------------------------------------------------------
    def _finish(self) -> None:
        target = self.meta["target"]
        if target is not None and self._entries[target]["labels"] is None:
            raise DatasetError(f"{self.path}: target type '{target}' has no labels; call write_labels('{target}', "
                               "...) or give no target")
        for t, writer in self._features.items():
            self._finish_feature_file(f"nodes/{t}/features.bin", writer)


def hetero_scores(source, names=None, *, progress: bool = False) -> dict[str, dict[str, np.ndarray]]:
    """Static scores of every node, per type: ``{type: {score name: float32 [num_nodes[type]]}}``, of a
    :class:`HeteroDatasetWriter` being written or an opened :class:`~lsm_gnn.data.dataset.Dataset`.

    The cache keys rows by global id, and sampling reaches a node through any relation, so the scores rank
    all types together: those of :mod:`lsm_gnn.data.scores` on one graph, the union of every relation in
    the global id space (``reverse_pagerank`` sums to 1 over every node of every type; an edge in two
    relations counts twice, as the typed sampler reaches it through each). That graph's CSR is built in
    bounded memory in a temporary directory (inside a writer's, or named as a writer's temporary beside
    the dataset, so a later writer removes one a killed process left) and removed before returning.
    """
    from lsm_gnn.data.scores import SCORE_NAMES, compute_scores  # imports torch: only when scores are made

    names = SCORE_NAMES if names is None else tuple(names)
    unknown = sorted(set(names) - set(SCORE_NAMES))
    if unknown:
        raise ValueError(f"unknown score(s) {unknown}; valid names are {', '.join(SCORE_NAMES)}")
    counts = {e["name"]: int(e["num_nodes"]) for e in source.meta["node_types"]}
    offsets, total = type_offsets(counts), sum(counts.values())
    relations = [(r["src"], r["name"], r["dst"]) for r in source.meta["relations"]]
    if isinstance(source, AtomicDatasetWriter):  # dies with the writer's temporary directory
        workdir = tempfile.mkdtemp(prefix=".scores-", dir=source.tmp)
    else:
        workdir = make_temporary(source.path, directory=True)
    num_edges = sum(int(source.csr(r)[0][-1]) for r in relations)
    try:
        with progress_bar(progress, total=num_edges, desc="scores", unit="edge", unit_scale=True) as bar:
            def union_edges():
                for src, name, dst in relations:
                    for chunk in csr_edge_chunks(*source.csr((src, name, dst)), src_offset=offsets[src],
                                                 dst_offset=offsets[dst]):
                        bar.update(chunk[0].size)
                        yield chunk

            # No dedup pass: the scores need no sorted rows.
            build_csr_files(workdir, "", union_edges(), total, total, dedup=False)
        indptr = np.load(os.path.join(workdir, "indptr.npy"), mmap_mode="r")
        indices = np.load(os.path.join(workdir, "indices.npy"), mmap_mode="r")
        scores = compute_scores(indptr, indices, names)
        del indptr, indices
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {t: {name: np.array(values[offsets[t]:offsets[t] + n]) for name, values in scores.items()}
            for t, n in counts.items()}
