"""IGBH-shaped heterogeneous synthetic datasets (schema 2) whose paper labels a heterogeneous GNN can learn.

:func:`generate_hetero_synthetic` streams a dataset to disk in bounded memory
(per node type at most a few arrays of ``num_nodes`` entries, as the
homogeneous generator; features and edges in fixed blocks):

* **Node types**, in global id order: ``paper`` (the target, with labels and
  splits), ``author``, ``institute`` and ``fos`` (field of study), by
  default about 1.2 authors, 0.005 institutes and 0.01 fields per paper.
* **Classes**: a paper's class is its label, :func:`~lsm_gnn.data.synthetic.community`
  of its id. Every other node has a class too, a balanced assignment
  scattered by a seeded :class:`~lsm_gnn.data.synthetic.AffineBijection`
  (``perm(id) % num_classes``), so even a type with as many nodes as
  classes has one in each.
* **Relations** (PyG's ``(src, name, dst)``, messages flow src -> dst):
  ``paper cites paper`` is the homogeneous generator's R-MAT graph
  (:func:`~lsm_gnn.data.synthetic.synthetic_edges`: power law, hubs scattered,
  a share ``homophily`` of the edges rewired into the citing paper's class).
  ``author writes paper``, ``author affiliated_with institute`` and
  ``paper has_topic fos`` are drawn: every paper (author) draws a geometric
  number of authors (institutes, fields), each of its own class with
  probability ``affinity[name]``, else of a uniform class, and within the
  class by a Zipf law of exponent ``popularity``
  (:class:`~lsm_gnn.data.synthetic.PopularitySampler`), so authors' paper
  counts and fields' sizes follow a power law; every author (institute,
  field) also draws one paper (author, paper) as an anchor, so that none is
  left without an edge. The reverses ``paper written_by author``,
  ``institute employs author`` and ``fos topic_of paper`` are the exact
  transposes of the stored forward CSRs.
* **Features**: the centroid of the node's class (one set of centroids per
  type) plus unit Gaussian noise per dimension; the centroid norm
  ``class_separation[type]`` is small for papers (their features alone
  classify poorly) and larger for authors and fields, so a paper's authors
  and topics reveal its class: what a two-layer heterogeneous GNN learns.
* **Scores**: static scores on the union of all relations in the global id
  space (:meth:`~lsm_gnn.data.hetero_writer.HeteroDatasetWriter.write_union_scores`).

Every part draws from its own RNG stream, seeded by ``(seed, stream,
block)`` over fixed blocks (``FEATURE_BLOCK`` rows, ``EDGE_BLOCK`` citations,
``SOURCE_BLOCK`` drawing papers or authors), so the output depends only on
the parameters, never on ``chunk_nodes`` or on the CSR builder's chunks.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lsm_gnn.data.convert import check_split_fractions
from lsm_gnn.data.format import MAX_CLASSES
from lsm_gnn.data.dataset import Dataset, relation_key
from lsm_gnn.data.hetero_writer import HeteroDatasetWriter
from lsm_gnn.data.scores import SCORE_NAMES
from lsm_gnn.data.synthetic import (
    DEFAULT_RMAT,
    AffineBijection, PopularitySampler, check_feature_dtype, check_probability, check_rmat, check_score_names,
    check_seed, class_centroids, community, counted, note, positive_int, rng_for, synthetic_edges,
    write_community_labels, write_synthetic_features,
)
from lsm_gnn.data.writer import csr_edge_chunks
from lsm_gnn.utils.progress import progress_bar

SOURCE_BLOCK = 1 << 16  # drawing papers (authors) per RNG block of a drawn relation
GENERATOR_VERSION = 1   # bump when the output for given parameters changes

NODE_TYPES = ("paper", "author", "institute", "fos")
CITES = ("paper", "cites", "paper")
WRITES, WRITTEN_BY = ("author", "writes", "paper"), ("paper", "written_by", "author")
AFFILIATED_WITH, EMPLOYS = ("author", "affiliated_with", "institute"), ("institute", "employs", "author")
HAS_TOPIC, TOPIC_OF = ("paper", "has_topic", "fos"), ("fos", "topic_of", "paper")
RELATIONS = (CITES, WRITES, WRITTEN_BY, AFFILIATED_WITH, EMPLOYS, HAS_TOPIC, TOPIC_OF)

DEFAULT_FEATURE_DIM = 128
NODES_PER_PAPER = {"author": 1.2, "institute": 0.005, "fos": 0.01}  # IGBH's proportions, roughly
MIN_INSTITUTES = 4
# Papers' features alone classify poorly; their authors' and fields' features say more.
DEFAULT_SEPARATION = {"paper": 1.0, "author": 2.0, "institute": 1.5, "fos": 3.0}
DEFAULT_AFFINITY = {"writes": 0.75, "affiliated_with": 0.6, "has_topic": 0.75}

# Streams 0-5 are synthetic.py's (the citations reuse its edge streams, the split its split stream), 16-17
# bipartite.py's. Node type k draws from 32 + 8k + part, each drawn relation from its own stream.
_CENTROIDS, _FEATURES, _CLASSES, _POPULARITY, _ANCHOR_ORDER = range(5)
_STREAM_DRAWN = {"writes": 80, "affiliated_with": 81, "has_topic": 82}
_STREAM_ANCHORS = {"writes": 88, "affiliated_with": 89, "has_topic": 90}


def _type_stream(node_type: str, part: int) -> int:
    return 32 + 8 * NODE_TYPES.index(node_type) + part


# The drawn relations: (forward relation, reverse relation, drawing type, drawn type, draws per drawing node).
_DRAWN = (
    (WRITES, WRITTEN_BY, "paper", "author", "authors_per_paper"),
    (AFFILIATED_WITH, EMPLOYS, "author", "institute", "institutes_per_author"),
    (HAS_TOPIC, TOPIC_OF, "paper", "fos", "topics_per_paper"),
)


class _Classes:
    """The class of each node of one type: papers' is their label, other types' a balanced assignment."""

    def __init__(self, node_type: str, num_nodes: int, seed: int, num_classes: int):
        self.num_classes = num_classes
        self.seed = seed
        self.perm = None if node_type == "paper" else AffineBijection(num_nodes, seed,
                                                                       _type_stream(node_type, _CLASSES))

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        if self.perm is None:
            return community(ids, self.seed, self.num_classes)
        return self.perm(ids) % self.num_classes


class _TypeSampler:
    """A :class:`PopularitySampler` over one type's nodes that takes the classes of another type's sources.

    A class the type lacks (a type with fewer nodes than classes, or a few papers) is drawn as another one:
    the sampler numbers the present classes densely and a lookup maps every class to one of them."""

    def __init__(self, node_type: str, num_nodes: int, classes: _Classes, seed: int, part: int, popularity: float):
        node_classes = classes(np.arange(num_nodes))
        present = np.flatnonzero(np.bincount(node_classes, minlength=classes.num_classes))
        self.lookup = np.arange(classes.num_classes) % present.size
        self.lookup[present] = np.arange(present.size)
        self.sampler = PopularitySampler(self.lookup[node_classes], present.size,
                                         rng_for(seed, _type_stream(node_type, part)), popularity)

    def draw_block(self, rng: np.random.Generator, start: int, stop: int, mean_draws: float,
                   source_classes: _Classes, affinity: float) -> tuple[np.ndarray, np.ndarray]:
        return self.sampler.draw_block(rng, start, stop, mean_draws, lambda ids: self.lookup[source_classes(ids)],
                                       affinity)


def _drawn_edges(drawing: str, drawn: str, num_nodes: dict[str, int], classes: dict[str, _Classes], *,
                 seed: int, name: str, mean_draws: float, affinity: float, popularity: float):
    """(drawing ids, drawn ids) chunks of one drawn relation, one per block of ``SOURCE_BLOCK`` nodes.

    Popular nodes get most draws and the tail of the Zipf law none, so anchors follow: every drawn node
    also draws one drawing node (of its class with probability ``affinity``, uniform within the class),
    and no author is left without a paper, no field or institute without members."""
    popular = _TypeSampler(drawn, num_nodes[drawn], classes[drawn], seed, _POPULARITY, popularity)
    for index, start in enumerate(range(0, num_nodes[drawing], SOURCE_BLOCK)):
        stop = min(start + SOURCE_BLOCK, num_nodes[drawing])
        yield popular.draw_block(rng_for(seed, _STREAM_DRAWN[name], index), start, stop, mean_draws, classes[drawing],
                                 affinity)
    del popular
    uniform = _TypeSampler(drawing, num_nodes[drawing], classes[drawing], seed, _ANCHOR_ORDER, 0.0)
    for index, start in enumerate(range(0, num_nodes[drawn], SOURCE_BLOCK)):
        stop = min(start + SOURCE_BLOCK, num_nodes[drawn])
        drawn_ids, drawing_ids = uniform.draw_block(rng_for(seed, _STREAM_ANCHORS[name], index), start, stop, 1.0,
                                                    classes[drawn], affinity)
        yield drawing_ids, drawn_ids


def _node_counts(num_papers, num_authors, num_institutes, num_fos, num_classes) -> dict[str, int]:
    given = {"author": num_authors, "institute": num_institutes, "fos": num_fos}
    defaults = {"author": max(1, round(NODES_PER_PAPER["author"] * num_papers)),
                "institute": max(MIN_INSTITUTES, round(NODES_PER_PAPER["institute"] * num_papers)),
                "fos": max(num_classes, round(NODES_PER_PAPER["fos"] * num_papers))}
    counts = {"paper": num_papers}
    for t in NODE_TYPES[1:]:
        counts[t] = defaults[t] if given[t] is None else positive_int(given[t], f"num_{t}")
    return counts


def _feature_dims(feature_dim) -> dict[str, int | None]:
    """Per-type dims from one dim or a dict (types it leaves out get ``DEFAULT_FEATURE_DIM``); 0 or None: none."""
    if isinstance(feature_dim, dict):
        unknown = sorted(set(feature_dim) - set(NODE_TYPES))
        if unknown:
            raise ValueError(f"feature_dim names unknown node type(s) {unknown}; the types are {', '.join(NODE_TYPES)}")
        dims = {t: feature_dim.get(t, DEFAULT_FEATURE_DIM) for t in NODE_TYPES}
    else:
        dims = dict.fromkeys(NODE_TYPES, feature_dim)
    return {t: None if not d else positive_int(d, f"feature_dim of '{t}'") for t, d in dims.items()}


def _per_key(given: dict | None, defaults: dict, what: str) -> dict:
    unknown = sorted(set(given or {}) - set(defaults))
    if unknown:
        raise ValueError(f"{what} names unknown key(s) {unknown}; valid: {', '.join(defaults)}")
    return {**defaults, **(given or {})}


@dataclass(frozen=True)
class _Parameters:
    """The checked parameters of one generated dataset."""
    num_nodes: dict[str, int]
    dims: dict[str, int | None]
    dtype: np.dtype
    num_classes: int
    seed: int
    rmat: tuple[float, float, float, float]
    split: tuple[float, float, float]
    scores: tuple[str, ...]
    homophily: float
    affinity: dict[str, float]
    separation: dict[str, float]
    means: dict[str, float]  # mean draws per drawing node, by the keyword that sets them
    citations_per_paper: float
    popularity: float

    @classmethod
    def check(cls, *, num_papers, num_authors, num_institutes, num_fos, feature_dim, feature_dtype, num_classes, seed,
              rmat, split, scores, homophily, affinity, class_separation, means, citations_per_paper,
              popularity) -> _Parameters:
        """:func:`generate_hetero_synthetic`'s arguments, checked (the first bad one raises), defaults filled in."""
        num_papers = positive_int(num_papers, "num_papers")
        num_classes = positive_int(num_classes, "num_classes")
        if num_classes > MAX_CLASSES:
            raise ValueError(f"num_classes must be at most {MAX_CLASSES}, got {num_classes}")
        num_nodes = _node_counts(num_papers, num_authors, num_institutes, num_fos, num_classes)
        dims, dtype = _feature_dims(feature_dim), check_feature_dtype(feature_dtype)
        seed, rmat, split = check_seed(seed), check_rmat(rmat), check_split_fractions(split)
        scores = check_score_names(scores)
        check_probability(homophily, "homophily")
        affinity = _per_key(affinity, DEFAULT_AFFINITY, "affinity")
        for key, value in affinity.items():
            check_probability(value, f"affinity of '{key}'")
        separation = _per_key(class_separation, DEFAULT_SEPARATION, "class_separation")
        if min(separation.values()) < 0:
            raise ValueError(f"class_separation must be >= 0 for every type, got {separation}")
        for key, value in means.items():
            if not value >= 1:
                raise ValueError(f"{key} must be >= 1 (every node draws at least one), got {value}")
        if not citations_per_paper >= 0:
            raise ValueError(f"citations_per_paper must be >= 0, got {citations_per_paper}")
        if not popularity >= 0:
            raise ValueError(f"popularity must be >= 0, got {popularity}")
        return cls(num_nodes, dims, dtype, num_classes, seed, rmat, split, scores, homophily, affinity, separation,
                   means, citations_per_paper, popularity)

    @property
    def num_citations(self) -> int:
        """Citations generated (before self-loops and repeats are dropped)."""
        return int(round(self.num_nodes["paper"] * self.citations_per_paper))

    def record(self) -> dict:
        """The ``generator`` entry of ``meta.json``."""
        return {
            "kind": "hetero-communities", "version": GENERATOR_VERSION, "num_nodes": self.num_nodes,
            "feature_dim": self.dims, "feature_dtype": self.dtype.name, "num_classes": self.num_classes,
            "seed": self.seed, "citations_per_paper": self.citations_per_paper,
            "citations_generated": self.num_citations, **self.means, "homophily": self.homophily,
            "affinity": self.affinity, "popularity": self.popularity, "class_separation": self.separation,
            "feature_noise": 1.0, "rmat": list(self.rmat), "split": list(self.split),
        }

    def node_types(self) -> dict[str, dict]:
        """The writer's node types: each one's count, and its feature width and dtype where it has features."""
        return {t: {"num_nodes": self.num_nodes[t]} if self.dims[t] is None else
                {"num_nodes": self.num_nodes[t], "feature_dim": self.dims[t], "feature_dtype": self.dtype.name}
                for t in NODE_TYPES}


