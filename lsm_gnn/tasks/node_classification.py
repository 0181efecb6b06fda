"""Training tasks: what a batch's loss is and how a split is evaluated.

The trainer asks a task (:class:`Task`) for its loader (``train_loader``),
its loss on a batch and its metrics on a split; ``make_task`` picks the task
a config names (``train.task``: node classification here, link prediction in
:mod:`lsm_gnn.tasks.link_prediction`). Both take graphs of one node type; node
classification also typed graphs (its target type's seeds). What has no typed
form (link prediction, layer-wise evaluation) is refused on a typed graph where
the model is chosen (:func:`lsm_gnn.models.model_form`).
"""
from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from lsm_gnn.config import Config, ConfigError
from lsm_gnn.tasks.link_prediction import LinkPrediction
from lsm_gnn.loader import NodeLoader
from lsm_gnn.comm.distributed import all_reduce_sum, batch_to
from lsm_gnn.tasks.options import eval_batch_size, eval_fanouts, loader_options, relation_fanouts


class Task(Protocol):
    """What the trainer asks of a task, whichever it is."""

    name: str                    # train.task
    metrics: tuple[str, ...]     # what evaluate reports per split; model selection watches the first by default
    splits: list[str]            # the splits evaluate can measure
    out_dim: int                 # the model's output width
    fanouts: dict                # the sampler's fanouts per relation (task_options.relation_fanouts)

    def train_loader(self, features, rank: int, world_size: int) -> NodeLoader:
        """The loader of this rank's training batches (its batches' trainable rows are updated)."""

    def eval_input_nodes(self, features, split: str, rank: int, world_size: int, count: int) -> list | None:
        """The input nodes of ``count`` evaluation batches of ``split``, for sizing caches before training;
        None where evaluation reads in another way."""

    def loss(self, model, batch) -> torch.Tensor:
        """The loss of ``model`` on ``batch``."""

    def evaluate(self, model, features, split: str, device, rank: int, world_size: int) -> dict:
        """The metrics on ``split`` (collective over ranks), and the "count" they were measured on."""


class NodeClassification:
    """Cross-entropy on the train split; accuracy on the evaluation splits.

    Nodes labeled -1 (unlabeled) are left out of every split before
    batching, so they count in neither the loss nor the metrics. On a
    heterogeneous dataset the task classifies its target node type, with
    typed hops.
    """

    name = "node"
    #: what :meth:`evaluate` reports per split; model selection watches the first by default
    metrics = ("accuracy",)

    def __init__(self, cfg: Config, dataset):
        self.cfg, self.dataset = cfg, dataset
        if dataset.target is None:
            raise ConfigError(f"dataset {dataset.path} has no target node type; node classification needs one "
                              "with labels")
        where = dataset.where(dataset.target)
        self._labels, num_classes = dataset.labels(), dataset.num_classes()
        self.splits = dataset.split_names()
        if self._labels is None or num_classes is None:
            raise ConfigError(f"{where} has no labels; node classification needs them "
                              "(or set train.task=link for a user-item dataset)")
        self.out_dim = int(num_classes)
        if "train" not in self.splits:
            raise ConfigError(f"{where} has no train split; node classification trains on it "
                              "(re-create the dataset with splits)")
        if self.labeled("train").size == 0:
            raise ConfigError(f"every node of the train split of {where} is unlabeled (-1); label some, "
                              "or pick another dataset")
        self.fanouts = relation_fanouts(cfg, dataset)

    def labeled(self, split: str) -> np.ndarray:
        """The split's nodes that carry a label (label >= 0)."""
        seeds = np.asarray(self.dataset.split(split), dtype=np.int64)
        return seeds[np.asarray(self._labels)[seeds] >= 0]

    def _loader(self, features, seeds, batch_size: int, shuffle: bool, options: dict):
        fanouts = self.fanouts if options["training"] else eval_fanouts(self.cfg, self.fanouts)
        return NodeLoader(self.dataset, features, fanouts, batch_size, seeds=seeds, shuffle=shuffle, **options)

    def train_loader(self, features, rank: int, world_size: int) -> NodeLoader:
        c = self.cfg
        return self._loader(features, self.labeled("train"), c.sampler.batch_size, True,
                            loader_options(c, rank, world_size))

    def eval_input_nodes(self, features, split: str, rank: int, world_size: int, count: int) -> list | None:
        """The input nodes of ``count`` evaluation batches of ``split`` on ``rank``, sampled as :meth:`evaluate`
        samples them, for sizing the caches before training; None where evaluation reads in another way
        (``train.eval_mode=full``)."""
        if self.cfg.train.eval_mode == "full":
            return None
        seeds = self.labeled(split)
        if seeds.size < world_size:
            return []
        c = self.cfg
        loader = self._loader(features, seeds, eval_batch_size(c), False,
                              loader_options(c, rank, world_size, evaluation=True))
        try:
            return loader.sample_input_nodes(count, rank=rank)
        finally:
            loader.close()

    def loss(self, model, batch) -> torch.Tensor:
        # ignore_index guards loaders given unlabeled seeds by a caller
        return torch.nn.functional.cross_entropy(model(batch), batch.y, ignore_index=-1)

    @torch.no_grad()
    def evaluate(self, model, features, split: str, device, rank: int, world_size: int) -> dict:
        seeds = self.labeled(split)
        if self.cfg.train.eval_mode == "full":  # every rank gets every seed's logits
            from lsm_gnn.tasks.inference import layerwise_inference

            size = eval_batch_size(self.cfg)
            logits = layerwise_inference(model, self.dataset, features, seeds, chunk_size=size, read_rows=size,
                                         device=device, rank=rank, world_size=world_size)
            labels = torch.from_numpy(np.asarray(self._labels[seeds], dtype=np.int64))
            correct = int((logits.argmax(1) == labels).sum())
            return {"accuracy": correct / seeds.size if seeds.size else float("nan"), "count": int(seeds.size)}
        correct = total = 0
        if seeds.size >= world_size:
            c = self.cfg
            # Equal shares per rank (fewer than world_size nodes left out): the exchange is collective.
            loader = self._loader(features, seeds, eval_batch_size(c), False,
                                  loader_options(c, rank, world_size, evaluation=True))
            for batch in loader:
                batch = batch_to(batch, device)
                correct += int((model(batch).argmax(1) == batch.y).sum())
                total += batch.y.numel()
        correct, total = all_reduce_sum([correct, total])
        return {"accuracy": correct / total if total else float("nan"), "count": int(total)}


def make_task(cfg: Config, dataset) -> Task:
    """The task ``train.task`` names, on ``dataset`` (refused on a typed graph where it has no typed form: by
    :func:`lsm_gnn.models.model_form`, which the trainer and the planner call first)."""
    if cfg.train.task == "node":
        return NodeClassification(cfg, dataset)
    return LinkPrediction(cfg, dataset)
