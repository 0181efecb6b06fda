"""Synthetic power-law graphs whose labels a GNN can really learn.

:func:`generate_synthetic` streams a dataset to disk in bounded memory:

* **Topology**: R-MAT (Kronecker) edges, generated in fixed blocks of
  ``EDGE_BLOCK`` edges, each from its own RNG seeded by ``(seed, block)``, so
  the graph depends only on the parameters, never on chunk sizes. Node ids of
  ``num_nodes`` that is not a power of two come from rejection: R-MAT runs at
  the next power of two and edges with an endpoint past ``num_nodes`` are
  drawn again, which keeps the R-MAT distribution exactly (conditioned on the
  range). R-MAT puts its hubs at ids with many zero bits (0, 1, 2, 4, ...); a
  seeded affine bijection then scatters them over the id space.
* **Communities**: node ``v`` belongs to class ``mix(v) % num_classes`` (a
  seeded integer hash, so balanced and free to evaluate). With probability
  ``homophily`` an edge's destination is redrawn from the block's own
  destination samples of the source's class: the rewired endpoint keeps the
  R-MAT degree bias, so the power law survives.
* **Features**: class centroid plus Gaussian noise, in fixed blocks of
  ``FEATURE_BLOCK`` rows, each with its own RNG. Centroids have norm about
  ``class_separation``, noise has unit variance per dimension: features alone
  classify poorly, averaging a node's (mostly same-class) neighbors helps a
  lot, which is what a GNN does.

Labels are the communities; splits come from a seeded permutation; static
scores are computed on the written CSR before the atomic commit.
"""
from __future__ import annotations

import math
import sys
from typing import Callable, Iterable, Iterator

import numpy as np

from lsm_gnn.data.dataset import Dataset
from lsm_gnn.data.scores import SCORE_NAMES, check_score_names
from lsm_gnn.data.format import ONE_TYPE
from lsm_gnn.data.writer import DatasetWriter, TypedDatasetWriter
from lsm_gnn.utils.progress import progress_bar

EDGE_BLOCK = 1 << 21     # edges per RNG block (~100 MB of temporaries)
FEATURE_BLOCK = 1 << 12  # feature rows per RNG block; chunks are whole blocks
GENERATOR_VERSION = 1    # bump when the output for given parameters changes

# Independent RNG streams, one per part, so changing one part never shifts another.
_STREAM_PERMUTATION, _STREAM_CENTROIDS, _STREAM_FEATURES, _STREAM_EDGES, STREAM_SPLIT, _STREAM_ANCHORS = range(6)
_MASK64 = (1 << 64) - 1


#: R-MAT's quadrant probabilities A, B, C, D (Graph500's): a power-law degree skew
DEFAULT_RMAT = (0.57, 0.19, 0.19, 0.05)

def rng_for(seed: int, stream: int, block: int = 0) -> np.random.Generator:
    """The RNG of one part (``stream``) and block of a generated dataset: parts never shift one another."""
    return np.random.default_rng([seed, stream, block])


# -- node ids ------------------------------------------------------------------

