"""Synthetic user-item graphs for link prediction, with structure a GNN can learn.

:func:`generate_bipartite` writes a user-item dataset (nodes: users
``[0, U)`` then items ``[U, U + I)``):

* **Communities**: every node, user or item, belongs to one of
  ``num_communities`` (the same seeded hash as :func:`~lsm_gnn.data.synthetic.community`).
* **Interactions**: a user draws a geometric number of interactions (mean
  ``avg_interactions``); each picks the user's own community with
  probability ``affinity``, else a uniform one, then an item of that
  community by a Zipf law of exponent ``popularity`` over a seeded ranking
  (so item degrees are skewed, as in real catalogues). Repeats are dropped.
* **Features**: the centroid of the node's community plus unit Gaussian noise
  (:func:`~lsm_gnn.data.synthetic.synthetic_feature_block`), so features
  say a little about taste and the interactions say more.
* **Splits**: each interaction goes to test with probability
  ``test_fraction``, to val with ``val_fraction``, else to training (the
  CSR, both directions); a user's first interaction always trains.

Users are drawn in blocks of ``USER_BLOCK``, each from its own RNG, so the
output depends only on the parameters, and each pass over the blocks (CSR,
then each held-out split) holds one block in memory.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from lsm_gnn.data.dataset import Dataset
from lsm_gnn.data.scores import SCORE_NAMES, check_score_names
from lsm_gnn.data.synthetic import (
    FEATURE_BLOCK, PopularitySampler, check_feature_dtype, check_seed, class_centroids, community, note, positive_int,
    rng_for, synthetic_feature_block,
)
from lsm_gnn.data.writer import DatasetWriter
from lsm_gnn.utils.progress import progress_bar

USER_BLOCK = 1 << 16      # users per RNG block
GENERATOR_VERSION = 1     # bump when the output for given parameters changes
_STREAM_ITEM_RANK, _STREAM_INTERACTIONS = 16, 17  # clear of synthetic.py's streams
_TRAIN, _VAL, _TEST = 0, 1, 2


def _item_sampler(num_users: int, num_items: int, seed: int, num_communities: int, popularity: float
                  ) -> PopularitySampler:
    """Draws items (as offsets from ``num_users``) of a wanted community, by popularity."""
    comm = community(np.arange(num_users, num_users + num_items), seed, num_communities)
    sizes = np.bincount(comm, minlength=num_communities)
    if not sizes.all():
        raise ValueError(f"{num_items} items leave community {int(np.argmin(sizes))} of {num_communities} empty; "
                         "use more items or fewer communities")
    return PopularitySampler(comm, num_communities, rng_for(seed, _STREAM_ITEM_RANK), popularity)


def interaction_blocks(num_users: int, num_items: int, *, seed: int, avg_interactions: float, num_communities: int,
                       affinity: float, popularity: float, test_fraction: float, val_fraction: float
                       ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Yields ``(users, items, part)`` per user block: distinct pairs sorted by
    user then item (items as node ids), ``part`` 0 train, 1 val, 2 test."""
    items = _item_sampler(num_users, num_items, seed, num_communities, popularity)
    for index, start in enumerate(range(0, num_users, USER_BLOCK)):
        rng = rng_for(seed, _STREAM_INTERACTIONS, index)
        stop = min(start + USER_BLOCK, num_users)
        users, picked = items.draw_block(rng, start, stop, avg_interactions,
                                         lambda ids: community(ids, seed, num_communities), affinity)
        key = np.unique(users * num_items + picked)  # distinct, sorted by user then item
        users, picked = key // num_items, key % num_items + num_users
        u = rng.random(key.size)
        part = np.where(u < test_fraction, _TEST, np.where(u < test_fraction + val_fraction, _VAL, _TRAIN))
        first = np.ones(key.size, dtype=bool)
        first[1:] = users[1:] != users[:-1]
        part[first] = _TRAIN  # every user keeps a training interaction
        yield users, picked, part