def generate_hetero_synthetic(path, *, num_papers: int, num_authors: int | None = None,
                              num_institutes: int | None = None, num_fos: int | None = None,
                              feature_dim: int | dict = DEFAULT_FEATURE_DIM, feature_dtype: str = "float32",
                              num_classes: int = 19, seed: int = 0, citations_per_paper: float = 10.0,
                              authors_per_paper: float = 2.0, topics_per_paper: float = 2.0,
                              institutes_per_author: float = 1.0, homophily: float = 0.6,
                              affinity: dict | None = None, class_separation: dict | None = None,
                              popularity: float = 0.8,
                              rmat: tuple[float, float, float, float] = DEFAULT_RMAT,
                              split: tuple[float, float, float] = (0.6, 0.2, 0.2), scores=SCORE_NAMES,
                              overwrite: bool = False, progress: bool = True, chunk_nodes: int = 1 << 16,
                              name: str | None = None) -> Dataset:
    """Writes an IGBH-shaped heterogeneous dataset to ``path`` and returns it opened (see the module docstring).

    ``num_authors``, ``num_institutes``, ``num_fos`` default to 1.2, 0.005
    (at least ``MIN_INSTITUTES``) and 0.01 (at least ``num_classes``) times
    ``num_papers``. ``feature_dim`` is one dim for every type or a dict of
    per-type dims (0 or None: the type has no features). ``*_per_paper``
    and ``institutes_per_author`` are mean draws before repeats are dropped
    (at least one each, geometric); ``citations_per_paper`` is the number
    of citations generated per paper (``meta.json`` has the exact edge
    counts). ``homophily`` is the share of citations rewired into the citing
    paper's class; ``affinity`` maps ``writes``, ``affiliated_with`` and
    ``has_topic`` to the probability that a draw picks the drawing node's
    class; ``class_separation`` maps node types to their centroid norm
    against unit per-dimension noise (both merge into ``DEFAULT_AFFINITY``
    and ``DEFAULT_SEPARATION``); ``popularity`` is the Zipf exponent of the
    drawn nodes' degrees. ``chunk_nodes`` bounds the feature rows generated
    per write and does not change the output. ``overwrite`` replaces an
    lsm-gnn dataset at ``path``, never anything else.
    """
    p = _Parameters.check(num_papers=num_papers, num_authors=num_authors, num_institutes=num_institutes,
                          num_fos=num_fos, feature_dim=feature_dim, feature_dtype=feature_dtype,
                          num_classes=num_classes, seed=seed, rmat=rmat, split=split, scores=scores,
                          homophily=homophily, affinity=affinity, class_separation=class_separation,
                          means={"authors_per_paper": authors_per_paper, "topics_per_paper": topics_per_paper,
                                 "institutes_per_author": institutes_per_author},
                          citations_per_paper=citations_per_paper, popularity=popularity)
    classes = {t: _Classes(t, p.num_nodes[t], p.seed, p.num_classes) for t in NODE_TYPES}
    with HeteroDatasetWriter(path, node_types=p.node_types(), target="paper", name=name, overwrite=overwrite,
                             extra_meta={"generator": p.record()}) as writer:
        _write_type_features(writer, p, classes, chunk_nodes, progress)
        _write_citations(writer, p, progress)
        _write_drawn_relations(writer, p, classes, progress)
        write_community_labels(writer, "paper", p.num_nodes["paper"], p.seed, p.num_classes, p.split)
        if p.scores:
            note(progress, f"computing scores on the union of {len(RELATIONS)} relations: {', '.join(p.scores)}")
            writer.write_union_scores(p.scores)
        note(progress, "committing (checksums, fsync)")
        return writer.commit()