class AffineBijection:
    """``v = (mult * r + shift) mod n`` with ``gcd(mult, n) = 1``.

    It is a bijection on ``[0, n)``: if ``mult*r1 + shift = mult*r2 + shift
    (mod n)`` then ``n`` divides ``mult*(r1 - r2)``, and since ``mult`` and
    ``n`` share no factor, ``n`` divides ``r1 - r2``, so ``r1 = r2``; an
    injective map of a finite set onto itself is onto. Costs no memory, so it
    works for any ``n``; products are split into 16-bit limbs so that nothing
    overflows int64 for ``n < 2**46``.
    """

    def __init__(self, n: int, seed: int, stream: int = _STREAM_PERMUTATION):
        if not 0 < n < 1 << 46:
            raise ValueError(f"num_nodes must be in [1, 2**46), got {n}")
        self.n = n
        rng = rng_for(seed, stream)
        # Start near n / golden ratio (Fibonacci hashing spreads consecutive ids
        # furthest apart), jittered by the seed, then step to a unit mod n.
        mult = (int(n * 0.6180339887) + int(rng.integers(0, max(1, n // 64) + 1))) % n if n > 1 else 0
        while math.gcd(mult, n) != 1:
            mult = (mult + 1) % n
        self.mult = mult
        self.shift = int(rng.integers(0, n))

    def __call__(self, r: np.ndarray) -> np.ndarray:
        r = np.asarray(r, dtype=np.int64)
        n, mult = self.n, self.mult
        if mult * (n - 1) + n < 1 << 63:
            return (r * mult + self.shift) % n
        # Horner over 16-bit limbs of mult: acc < n, so acc << 16 + limb * r < 2**63.
        acc = np.zeros_like(r)
        for shift in range((mult.bit_length() + 15) // 16 * 16 - 16, -16, -16):
            acc = ((acc << 16) + ((mult >> shift) & 0xFFFF) * r) % n
        return (acc + self.shift) % n


def community(ids: np.ndarray, seed: int, num_classes: int) -> np.ndarray:
    """Class of each node id: a seeded splitmix64 hash mod ``num_classes`` (int64)."""
    key = np.uint64((seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & _MASK64)
    x = np.asarray(ids, dtype=np.int64).astype(np.uint64) ^ key
    # Arrays wrap silently on uint64 overflow, which is what the hash wants.
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    return (x % np.uint64(num_classes)).astype(np.int64)


def community_labels(num_nodes: int, seed: int, num_classes: int, chunk: int = 1 << 22) -> np.ndarray:
    """:func:`community` of every node ``[0, num_nodes)``, computed in chunks to bound the hash's temporaries."""
    labels = np.empty(num_nodes, dtype=np.int64)
    for start in range(0, num_nodes, chunk):
        stop = min(start + chunk, num_nodes)
        labels[start:stop] = community(np.arange(start, stop), seed, num_classes)
    return labels


class PopularitySampler:
    """Draws nodes of a wanted class, within the class by a Zipf law of
    exponent ``popularity`` over a seeded ranking, so that the drawn nodes'
    degrees are skewed (as authors' paper counts or items' buyers are).

    ``classes`` gives each node's class in ``[0, num_classes)``, every class
    non-empty. Nodes are ordered by (class, rank); the CDF runs through
    ``(c, c + 1]`` within class ``c``, so a node of class ``c`` is
    ``order[searchsorted(cdf, c + uniform)]``. Holds 16 bytes per node.
    """

    def __init__(self, classes: np.ndarray, num_classes: int, rank_rng: np.random.Generator, popularity: float):
        sizes = np.bincount(classes, minlength=num_classes)
        if not sizes.all():
            raise ValueError(f"class {int(np.argmin(sizes))} of {num_classes} has no nodes to draw")
        self.num_classes = num_classes
        self.order = np.lexsort((rank_rng.random(classes.size), classes))
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        rank = np.arange(classes.size) - np.repeat(starts, sizes)
        weight = np.cumsum((rank + 1.0) ** -popularity)
        before = np.repeat(np.concatenate([[0.0], weight])[starts], sizes)  # cumulative weight of earlier classes
        total = np.repeat(weight[starts + sizes - 1], sizes) - before
        cdf = (weight - before) / total + np.repeat(np.arange(num_classes), sizes)
        cdf[starts + sizes - 1] = np.arange(num_classes) + 1  # exact block ends: no draw falls between blocks
        self.cdf = cdf

    def draw(self, rng: np.random.Generator, source_classes: np.ndarray, affinity: float) -> np.ndarray:
        """One node per source: of the source's class with probability ``affinity``, else of a uniform class."""
        own = rng.random(source_classes.size) < affinity
        wanted = np.where(own, source_classes, rng.integers(0, self.num_classes, source_classes.size))
        return self.order[np.searchsorted(self.cdf, wanted + rng.random(source_classes.size), side="right")]

    def draw_block(self, rng: np.random.Generator, start: int, stop: int, mean_draws: float,
                   source_classes: Callable[[np.ndarray], np.ndarray], affinity: float
                   ) -> tuple[np.ndarray, np.ndarray]:
        """(sources, drawn nodes) for sources ``[start, stop)``: each source makes a geometric number of draws
        (mean ``mean_draws``, at least one) by :meth:`draw`; ``source_classes`` maps source ids to classes."""
        sources = np.repeat(np.arange(start, stop), rng.geometric(1.0 / mean_draws, stop - start))
        return sources, self.draw(rng, source_classes(sources), affinity)


# -- edges -----------------------------------------------------------------------

def _rmat_pairs(rng: np.random.Generator, count: int, n: int, probs: tuple[float, float, float, float]
                ) -> tuple[np.ndarray, np.ndarray]:
    """``count`` R-MAT (src, dst) pairs with both ends in ``[0, n)`` (rejection sampling)."""
    a, b, c, _ = probs
    scale = max(1, (n - 1).bit_length())
    src_parts, dst_parts = [], []
    have = 0
    accept = 1.0 if n == 1 << scale else 0.5  # refined from what each round keeps
    while have < count:
        k = int((count - have) / accept * 1.05) + 64
        src = np.zeros(k, dtype=np.int64)
        dst = np.zeros(k, dtype=np.int64)
        for level in range(scale):
            u = rng.random(k, dtype=np.float32)
            # Quadrants a | b / c | d: src takes the lower half in a and b, dst in a and c.
            src |= (u >= a + b).astype(np.int64) << level
            dst |= (((u >= a) & (u < a + b)) | (u >= a + b + c)).astype(np.int64) << level
        keep = (src < n) & (dst < n)
        kept = int(keep.sum())
        accept = max(kept / k, 0.01)
        take = min(kept, count - have)
        src_parts.append(src[keep][:take])
        dst_parts.append(dst[keep][:take])
        have += take
    return np.concatenate(src_parts), np.concatenate(dst_parts)


def _rmat_nodes(rng: np.random.Generator, count: int, n: int, p_one: float) -> np.ndarray:
    """``count`` ids from one R-MAT marginal (each bit is 1 with probability ``p_one``), in ``[0, n)``."""
    scale = max(1, (n - 1).bit_length())
    parts, have = [], 0
    accept = 1.0 if n == 1 << scale else 0.5
    while have < count:
        k = int((count - have) / accept * 1.05) + 64
        ids = np.zeros(k, dtype=np.int64)
        for level in range(scale):
            ids |= (rng.random(k, dtype=np.float32) < p_one).astype(np.int64) << level
        ids = ids[ids < n]
        accept = max(ids.size / k, 0.01)
        parts.append(ids[:count - have])
        have += parts[-1].size
    return np.concatenate(parts)


def _rewire(rng: np.random.Generator, src: np.ndarray, dst: np.ndarray, classes_src: np.ndarray,
            classes_dst: np.ndarray, num_classes: int, homophily: float) -> np.ndarray:
    """Redraws each destination with probability ``homophily`` from the block's
    destinations of the source's class (a degree-biased draw within the class)."""
    order = np.argsort(classes_dst, kind="stable")
    pool, pool_class = dst[order], classes_dst[order]
    starts = np.searchsorted(pool_class, np.arange(num_classes), side="left")
    sizes = np.searchsorted(pool_class, np.arange(num_classes), side="right") - starts
    u_move = rng.random(src.size)
    u_pick = rng.random(src.size)
    size = sizes[classes_src]
    move = (u_move < homophily) & (size > 0)  # an empty class in a tiny block keeps the R-MAT edge
    pick = starts[classes_src] + np.minimum((u_pick * size).astype(np.int64), np.maximum(size - 1, 0))
    return np.where(move, pool[np.minimum(pick, pool.size - 1)], dst)


def synthetic_edges(num_nodes: int, num_edges: int, *, seed: int, num_classes: int, homophily: float,
                    rmat: tuple[float, float, float, float], block: int = EDGE_BLOCK
                    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yields (src, dst) chunks of the generated edge list, block by block.

    The first ``min(num_nodes, num_edges)`` edges are anchors, one from every
    node to a degree-biased partner, so that no node is isolated (plain R-MAT
    leaves a third of them so, and a GNN cannot help a node without
    neighbors); the rest are R-MAT edges.
    """
    perm = AffineBijection(num_nodes, seed)
    num_anchors = min(num_nodes, num_edges)
    dst_bit = rmat[1] + rmat[3]  # R-MAT's destination marginal: each bit is 1 with probability b + d
    for index, start in enumerate(range(0, num_anchors, block)):
        rng = rng_for(seed, _STREAM_ANCHORS, index)
        src = np.arange(start, min(start + block, num_anchors), dtype=np.int64)
        dst = perm(_rmat_nodes(rng, src.size, num_nodes, dst_bit))
        yield src, _maybe_rewire(rng, src, dst, seed, num_classes, homophily)
    for index, start in enumerate(range(0, num_edges - num_anchors, block)):
        rng = rng_for(seed, _STREAM_EDGES, index)
        r_src, r_dst = _rmat_pairs(rng, min(block, num_edges - num_anchors - start), num_nodes, rmat)
        src, dst = perm(r_src), perm(r_dst)
        yield src, _maybe_rewire(rng, src, dst, seed, num_classes, homophily)


def _maybe_rewire(rng, src, dst, seed: int, num_classes: int, homophily: float) -> np.ndarray:
    if homophily <= 0 or num_classes < 2:
        return dst
    return _rewire(rng, src, dst, community(src, seed, num_classes), community(dst, seed, num_classes),
                   num_classes, homophily)


# -- features ----------------------------------------------------------------------

def class_centroids(seed: int, num_classes: int, feature_dim: int, separation: float,
                    stream: int = _STREAM_CENTROIDS) -> np.ndarray:
    """Random class centroids of norm about ``separation`` (float32, ``[num_classes, feature_dim]``)."""
    rng = rng_for(seed, stream)
    return (rng.standard_normal((num_classes, feature_dim)) * (separation / math.sqrt(feature_dim))).astype(np.float32)


def synthetic_feature_block(block: int, num_nodes: int, *, seed: int, centroids: np.ndarray,
                            classes: Callable[[np.ndarray], np.ndarray] | None = None,
                            stream: int = _STREAM_FEATURES) -> np.ndarray:
    """Feature rows ``[block * FEATURE_BLOCK, ...)``: centroid of the node's class plus unit Gaussian noise.
    ``classes`` maps node ids to classes (default: :func:`community`)."""
    start = block * FEATURE_BLOCK
    stop = min(start + FEATURE_BLOCK, num_nodes)
    ids = np.arange(start, stop)
    labels = community(ids, seed, centroids.shape[0]) if classes is None else classes(ids)
    rows = rng_for(seed, stream, block).standard_normal((stop - start, centroids.shape[1]), dtype=np.float32)
    rows += centroids[labels]
    return rows


def synthetic_feature_chunks(num_nodes: int, chunk_nodes: int, **block_options) -> Iterator[np.ndarray]:
    """:func:`synthetic_feature_block` rows in chunks of whole blocks (at least ``chunk_nodes`` rows, the
    memory bound); the rows depend only on the block options, never on ``chunk_nodes``."""
    chunk_blocks = max(1, -(-int(chunk_nodes) // FEATURE_BLOCK))
    num_blocks = -(-num_nodes // FEATURE_BLOCK)
    for first in range(0, num_blocks, chunk_blocks):
        yield np.concatenate([synthetic_feature_block(b, num_nodes, **block_options)
                              for b in range(first, min(first + chunk_blocks, num_blocks))])


# -- the generator -------------------------------------------------------------------

def write_synthetic_features(write, num_nodes: int, chunk_nodes: int, dtype: np.dtype, progress: bool, desc: str,
                             **block_options) -> None:
    """Streams :func:`synthetic_feature_chunks` as ``dtype`` to ``write`` (a writer's, for one node type)."""
    with progress_bar(progress, total=num_nodes, desc=desc, unit="node", unit_scale=True) as bar:
        for rows in synthetic_feature_chunks(num_nodes, chunk_nodes, **block_options):
            write(rows.astype(dtype, copy=False))
            bar.update(rows.shape[0])


def synthetic_split(num_nodes: int, fractions, seed: int) -> dict[str, np.ndarray]:
    """The seeded train/val/test split of a generated type's nodes, from its own RNG stream."""
    from lsm_gnn.data.convert import random_split  # convert owns the split helpers

    return random_split(num_nodes, fractions, seed=(seed, STREAM_SPLIT))


def write_community_labels(writer: TypedDatasetWriter, node_type: str, num_nodes: int, seed: int, num_classes: int,
                           split) -> None:
    """A generated type's labels (each node's :func:`community`) and its seeded splits, through the typed
    writer's methods (a schema's one-type shorthands wrap them)."""
    writer.write_type_labels(node_type, community_labels(num_nodes, seed, num_classes), num_classes)
    # Drawn after the edges, so the permutation (8 bytes a node) is not held while the CSR is built.
    for split_name, ids in synthetic_split(num_nodes, split, seed).items():
        writer.write_type_split(node_type, split_name, ids)


def note(enabled: bool, message: str, bar=None) -> None:
    """A progress line on stderr; ``bar``, an open progress bar, is cleared first and drawn again after."""
    if enabled and bar is not None:
        bar.write(message, file=sys.stderr)
    elif enabled:
        print(message, file=sys.stderr, flush=True)


def counted(chunks: Iterable[tuple[np.ndarray, np.ndarray]], bar) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Passes (src, dst) edge chunks through, advancing the progress ``bar`` by their edges."""
    for src, dst in chunks:
        yield src, dst
        bar.update(src.size)


# -- checks shared by the generators (all before anything is written) ----------------------

def check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def check_feature_dtype(feature_dtype) -> np.dtype:
    dtype = np.dtype(feature_dtype)
    if dtype.name not in ("float32", "float16"):
        raise ValueError(f"feature_dtype must be float32 or float16 for synthetic features, got {feature_dtype!r}")
    return dtype


def check_rmat(rmat) -> tuple[float, float, float, float]:
    rmat = tuple(float(p) for p in rmat)
    if len(rmat) != 4 or min(rmat) < 0 or abs(sum(rmat) - 1) > 1e-6:
        raise ValueError(f"rmat must be four probabilities (a, b, c, d) summing to 1, got {rmat}")
    return rmat  # type: ignore[return-value]


def check_probability(value, what: str) -> float:
    if not 0 <= value <= 1:
        raise ValueError(f"{what} must be in [0, 1], got {value}")
    return float(value)


def generate_synthetic(path, *, num_nodes: int, avg_degree: float = 10, feature_dim: int = 128,
                       feature_dtype: str = "float32", num_classes: int = 8, seed: int = 0,
                       rmat: tuple[float, float, float, float] = DEFAULT_RMAT,
                       split: tuple[float, float, float] = (0.6, 0.2, 0.2), scores=SCORE_NAMES,
                       homophily: float = 0.75, class_separation: float = 2.0, overwrite: bool = False,
                       progress: bool = True, chunk_nodes: int = 1 << 16, name: str | None = None) -> Dataset:
    """Writes a synthetic dataset to ``path`` and returns it opened.

    ``avg_degree`` counts CSR entries per node before duplicate edges and
    self loops are removed (the stored graph is undirected, so every generated
    edge appears in two rows; ``meta.json`` has the exact ``num_edges``).
    ``homophily`` is the fraction of edges redrawn into the source's class;
    ``class_separation`` the centroid norm against unit per-dimension noise.
    The output depends only on the parameters (not on ``chunk_nodes``, which
    bounds memory: rows generated per write).
    ``overwrite`` replaces an lsm-gnn dataset at ``path``, never anything else (see :class:`DatasetWriter`).
    """
    from lsm_gnn.data.convert import check_split_fractions  # convert owns the split helpers

    num_nodes = positive_int(num_nodes, "num_nodes")
    feature_dim = positive_int(feature_dim, "feature_dim")
    num_classes = positive_int(num_classes, "num_classes")
    if not avg_degree >= 0:
        raise ValueError(f"avg_degree must be >= 0, got {avg_degree}")
    dtype = check_feature_dtype(feature_dtype)
    rmat = check_rmat(rmat)
    check_probability(homophily, "homophily")
    split = check_split_fractions(split)
    scores = check_score_names(scores)
    seed = check_seed(seed)
    num_generated = int(round(num_nodes * avg_degree / 2))  # each becomes two CSR entries
    params = {
        "kind": "rmat-communities", "version": GENERATOR_VERSION, "num_nodes": num_nodes, "avg_degree": avg_degree,
        "edges_generated": num_generated, "feature_dim": feature_dim, "feature_dtype": dtype.name,
        "num_classes": num_classes, "seed": seed, "rmat": list(rmat), "homophily": homophily,
        "class_separation": class_separation, "feature_noise": 1.0, "split": list(split),
    }
    centroids = class_centroids(seed, num_classes, feature_dim, class_separation)
    with DatasetWriter(path, num_nodes=num_nodes, feature_dim=feature_dim, feature_dtype=dtype.name,
                       name=name, overwrite=overwrite, extra_meta={"generator": params}, scores=scores) as writer:
        write_synthetic_features(writer.write_features, num_nodes, chunk_nodes, dtype, progress, "features",
                                 seed=seed, centroids=centroids)
        with progress_bar(progress, total=num_generated, desc="edges", unit="edge", unit_scale=True) as bar:
            edges = synthetic_edges(num_nodes, num_generated, seed=seed, num_classes=num_classes,
                                    homophily=homophily, rmat=rmat)
            writer.write_edges(counted(edges, bar), undirected=True, dedup=True, self_loops=False,
                               expected_edges=num_generated, note=lambda message: note(progress, message, bar))
        note(progress, "labels and splits")
        write_community_labels(writer, ONE_TYPE, num_nodes, seed, num_classes, split)
        writer.write_scores(note=lambda message: note(progress, message))
        note(progress, "committing (checksums, fsync)")
        return writer.commit()


def positive_int(value, what: str) -> int:
    if isinstance(value, bool) or int(value) != value or value <= 0:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return int(value)
