"""Writes heterogeneous (schema-2) datasets atomically and in bounded memory.

The typed core :class:`~lsm_gnn.data.writer.TypedDatasetWriter` with schema 2's
layout, so the same guarantees as :class:`~lsm_gnn.data.writer.DatasetWriter`
(the core with one type): everything goes to a hidden temporary directory that
:meth:`HeteroDatasetWriter.commit` validates and renames into place, an
error removes it, a full disk is named by file. Layout: :mod:`lsm_gnn.data.hetero`.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np

from lsm_gnn.data.dataset import Relation, relation_key, type_offsets
from lsm_gnn.data.format import FORMAT_NAME, HETERO_SCHEMA_VERSION, DatasetError, check_name
from lsm_gnn.data.writer import AtomicDatasetWriter, TypedDatasetWriter, build_csr_files, csr_edge_chunks
from lsm_gnn.utils.fileio import make_temporary
from lsm_gnn.utils.progress import progress_bar
from lsm_gnn.version import __version__


class HeteroDatasetWriter(TypedDatasetWriter):
    """Builds one schema-2 dataset directory: the typed writer with each type's files under ``nodes/<type>/``
    and each relation's under ``relations/<src>__<name>__<dst>/``.

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
        for type_name, spec in node_types.items():
            check_name(type_name, "node type")
            if not isinstance(spec, dict) or set(spec) - {"num_nodes", "feature_dim", "feature_dtype"}:
                raise ValueError(f"node type '{type_name}' must be given as {{'num_nodes': n, 'feature_dim': d, "
                                 f"'feature_dtype': ...}} (features optional), got {spec!r}")
            n = spec.get("num_nodes")
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0:
                raise ValueError(f"node type '{type_name}' needs a positive num_nodes, got {n!r}")
        if target is not None and target not in node_types:
            raise ValueError(f"target type {target!r} is not one of the node types ({', '.join(node_types)})")
        super().__init__(path, overwrite)
        entries = {t: {"name": t, "num_nodes": int(spec["num_nodes"]), "features": None, "labels": None,
                       "num_classes": None, "splits": {}, "scores": {}} for t, spec in node_types.items()}
        self.meta = {
            "format": FORMAT_NAME, "version": HETERO_SCHEMA_VERSION, "name": name or os.path.basename(self.path),
            "node_types": list(entries.values()), "relations": [], "target": target, "checksums": {},
            "created_by": "lsm-gnn " + __version__, **(extra_meta or {}),
        }
        self._add_types(entries, node_types, row_alignment, lambda t: f"node type '{t}'")

    def _type_dir(self, node_type: str) -> str:
        return f"nodes/{node_type}/"

    def _relation_dir(self, relation: Relation) -> str:
        os.makedirs(os.path.join(self.tmp, "relations", relation_key(relation)))
        return f"relations/{relation_key(relation)}/"

    def _record_relation(self, relation: Relation, prefix: str, num_edges: int) -> None:
        self.meta["relations"].append(self._relations[relation])

    def _of(self, node_type: str) -> str:
        return f" of node type '{node_type}'"

    def write_union_scores(self, names=None, progress: bool = False) -> None:
        """Computes static scores (default: all of :data:`~lsm_gnn.data.scores.SCORE_NAMES`) on the union of
        the relations written so far (:func:`hetero_scores`) and writes each type's slice."""
        for t, per_type in hetero_scores(self, names, progress=progress).items():
            for name, scores in per_type.items():
                self.write_score(t, name, scores)

    def _finish(self) -> None:
        target = self.meta["target"]
        if target is not None and self._entries[target]["labels"] is None:
            raise DatasetError(f"{self.path}: target type '{target}' has no labels; call write_labels('{target}', "
                               "...) or give no target")
        self._finish_features()


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
    from lsm_gnn.data.scores import SCORE_NAMES, check_score_names, compute_scores

    names = SCORE_NAMES if names is None else check_score_names(names)
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