def generate_bipartite(path, *, num_users: int, num_items: int, avg_interactions: float = 20, feature_dim: int = 64,
                       seed: int = 0, num_communities: int = 8, affinity: float = 0.8, popularity: float = 0.5,
                       test_fraction: float = 0.2, val_fraction: float = 0.0, class_separation: float = 1.0,
                       feature_dtype: str = "float32", scores=SCORE_NAMES, overwrite: bool = False,
                       progress: bool = True, name: str | None = None) -> Dataset:
    """Writes a synthetic user-item dataset to ``path`` and returns it opened.

    The CSR holds the training interactions in both directions (a user's row
    lists its items, an item's row its users); ``dataset.edge_split("test")``
    (and ``"val"`` when ``val_fraction > 0``) the held-out ``(user, item)``
    pairs, none of which is in the CSR. ``avg_interactions`` counts draws per
    user before repeats are dropped.
    ``overwrite`` replaces an lsm-gnn dataset at ``path``, never anything else (see :class:`DatasetWriter`).
    """
    num_users = positive_int(num_users, "num_users")
    num_items = positive_int(num_items, "num_items")
    feature_dim = positive_int(feature_dim, "feature_dim")
    num_communities = positive_int(num_communities, "num_communities")
    if not avg_interactions >= 1:
        raise ValueError(f"avg_interactions must be >= 1, got {avg_interactions}")
    if not (0 <= affinity <= 1 and popularity >= 0):
        raise ValueError(f"affinity must be in [0, 1] and popularity >= 0, got {affinity}, {popularity}")
    if not (test_fraction > 0 and val_fraction >= 0 and test_fraction + val_fraction < 1):
        raise ValueError(f"test_fraction must be > 0, val_fraction >= 0 and their sum < 1, got {test_fraction}, "
                         f"{val_fraction}")
    check_feature_dtype(feature_dtype)
    scores = check_score_names(scores)
    seed, num_nodes = check_seed(seed), num_users + num_items
    options = dict(seed=seed, avg_interactions=avg_interactions, num_communities=num_communities, affinity=affinity,
                   popularity=popularity, test_fraction=test_fraction, val_fraction=val_fraction)
    _item_sampler(num_users, num_items, seed, num_communities, popularity)  # fail on empty communities before writing
    params = {"kind": "bipartite-communities", "version": GENERATOR_VERSION, "num_users": num_users,
              "num_items": num_items, "feature_dim": feature_dim, "feature_dtype": np.dtype(feature_dtype).name,
              "class_separation": class_separation, "feature_noise": 1.0, **options}

    def pairs(wanted: int):
        for users, items, part in interaction_blocks(num_users, num_items, **options):
            keep = part == wanted
            yield users[keep], items[keep]

    centroids = class_centroids(seed, num_communities, feature_dim, class_separation)
    with DatasetWriter(path, num_nodes=num_nodes, feature_dim=feature_dim, feature_dtype=feature_dtype, name=name,
                       overwrite=overwrite, extra_meta={"generator": params}, scores=scores) as writer:
        writer.set_bipartite(num_users, num_items)
        with progress_bar(progress, total=num_nodes, desc="features", unit="node", unit_scale=True) as bar:
            for block in range(-(-num_nodes // FEATURE_BLOCK)):
                rows = synthetic_feature_block(block, num_nodes, seed=seed, centroids=centroids)
                writer.write_features(rows.astype(feature_dtype, copy=False))
                bar.update(rows.shape[0])
        note(progress, "interactions")
        # An item -> user message and its reverse: a user's row lists its items, an item's row its users.
        writer.write_edges(((items, users) for users, items in pairs(_TRAIN)), undirected=True)
        for split_name, part in (("test", _TEST), ("val", _VAL)):
            if split_name == "test" or val_fraction > 0:
                writer.write_edge_split(split_name, (np.stack([u, i], axis=1) for u, i in pairs(part)))
        writer.write_scores(note=lambda message: note(progress, message))
        note(progress, "committing (checksums, fsync)")
        return writer.commit()
