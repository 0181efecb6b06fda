"""What every training task takes from the config: its loader's keywords and the evaluation batch size.

Node classification (:mod:`lsm_gnn.tasks.node_classification`) and link prediction
(:mod:`lsm_gnn.tasks.link_prediction`) both import it, and :func:`lsm_gnn.tasks.make_task` imports them: one
direction, no circle."""
from __future__ import annotations

from lsm_gnn.config import Config, ConfigError


def loader_options(cfg: Config, rank: int, world_size: int, evaluation: bool = False) -> dict:
    """The loader keywords every task takes from the config; evaluation draws its own sampling stream and
    reads trainable rows as they are."""
    return {"window": cfg.cache.window, "seed": cfg.train.seed + (1 if evaluation else 0), "rank": rank,
            "world_size": world_size, "num_threads": cfg.sampler.num_threads, "training": not evaluation,
            "topology_access": cfg.sampler.topology}


def eval_batch_size(cfg: Config) -> int:
    return cfg.train.eval_batch_size or cfg.sampler.batch_size


def relation_fanouts(cfg: Config, dataset) -> dict[str, list[int]]:
    """The sampler's fanouts per relation of ``dataset`` (by ``"src__name__dst"`` name; a graph of one node type
    has one relation): ``sampler.fanouts``, or the relation's own where ``sampler.relation_fanouts`` names it. The
    one place a config's fanouts take their keyed form."""
    from lsm_gnn.data.dataset import relation_key

    given = cfg.sampler.relation_fanouts
    keys = [relation_key(r) for r in dataset.relations]
    unknown = sorted(set(given) - set(keys))
    if unknown:
        raise ConfigError(f"sampler.relation_fanouts names {unknown}, which {dataset.path} does not have; its "
                          f"relations: {', '.join(keys)}")
    return {key: given.get(key, cfg.sampler.fanouts) for key in keys}


def eval_fanouts(cfg: Config, fanouts: dict[str, list[int]]) -> dict[str, list[int]]:
    """Sampled evaluation's fanouts: ``train.eval_fanouts`` for every relation (``fanouts`` is training's, per
    relation), or training's where it is empty."""
    given = cfg.train.eval_fanouts
    if not given:
        return fanouts
    return {key: list(given) for key in fanouts}
