"""The node-classification loader over a heterogeneous graph: typed hops, features of every type.

:class:`HeteroNodeLoader` is :class:`~lsm_gnn.loader.NodeLoader` with the
typed sampler (:class:`~lsm_gnn.sampling.NeighborSampler`), seeds and
labels of the target node type, and features gathered per type through one
cache budget (:class:`~lsm_gnn.typed_features.TypedFeatures`), each feature
group planning with a window of its own. Sampling ahead, background
gathering, epochs, rank shards and exact resume are the base class's.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from lsm_gnn.loader import NodeLoader
from lsm_gnn.sampling import Hop, NeighborSampler
from lsm_gnn.typed_features import GroupWindows, TypedFeatures


@dataclass
class HeteroBatch:
    """One typed mini-batch: ``seeds`` of the target type, ``hops`` (a model consumes ``reversed(hops)``),
    ``x`` (features per featured type, of ``hops[-1].nodes``), ``y`` (the seeds' labels), ``hit_mask`` per
    featured type."""

    iteration: int
    target: str
    seeds: torch.Tensor
    hops: list[Hop]
    x: dict[str, torch.Tensor]
    y: torch.Tensor | None
    hit_mask: dict[str, torch.Tensor]
    timings: dict = field(default_factory=dict)
    io: dict = field(default_factory=dict)
    #: trainable node embeddings: none yet for a typed graph (``model.node_embedding`` takes one type)
    emb: None = None

    @property
    def input_nodes(self) -> dict[str, torch.Tensor]:
        return self.hops[-1].nodes

    @property
    def hits(self) -> int:
        return sum(int(m.sum()) for m in self.hit_mask.values())

    @property
    def gathered(self) -> int:
        return sum(m.numel() for m in self.hit_mask.values())

    @property
    def hit_ratio(self) -> float:
        """Share of the gathered rows (all featured types) served without reading storage."""
        return self.hits / self.gathered if self.gathered else 0.0

    def hit_ratios(self) -> dict[str, float]:
        """Per featured type, the share of its rows served without reading storage."""
        return {t: float(m.float().mean()) for t, m in self.hit_mask.items() if m.numel()}

    def to(self, device) -> HeteroBatch:
        """The tensors a model reads, on ``device``."""
        for hop in self.hops:
            hop.edge_index = {r: e.to(device, non_blocking=True) for r, e in hop.edge_index.items()}
        self.x = {t: x.to(device, non_blocking=True) for t, x in self.x.items()}
        if self.y is not None:
            self.y = self.y.to(device, non_blocking=True)
        return self


class HeteroNodeLoader(NodeLoader):
    """Mini-batches of ``seeds`` of ``dataset``'s target type (default: its train split) with typed hops.

    ``fanouts``: one list (per hop) for every relation, or a dict per relation (see
    :class:`~lsm_gnn.sampling.NeighborSampler`). ``features``: a
    :class:`~lsm_gnn.typed_features.TypedFeatures`.
    """

    def __init__(self, dataset, features: TypedFeatures, fanouts, batch_size: int, seeds=None, *,
                 target: str | None = None, **options):
        self.target = dataset.target if target is None else target
        if self.target is None:
            raise ValueError(f"dataset {dataset.path} has no target type; name the node type to classify")
        super().__init__(dataset, features, fanouts, batch_size, seeds, **options)

    @staticmethod
    def _check_features(features) -> None:
        if not isinstance(features, TypedFeatures):
            raise TypeError(f"a heterogeneous loader gathers from TypedFeatures (lsm_gnn.build.build_typed_features)"
                            f", got {type(features).__name__}")

    def _make_sampler(self, fanouts, seed: int, num_threads: int):
        return NeighborSampler(self.dataset, fanouts, seed=seed, num_threads=num_threads)

    def _split(self, name: str):
        return self.dataset.split(name, self.target)

    def _dataset_labels(self):
        return self.dataset.labels(self.target)

    def _plan_nodes(self, plan) -> dict[str, np.ndarray]:
        return {self.target: self._plan_seeds(plan)}

    def _make_window(self):
        return GroupWindows(self.features, self.window + 1)

    def _gather(self, nodes, window):
        return self.features.gather(nodes, futures=None if window is None else window.buffers)

    def _make_batch(self, iteration: int, plan, hops: list[Hop], x, hit) -> HeteroBatch:
        seeds = torch.from_numpy(self._plan_seeds(plan))
        return HeteroBatch(iteration, self.target, seeds, hops, x, self._labels_of(seeds), hit)
