"""The node-classification loader: sampled mini-batches with features from the cache.

A background thread samples batches ``window`` iterations ahead into a
:class:`~lsm_gnn.cache.WindowBuffer` (so the cache's dynamic policies see
the future) and gathers the features of the next batch while the caller
trains on the current one. Sampling is deterministic in (seed, iteration),
so the same seed gives the same batches in the same order.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import numpy as np
import torch

from lsm_gnn.cache import SoftwareCache, WindowBuffer
from lsm_gnn.sampling import Hop, NeighborSampler

_DONE = object()


@dataclass
class Batch:
    """One mini-batch. ``hops[0]`` is next to the seeds; a model consumes
    ``reversed(hops)``, starting from ``x`` (features of ``hops[-1].nodes``)."""

    iteration: int
    seeds: torch.Tensor
    hops: list[Hop]
    x: torch.Tensor
    y: torch.Tensor | None
    hit_mask: torch.Tensor

    @property
    def input_nodes(self) -> torch.Tensor:
        return self.hops[-1].nodes


class NodeLoader:
    """Iterates mini-batches of ``seeds`` (default: the train split), one epoch per ``iter()``.

    ``features`` is a :class:`SoftwareCache` (the cached SSD path) or any
    object with ``read(ids)`` (a storage backend). Each epoch reshuffles
    with ``seed + epoch``; iteration numbers continue across epochs.
    """

    def __init__(self, dataset, features, fanouts, batch_size: int, seeds=None, *, shuffle: bool = True,
                 drop_last: bool = False, window: int = 256, prefetch: int = 2, seed: int = 0):
        self._worker: threading.Thread | None = None
        self._stop = threading.Event()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if window < 0 or prefetch < 1:
            raise ValueError(f"window must be >= 0 and prefetch >= 1, got window={window}, prefetch={prefetch}")
        self.dataset = dataset
        self.features = features
        self.sampler = NeighborSampler(dataset, fanouts, seed=seed)
        self.seeds = np.asarray(dataset.split("train") if seeds is None else seeds, dtype=np.int64)
        if self.seeds.size == 0:
            raise ValueError("there are no seed nodes to iterate over")
        if np.unique(self.seeds).size != self.seeds.size:
            raise ValueError("seed nodes must be distinct")
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.window, self.prefetch, self.seed = window, prefetch, seed
        self.labels = None if dataset.labels is None else torch.from_numpy(np.asarray(dataset.labels))
        self.epoch = 0
        self.iteration = 0

    def __len__(self) -> int:
        full, rest = divmod(self.seeds.size, self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    def _epoch_batches(self, epoch: int) -> list[np.ndarray]:
        order = (np.random.default_rng([self.seed, epoch]).permutation(self.seeds) if self.shuffle
                 else self.seeds)
        return [order[i * self.batch_size:(i + 1) * self.batch_size] for i in range(len(self))]

    def __iter__(self):
        self.close()  # a new epoch ends any epoch still running
        self._stop = threading.Event()
        ready: queue.Queue = queue.Queue(maxsize=self.prefetch)
        batches = self._epoch_batches(self.epoch)
        first = self.iteration
        self._worker = threading.Thread(target=self._produce, args=(batches, first, ready, self._stop),
                                        name="lsm-gnn-loader", daemon=True)
        self._worker.start()
        self.epoch += 1
        self.iteration += len(batches)
        return self._consume(ready)

    def _consume(self, ready: queue.Queue):
        try:
            while True:
                item = ready.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.close()  # also runs when the caller breaks out or raises: no thread left behind

    def _produce(self, batches, first: int, ready: queue.Queue, stop: threading.Event) -> None:
        def put(item) -> bool:
            # Never block forever: the consumer may have stopped listening.
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            window = WindowBuffer(self.window + 1, self.dataset.num_nodes) if self.window else None
            sampled: dict[int, list[Hop]] = {}
            ahead = 0  # batches sampled so far

            def sample_next():
                nonlocal ahead
                hops = self.sampler.sample(batches[ahead], first + ahead)
                sampled[ahead] = hops
                if window is not None:
                    window.push(hops[-1].nodes)
                ahead += 1

            for k in range(len(batches)):
                if stop.is_set():
                    return
                while ahead < len(batches) and ahead <= k + self.window:
                    sample_next()
                hops = sampled.pop(k)
                if window is not None:
                    window.pop()
                nodes = hops[-1].nodes
                if isinstance(self.features, SoftwareCache):
                    x, hit = self.features.lookup(nodes, future=window)
                else:
                    x, hit = self.features.read(nodes), torch.zeros(nodes.numel(), dtype=torch.bool)
                seeds = torch.from_numpy(batches[k])
                y = None if self.labels is None else self.labels[seeds]
                if not put(Batch(first + k, seeds, hops, x, y, hit)):
                    return
            put(_DONE)
        except BaseException as exc:  # handed to the consumer, which raises it in the caller's thread
            put(exc)

    def close(self) -> None:
        """Stops the background thread (idempotent)."""
        self._stop.set()
        worker, self._worker = self._worker, None
        if worker is not None and worker is not threading.current_thread():
            worker.join()

    def __del__(self):
        self.close()
