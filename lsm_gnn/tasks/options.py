"""What every training task takes from the config: its loader's keywords and the evaluation batch size.

Node classification (:mod:`lsm_gnn.tasks.node_classification`) and link prediction
(:mod:`lsm_gnn.tasks.link_prediction`) both import it, and :func:`lsm_gnn.tasks.make_task` imports them: one
direction, no circle."""
from __future__ import annotations

from lsm_gnn.config import Config


def loader_options(cfg: Config, rank: int, world_size: int, evaluation: bool = False) -> dict:
    """The loader keywords every task takes from the config; evaluation draws its own sampling stream and
    reads trainable rows as they are."""
    return {"window": cfg.cache.window, "seed": cfg.train.seed + (1 if evaluation else 0), "rank": rank,
            "world_size": world_size, "num_threads": cfg.sampler.num_threads, "training": not evaluation,
            "topology_access": cfg.sampler.topology}


def eval_batch_size(cfg: Config) -> int:
    return cfg.train.eval_batch_size or cfg.sampler.batch_size


def eval_fanouts(cfg: Config, fanouts):
    """Sampled evaluation's fanouts: ``train.eval_fanouts`` for every relation (``fanouts`` is training's: a
    list, or a dict per relation), or training's where it is empty."""
    given = cfg.train.eval_fanouts
    if not given:
        return fanouts
    return {key: list(given) for key in fanouts} if isinstance(fanouts, dict) else list(given)