def _write_type_features(writer: HeteroDatasetWriter, p: _Parameters, classes: dict[str, _Classes],
                         chunk_nodes: int, progress: bool) -> None:
    """Each featured type's rows, its class centroid plus unit noise, ``chunk_nodes`` rows per write."""
    for t in NODE_TYPES:
        if p.dims[t] is None:
            continue
        centroids = class_centroids(p.seed, p.num_classes, p.dims[t], p.separation[t],
                                    stream=_type_stream(t, _CENTROIDS))
        write_synthetic_features(lambda rows, t=t: writer.write_features(t, rows), p.num_nodes[t], chunk_nodes,
                                 p.dtype, progress, f"{t} features", seed=p.seed, centroids=centroids,
                                 classes=classes[t], stream=_type_stream(t, _FEATURES))


def _write_citations(writer: HeteroDatasetWriter, p: _Parameters, progress: bool) -> None:
    """``paper cites paper``: the homogeneous generator's R-MAT graph, rewired by ``homophily``."""
    with progress_bar(progress, total=p.num_citations, desc=relation_key(CITES), unit="edge", unit_scale=True) as bar:
        edges = synthetic_edges(p.num_nodes["paper"], p.num_citations, seed=p.seed, num_classes=p.num_classes,
                                homophily=p.homophily, rmat=p.rmat)
        writer.write_edges(CITES, counted(edges, bar), self_loops=False)


