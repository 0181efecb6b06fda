"""The node-classification loader: sampled mini-batches with features from the cache.

A background thread samples batches ``window`` iterations ahead into a
:class:`~lsm_gnn.cache.WindowBuffer` (so the cache's dynamic policies see
the future) and gathers the features of the next batch while the caller
trains on the current one. Sampling is deterministic in (seed, iteration),
so the same seed gives the same batches in the same order, and
:meth:`NodeLoader.state_dict` / :meth:`NodeLoader.load_state_dict` resume an
interrupted epoch at the exact batch where it stopped.

Subclasses change what a batch is (link prediction samples around edges)
by overriding three hooks: ``_epoch_plans`` (the epoch's batches, as any
objects), ``_plan_nodes`` (the distinct nodes to sample around) and
``_make_batch``.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from lsm_gnn.cache import WindowBuffer
from lsm_gnn.defaults import WINDOW
from lsm_gnn.features import Features
from lsm_gnn.sampling import Hop, NeighborSampler

_DONE = object()
#: labels copied into memory per block of this many nodes (a label file is never read whole at once)
LABEL_BLOCK = 1 << 20


def all_distinct(ids: np.ndarray) -> bool:
    """Whether the non-negative ``ids`` are distinct, with one byte of scratch per id up to the largest (not
    np.unique's sort: numpy 2.4's kept ~30 bytes per id of heap after returning)."""
    seen = np.zeros(int(ids.max()) + 1 if ids.size else 0, dtype=bool)
    seen[ids] = True
    return int(np.count_nonzero(seen)) == ids.size


def compact_labels(labels, block: int = LABEL_BLOCK) -> tuple[torch.Tensor, torch.dtype]:
    """(the labels in memory, the dtype of ``labels``): 1-D integer labels in the narrowest signed dtype that
    holds them, read in blocks of ``block``; any other labels as they are.

    A label file is int64 (8 bytes a node); kept memory-mapped, every page of it that batches touch sits in
    the page cache, counted against a memory cap. Eight classes need one byte a node.
    """
    array = np.asarray(labels)
    dtype = torch.from_numpy(array[:0]).dtype
    if array.ndim != 1 or array.dtype.kind not in "iu" or array.size == 0:
        return torch.from_numpy(array), dtype
    # One pass over the file: each block's min and max while it is in the page cache.
    bounds = [(int(part.min()), int(part.max())) for part in (array[start:start + block]
                                                               for start in range(0, array.size, block))]
    low, high = min(b[0] for b in bounds), max(b[1] for b in bounds)
    narrow = next((d for d in (np.int8, np.int16, np.int32, np.int64)
                   if np.iinfo(d).min <= low and high <= np.iinfo(d).max), None)
    if narrow is None:  # uint64 labels beyond int64: as they are
        return torch.from_numpy(array), dtype
    out = np.empty(array.size, dtype=narrow)
    for start in range(0, array.size, block):
        out[start:start + block] = array[start:start + block]
    return torch.from_numpy(out), dtype


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
    #: seconds spent in the background on this batch: "sample" and "gather" (feature lookup)
    timings: dict = field(default_factory=dict)
    #: what gathering this batch read from storage: "bytes_read" (from the file) and "bytes_useful";
    #: with a victim-buffer prefetcher also "pvp_hits" (rows it served) and "bytes_saved"
    io: dict = field(default_factory=dict)
    #: the input nodes' trainable embeddings (``model.node_embedding``; float32 ``[len(input_nodes), dim]``), or None
    emb: torch.Tensor | None = None

    @property
    def hit_ratio(self) -> float:
        """Share of the input nodes served without reading storage: by the cache or, with PVP, its
        victim buffer (the nodes are distinct, so this is the cache's combined ratio)."""
        return float(self.hit_mask.float().mean()) if self.hit_mask.numel() else 0.0

    @property
    def input_nodes(self) -> torch.Tensor:
        return self.hops[-1].nodes

    @property
    def hits(self) -> int:
        return int(self.hit_mask.sum())

    @property
    def gathered(self) -> int:
        """Rows gathered (the distinct input nodes)."""
        return self.hit_mask.numel()

    def to(self, device) -> Batch:
        """The tensors a model reads, on ``device``."""
        for hop in self.hops:
            hop.edge_index = hop.edge_index.to(device, non_blocking=True)
        self.x = self.x.to(device, non_blocking=True)
        if self.emb is not None:
            self.emb = self.emb.to(device, non_blocking=True)
        if self.y is not None:
            self.y = self.y.to(device, non_blocking=True)
        return self


class NodeLoader:
    """Iterates mini-batches of ``seeds`` (default: the train split), one epoch per ``iter()``.

    ``features`` is any :class:`~lsm_gnn.features.Features`: a storage
    backend, a :class:`~lsm_gnn.cache.SoftwareCache` (the cached SSD path)
    or a :class:`~lsm_gnn.comm.SharedCache`. Each epoch reshuffles with
    ``(seed, epoch)``; iteration numbers continue across epochs. With
    ``world_size > 1`` each rank iterates its own equal share of the seeds.

    Right after gathering a batch the loader asks the features to
    ``prefetch()`` for the next one (a cache with a victim buffer then moves
    that iteration's queue on a background thread while the batch trains);
    ``prefetch_features=False`` leaves every move to the gather itself.

    ``embedding`` (a :class:`~lsm_gnn.embedding.NodeEmbedding`) adds each batch's trainable embeddings
    (``batch.emb``), gathered after its features; a training loader's gather of batch ``i`` waits until the
    trainer has applied batch ``i - 1``'s update, so every batch reads the rows as they are after the last.
    """

    def __init__(self, dataset, features, fanouts, batch_size: int, seeds=None, *, shuffle: bool = True,
                 drop_last: bool = False, window: int = WINDOW, prefetch: int = 2, seed: int = 0,
                 rank: int = 0, world_size: int = 1, num_threads: int = 0, prefetch_features: bool = True,
                 embedding=None):
        self._worker: threading.Thread | None = None
        self._stop = threading.Event()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if window < 0 or prefetch < 1:
            raise ValueError(f"window must be >= 0 and prefetch >= 1, got window={window}, prefetch={prefetch}")
        self._check_features(features)
        self.dataset = dataset
        self.features = features
        self.embedding = embedding
        self.prefetch_features = bool(prefetch_features)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self.rank, self.world_size = rank, world_size
        self.sampler = self._make_sampler(fanouts, seed, num_threads)
        self.seeds = np.asarray(self._split("train") if seeds is None else seeds, dtype=np.int64)
        if self.seeds.size == 0:
            raise ValueError("there are no seed nodes to iterate over")
        if int(self.seeds.min()) < 0:
            raise ValueError(f"seed nodes are node ids, >= 0; got {int(self.seeds.min())}")
        if not all_distinct(self.seeds):
            raise ValueError("seed nodes must be distinct")
        if self.seeds.size < world_size:
            raise ValueError(f"{self.seeds.size} seed nodes cannot be shared among {world_size} ranks")
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.window, self.prefetch, self.seed = window, prefetch, seed
        labels = self._dataset_labels()
        #: the labels in memory, narrowed (:func:`compact_labels`); batches get them in the file's dtype
        self.labels, self._label_dtype = (None, None) if labels is None else compact_labels(labels)
        self.epoch = 0  # the epoch the next iter() runs
        self.iteration = 0  # the iteration number of that epoch's first batch
        self._resume_position = 0
        self._running_epoch: int | None = None
        self._epoch_length = self._epoch_first = self._position = 0

    @property
    def seeds_per_rank(self) -> int:
        """Every rank gets the same number of seeds (the remainder of each
        epoch's shuffle is left out), so all ranks run the same number of
        batches and collective calls never wait on a rank that has finished."""
        return self.seeds.size // self.world_size

    def __len__(self) -> int:
        full, rest = divmod(self.seeds_per_rank, self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    # -- hooks (override to change what a batch is) -------------------------------------------------------------

    @staticmethod
    def _check_features(features) -> None:
        if not isinstance(features, Features):
            raise TypeError(f"features must implement lsm_gnn.features.Features (gather, counters, ...): a "
                            f"storage, a SoftwareCache or a SharedCache; got {type(features).__name__}")

    def _make_sampler(self, fanouts, seed: int, num_threads: int):
        return NeighborSampler(self.dataset, fanouts, seed=seed, num_threads=num_threads)

    def _split(self, name: str):
        return self.dataset.split(name)

    def _dataset_labels(self):
        return self.dataset.labels()

    def _make_window(self):
        """What the features plan with: the input nodes of the next ``window`` batches."""
        return WindowBuffer(self.window + 1, self.dataset.num_nodes)

    def _gather(self, nodes, window):
        return self.features.gather(nodes, future=window)

    def _epoch_plans(self, epoch: int, rank: int | None = None) -> list:
        """The epoch's batches on ``rank`` (default: this loader's), in order; here positions into ``seeds``
        (see :meth:`_plan_seeds`).

        Positions rather than ids: the shuffle is held as int32 where the seeds allow (4 bytes a seed for
        the epoch instead of 8; at 10^8 nodes with 60% training nodes, 240 MB less), and ``seeds`` stays
        as the split file's memory map. The order equals ``permutation(seeds)``: a shuffle draws the same
        numbers whatever the array's dtype."""
        positions = np.arange(self.seeds.size, dtype=np.int32 if self.seeds.size < 2**31 else np.int64)
        if self.shuffle:
            np.random.default_rng([self.seed, epoch]).shuffle(positions)
        if self.world_size > 1:  # the same permutation on every rank, dealt out in turn
            rank = self.rank if rank is None else rank
            positions = positions[:self.seeds_per_rank * self.world_size][rank::self.world_size]
        return [positions[i * self.batch_size:(i + 1) * self.batch_size] for i in range(len(self))]

    def _plan_seeds(self, plan) -> np.ndarray:
        """The seed node ids (int64) of a plan of :meth:`_epoch_plans`."""
        return np.asarray(self.seeds[plan], dtype=np.int64)

    def _plan_nodes(self, plan) -> np.ndarray:
        """The distinct nodes the sampler expands from."""
        return self._plan_seeds(plan)

    def _make_batch(self, iteration: int, plan, hops: list[Hop], x: torch.Tensor, hit: torch.Tensor):
        seeds = torch.from_numpy(self._plan_seeds(plan))
        return Batch(iteration, seeds, hops, x, self._labels_of(seeds), hit)

    def _labels_of(self, seeds: torch.Tensor) -> torch.Tensor | None:
        """The seeds' labels, in the dtype of the dataset's label file."""
        return None if self.labels is None else self.labels[seeds].to(self._label_dtype)

    def sample_input_nodes(self, count: int, epoch: int = 0, rank: int | None = None) -> list:
        """The input nodes (``hops[-1].nodes``) of ``count`` batches spread evenly over ``epoch`` on ``rank``
        (default: this loader's), sampled exactly as training samples them but without gathering a row:
        what sizing a cache needs before any training (:mod:`lsm_gnn.sizing`)."""
        plans = self._epoch_plans(epoch, rank)
        picks = np.unique(np.linspace(0, len(plans) - 1, min(count, len(plans))).round().astype(np.int64))
        return [self.sampler.sample(self._plan_nodes(plans[k]), epoch * len(plans) + int(k))[-1].nodes
                for k in picks]

    # -- resumable position --------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Where the loader stands: the next ``iter()`` after :meth:`load_state_dict` continues from here.

        Counts batches already handed to the caller, so a checkpoint taken
        after training on a batch resumes with the batch after it.
        """
        epoch, position, first = self._running_epoch, self._position, self._epoch_first
        if epoch is None:  # between epochs, or after load_state_dict: the next iter() starts here
            epoch, position, first = self.epoch, self._resume_position, self.iteration
        elif position >= self._epoch_length:  # finished: resume at the next epoch
            epoch, position, first = epoch + 1, 0, self._epoch_first + self._epoch_length
        return {"epoch": epoch, "position": position, "iteration": first + position,
                "seed": self.seed, "batch_size": self.batch_size, "num_seeds": int(self.seeds.size)}

    def load_state_dict(self, state: dict) -> None:
        for key, have in (("seed", self.seed), ("batch_size", self.batch_size), ("num_seeds", int(self.seeds.size))):
            if state.get(key, have) != have:
                raise ValueError(f"the saved loader state has {key}={state[key]} but this loader has {key}={have}; "
                                 "resume with the same loader settings")
        if not 0 <= state["position"] <= len(self):
            raise ValueError(f"saved position {state['position']} is outside the epoch of {len(self)} batches")
        self.close()
        self.epoch, self._resume_position = int(state["epoch"]), int(state["position"])
        self.iteration = int(state["iteration"]) - self._resume_position
        self._running_epoch = None

    # -- iteration -----------------------------------------------------------------------------------------------

    def __iter__(self):
        return self.iterate()

    def iterate(self, until: int | None = None):
        """``iter(loader)``, or only up to position ``until`` of the epoch (a batch count): the background
        thread then samples and gathers nothing past it, so every rank stops its collective gathers at the
        same batch (an evaluation in mid-epoch). The next segment starts after :meth:`load_state_dict` with
        :meth:`state_dict`, as a resumed run does."""
        self.close()  # a new epoch ends any epoch still running
        self._stop = threading.Event()
        ready: queue.Queue = queue.Queue(maxsize=self.prefetch)
        plans = self._epoch_plans(self.epoch)
        skip, self._resume_position = self._resume_position, 0
        self._running_epoch, self._epoch_length = self.epoch, len(plans)
        self._epoch_first, self._position = self.iteration, skip
        self._worker = threading.Thread(target=self._produce, args=(plans[skip:until], self.iteration + skip, ready,
                                                                    self._stop),
                                        name="lsm-gnn-loader", daemon=True)
        self._worker.start()
        self.epoch += 1
        self.iteration += len(plans)
        return self._consume(ready)

    def _consume(self, ready: queue.Queue):
        try:
            while True:
                item = ready.get()
                if item is _DONE:
                    if self._position >= self._epoch_length:  # else a segment ended: state_dict says where
                        self._running_epoch = None
                    return
                if isinstance(item, BaseException):
                    raise item
                self._position += 1
                yield item
        finally:
            self.close()  # also runs when the caller breaks out or raises: no thread left behind

    def _produce(self, plans, first: int, ready: queue.Queue, stop: threading.Event) -> None:
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
            window = self._make_window() if self.window else None
            sampled: dict[int, tuple[list[Hop], float]] = {}
            ahead = 0  # batches sampled so far

            def sample_next():
                nonlocal ahead
                start = time.perf_counter()
                hops = self.sampler.sample(self._plan_nodes(plans[ahead]), first + ahead)
                sampled[ahead] = hops, time.perf_counter() - start
                if window is not None:
                    window.push(hops[-1].nodes)
                ahead += 1

            for k in range(len(plans)):
                if stop.is_set():
                    return
                while ahead < len(plans) and ahead <= k + self.window:
                    sample_next()
                hops, sample_s = sampled.pop(k)
                if window is not None:
                    window.pop()
                nodes = hops[-1].nodes
                before = self.features.counters()  # this thread is the features' only reader while the epoch runs
                start = time.perf_counter()
                x, hit = self._gather(nodes, window)
                gather_s = time.perf_counter() - start
                if self.prefetch_features:  # e.g. the next iteration's victims move while this batch trains
                    self.features.prefetch()
                after = self.features.counters()
                batch = self._make_batch(first + k, plans[k], hops, x, hit)
                batch.timings = {"sample": sample_s, "gather": gather_s, **self.features.last_timings}
                batch.io = {key: after[key] - before[key] for key in after}
                if self.embedding is not None:
                    found = self.embedding.gather(nodes, window, iteration=first + k, stop=stop)
                    if found is None:  # stopped while waiting for the previous batch's update
                        return
                    batch.emb, timings, io = found
                    batch.timings.update(timings)
                    batch.io.update(io)
                if not put(batch):
                    return
            put(_DONE)
        except BaseException as exc:  # handed to the consumer, which raises it in the caller's thread
            put(exc)

    def close(self) -> None:
        """Stops the background thread (idempotent)."""
        self._stop.set()
        worker = self._worker
        # ident is None for a thread never started (an interrupt between its creation and start())
        if worker is not None and worker.ident is not None and worker is not threading.current_thread():
            worker.join()
        # Forgotten only once joined: a join cut short by Ctrl-C is redone by the next close(), or the thread
        # would still run native code while the interpreter exits (std::terminate, SIGABRT).
        self._worker = None
        features = getattr(self, "features", None)  # absent when __init__ failed early
        if features is not None:
            features.settle()  # joins a prefetch in flight; the next gather still finds its rows

    def __del__(self):
        self.close()