def _write_drawn_relations(writer: HeteroDatasetWriter, p: _Parameters, classes: dict[str, _Classes],
                           progress: bool) -> None:
    """Each drawn relation (authors, affiliations, topics) and its reverse, the transpose of its CSR."""
    for forward, reverse, drawing, drawn, mean_key in _DRAWN:
        relation_name = forward[1]
        with progress_bar(progress, desc=relation_key(forward), unit="edge", unit_scale=True) as bar:
            edges = _drawn_edges(drawing, drawn, p.num_nodes, classes, seed=p.seed, name=relation_name,
                                 mean_draws=p.means[mean_key], affinity=p.affinity[relation_name],
                                 popularity=p.popularity)
            if forward[0] == drawn:  # the drawn node sends: (drawn, drawing) is (src, dst)
                edges = ((drawn_ids, drawing_ids) for drawing_ids, drawn_ids in edges)
            writer.write_edges(forward, counted(edges, bar))
        note(progress, f"{relation_key(reverse)}: the transpose of {relation_key(forward)}")
        # The forward CSR has no repeats and is read in row order, so every reverse row comes out
        # sorted and distinct: no dedup pass.
        writer.write_edges(reverse, ((dst, src) for src, dst in csr_edge_chunks(*writer.csr(forward))),
                           dedup=False)


__all__ = ["NODE_TYPES", "RELATIONS", "generate_hetero_synthetic"]
