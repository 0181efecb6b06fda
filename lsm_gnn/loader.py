"""The node-classification loader: sampled mini-batches with features from the cache, on a graph of one
node type (plain batches) or of several (batches per type: seeds of one target type, typed hops, features of
every featured type through one cache budget).

A background thread samples batches ``window`` iterations ahead into a
:class:`~lsm_gnn.cache.WindowBuffer` (so the cache's dynamic policies see
the future) and gathers the features of the next batch while the caller
trains on the current one. Sampling is deterministic in (seed, iteration),
so the same seed gives the same batches in the same order, and
:meth:`NodeLoader.state_dict` / :meth:`NodeLoader.load_state_dict` resume an
interrupted epoch at the exact batch where it stopped.

Subclasses change what a batch is (link prediction samples around edges)
by overriding three hooks: ``_epoch_plans`` (the epoch's batches, as any
objects), ``_plan_nodes`` (the distinct nodes to sample around, ids of the
seeds' node type, which the loader keys by that type for the sampler) and
``_make_batch`` (given the hops per node type, as the sampler returns them;
:meth:`Batch.unwrap` makes a one-type graph's batch plain afterwards).
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils._pytree import tree_map

from lsm_gnn.cache import WindowBuffer
from lsm_gnn.defaults import WINDOW
from lsm_gnn.features import TypedFeatures
from lsm_gnn.sampling import Hop, NeighborSampler
from lsm_gnn.utils.ids import read_only_tensor

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
    dtype = read_only_tensor(array[:0]).dtype
    if array.ndim != 1 or array.dtype.kind not in "iu" or array.size == 0:
        return read_only_tensor(array), dtype
    # One pass over the file: each block's min and max while it is in the page cache.
    bounds = [(int(part.min()), int(part.max())) for part in (array[start:start + block]
                                                               for start in range(0, array.size, block))]
    low, high = min(b[0] for b in bounds), max(b[1] for b in bounds)
    narrow = next((d for d in (np.int8, np.int16, np.int32, np.int64)
                   if np.iinfo(d).min <= low and high <= np.iinfo(d).max), None)
    if narrow is None:  # uint64 labels beyond int64: as they are
        return read_only_tensor(array), dtype
    out = np.empty(array.size, dtype=narrow)
    for start in range(0, array.size, block):
        out[start:start + block] = array[start:start + block]
    return torch.from_numpy(out), dtype


def keyed_features(features, node_type: str) -> TypedFeatures:
    """``features`` by node type: a :class:`~lsm_gnn.features.TypedFeatures` as it is, a bare
    :class:`~lsm_gnn.features.Features` (a graph of one node type's one source) wrapped once as ``node_type``'s.
    The one-type edge of what users hand in (NodeLoader, Trainer, layerwise inference)."""
    return features if isinstance(features, TypedFeatures) else TypedFeatures.one_type(features, node_type)


@dataclass
class Batch:
    """One mini-batch. ``hops[0]`` is next to the seeds; a model consumes ``reversed(hops)``, starting from
    ``x`` (features of ``hops[-1].nodes``).

    The loader makes it per node type (per relation for edges) on every graph; on a graph of one node type
    :meth:`unwrap` makes the fields plain for its models: ``x``, ``hit_mask`` and ``emb`` are tensors, each hop
    plain (:meth:`~lsm_gnn.sampling.Hop.unkeyed`; ``one_type`` names the type; :meth:`keyed` gives a field
    back per type). On a graph of several, ``seeds`` are of the node type ``target`` and ``x``, ``hit_mask``,
    ``emb`` and the hops' fields are dicts per node type (per relation for edges); types without features are
    left out of ``x`` and ``hit_mask``."""

    iteration: int
    seeds: torch.Tensor
    hops: list[Hop]
    x: torch.Tensor | dict[str, torch.Tensor]
    y: torch.Tensor | None
    hit_mask: torch.Tensor | dict[str, torch.Tensor]
    #: seconds spent in the background on this batch: "sample" and "gather" (feature lookup)
    timings: dict = field(default_factory=dict)
    #: what gathering this batch read from storage: "bytes_read" (from the file) and "bytes_useful";
    #: with a victim-buffer prefetcher also "pvp_hits" (rows it served) and "bytes_saved"
    io: dict = field(default_factory=dict)
    #: the input nodes' trainable embeddings (``model.node_embedding``; float32 ``[len(input_nodes), dim]``, per
    #: type with embeddings on a typed graph), or None
    emb: torch.Tensor | dict[str, torch.Tensor] | None = None
    #: the node type of ``seeds`` on a graph of several node types; None on a graph of one
    target: str | None = None
    #: the node type of a graph of one, whose per-type fields this batch holds unwrapped; None on a graph of several
    one_type: str | None = None

    def unwrap(self, one_type: str | None) -> Batch:
        """This batch as models read it: on a graph of one node type (``one_type``), the hops sampled per type
        become plain hops and ``x``, ``hit_mask`` and ``emb`` gathered per type that type's tensors; on a graph
        of several (None) it stays as it is. The one place a batch is made plain."""
        if one_type is None:
            return self
        self.one_type = one_type
        self.hops = [hop.unkeyed() for hop in self.hops]
        self.x, self.hit_mask = self.x[one_type], self.hit_mask[one_type]
        if self.emb is not None:
            self.emb = self.emb[one_type]
        return self

    def keyed(self, value):
        """A field of this batch per node type: as it is on a graph of several, {type: value} on a graph of one."""
        return value if self.one_type is None or value is None else {self.one_type: value}

    @property
    def hit_ratio(self) -> float:
        """Share of the gathered rows (of every featured type) served without reading storage: by the cache
        or, with PVP, its victim buffer (the nodes are distinct, so this is the cache's combined ratio)."""
        if self.one_type is not None:  # as it always was for a plain batch: float32's mean
            return float(self.hit_mask.float().mean()) if self.hit_mask.numel() else 0.0
        return self.hits / self.gathered if self.gathered else 0.0

    def hit_ratios(self) -> dict[str, float]:
        """Per featured node type of a typed batch, the share of its rows served without reading storage;
        empty for a plain batch (:attr:`hit_ratio` is its one ratio)."""
        if self.one_type is not None:
            return {}
        return {t: float(m.float().mean()) for t, m in self.hit_mask.items() if m.numel()}

    def hits_by_type(self) -> dict[str, list[int]] | None:
        """Per featured node type of a typed batch, [rows served without reading storage, rows gathered]; None
        for a plain batch."""
        if self.one_type is not None:
            return None
        return {t: [int(mask.sum()), mask.numel()] for t, mask in self.hit_mask.items()}

    @property
    def input_nodes(self) -> torch.Tensor | dict[str, torch.Tensor]:
        return self.hops[-1].nodes

    @property
    def hits(self) -> int:
        return sum(int(mask.sum()) for mask in self.keyed(self.hit_mask).values())

    @property
    def gathered(self) -> int:
        """Rows gathered (the distinct input nodes of every featured type)."""
        return sum(mask.numel() for mask in self.keyed(self.hit_mask).values())

    def to(self, device) -> Batch:
        """The tensors a model reads, on ``device``."""
        for hop in self.hops:
            hop.edges_to(device)
        # either form alike: a tensor, or a dict of them per node type
        self.x = tree_map(lambda x: x.to(device, non_blocking=True), self.x)
        if self.emb is not None:
            self.emb = tree_map(lambda e: e.to(device, non_blocking=True), self.emb)
        if self.y is not None:
            self.y = self.y.to(device, non_blocking=True)
        return self


class GroupWindows:
    """The input nodes ({type: ids}) of the next batches, one window buffer per id space the features plan in
    (:meth:`~lsm_gnn.features.TypedFeatures.window_ids`; :meth:`~lsm_gnn.features.TypedFeatures.gather`'s
    ``future`` is :attr:`buffers`)."""

    def __init__(self, features: TypedFeatures, size: int):
        self.features = features
        self.buffers = [WindowBuffer(size, rows) for rows in features.window_rows()]

    def push(self, nodes) -> None:
        for buffer, ids in zip(self.buffers, self.features.window_ids(nodes)):
            buffer.push(ids)

    def pop(self) -> None:
        for buffer in self.buffers:
            buffer.pop()

    def __len__(self) -> int:
        return len(self.buffers[0]) if self.buffers else 0


class NodeLoader:
    """Iterates mini-batches of ``seeds`` (default: the train split), one epoch per ``iter()``.

    ``features``: the graph's :class:`~lsm_gnn.features.TypedFeatures`
    (:func:`lsm_gnn.build.build_features`), or, for a graph of one node type,
    any :class:`~lsm_gnn.features.Features`: a storage backend, a
    :class:`~lsm_gnn.cache.SoftwareCache` (the cached SSD path) or a
    :class:`~lsm_gnn.comm.SharedCache`, wrapped once as that type's (on a
    graph of several, a bare Features serves the seeds' type alone). Inside,
    the loader gathers by node type for every graph; a one-type graph's
    batches come out plain (:meth:`Batch.unwrap`). On a graph of several node
    types the seeds are of the node type ``target`` (default: the dataset's),
    hops are typed (``fanouts``: one list for every relation, or a dict per
    relation, as :class:`~lsm_gnn.sampling.NeighborSampler` takes them) and
    each feature group plans with a window of its own. Each epoch reshuffles with
    ``(seed, epoch)``; iteration numbers continue across epochs. With
    ``world_size > 1`` each rank iterates its own equal share of the seeds.

    Right after gathering a batch the loader asks the features to
    ``prefetch()`` for the next one (a cache with a victim buffer then moves
    that iteration's queue on a background thread while the batch trains);
    ``prefetch_features=False`` leaves every move to the gather itself.

    ``topology_access``: how the sampler reads a memory-mapped topology (:class:`~lsm_gnn.sampling.NeighborSampler`;
    ``auto`` preloads one that fits a quarter of the memory left).

    Features with trainable rows (node embeddings) add each batch's (``batch.emb``), gathered after its
    features. ``training``: the caller updates them after each batch (:meth:`TypedFeatures.update`), so the
    gather of batch ``i`` waits for the update of batch ``i - 1`` and every batch reads the rows as they are
    after the last; an evaluation's loader reads them as they are.
    """

    def __init__(self, dataset, features, fanouts, batch_size: int, seeds=None, *, shuffle: bool = True,
                 drop_last: bool = False, window: int = WINDOW, prefetch: int = 2, seed: int = 0,
                 rank: int = 0, world_size: int = 1, num_threads: int = 0, prefetch_features: bool = True,
                 training: bool = False, target: str | None = None, topology_access: str = "auto"):
        self._worker: threading.Thread | None = None
        self._stop = threading.Event()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if window < 0 or prefetch < 1:
            raise ValueError(f"window must be >= 0 and prefetch >= 1, got window={window}, prefetch={prefetch}")
        self.dataset = dataset
        #: the node type of a graph of one, whose batches come unwrapped for its models (:meth:`Batch.unwrap`);
        #: None on a graph of several
        self.one_type = dataset.target if dataset.is_homogeneous else None
        #: the seeds' node type on a graph of several (whose batches are per type); None on a graph of one
        self.target = None if self.one_type is not None else dataset.target if target is None else target
        if self.target is not None and self.target not in dataset.node_types:
            raise ValueError(f"dataset {dataset.path} has no node type {self.target!r} to take seeds of; "
                             f"its node types: {', '.join(dataset.node_types)}")
        #: the node type of the seeds on every graph: the sampler gets them keyed by it and hops come back per type
        self.seed_type = self.one_type or self.target
        #: the features by node type; a bare Features serves the seeds' type (a graph of one's one type)
        self.features = keyed_features(features, self.seed_type)
        self.training = bool(training)
        self.prefetch_features = bool(prefetch_features)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self.rank, self.world_size = rank, world_size
        self.sampler = self._make_sampler(fanouts, seed, num_threads, topology_access)
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

    def _make_sampler(self, fanouts, seed: int, num_threads: int, topology_access: str = "auto"):
        return NeighborSampler(self.dataset, fanouts, seed=seed, num_threads=num_threads,
                               topology_access=topology_access)

    def _split(self, name: str):
        return self.dataset.split(name, self.target)

    def _dataset_labels(self):
        return self.dataset.labels(self.target)

    def _make_window(self) -> GroupWindows:
        """What the features plan with: the input nodes of the next ``window`` batches."""
        return GroupWindows(self.features, self.window + 1)

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
        """The distinct nodes (of :attr:`seed_type`) the sampler expands from."""
        return self._plan_seeds(plan)

    def _sample_many(self, batches) -> list[list[Hop]]:
        """The hops of each ``(plan, iteration)`` in ``batches``: sampled from seeds keyed by :attr:`seed_type`,
        so per node type on every graph."""
        return self.sampler.sample_many([({self.seed_type: self._plan_nodes(plan)}, iteration)
                                         for plan, iteration in batches])

    def _make_batch(self, iteration: int, plan, hops: list[Hop], x, hit):
        seeds = torch.from_numpy(self._plan_seeds(plan))
        return Batch(iteration, seeds, hops, x, self._labels_of(seeds), hit, target=self.target)

    def _labels_of(self, seeds: torch.Tensor) -> torch.Tensor | None:
        """The seeds' labels, in the dtype of the dataset's label file."""
        return None if self.labels is None else self.labels[seeds].to(self._label_dtype)

    def sample_input_nodes(self, count: int, epoch: int = 0, rank: int | None = None) -> list:
        """The input nodes per node type (``hops[-1].nodes``) of ``count`` batches spread evenly over ``epoch`` on
        ``rank`` (default: this loader's), sampled exactly as training samples them but without gathering a row:
        what sizing a cache needs before any training (:mod:`lsm_gnn.sizing`)."""
        plans = self._epoch_plans(epoch, rank)
        picks = np.unique(np.linspace(0, len(plans) - 1, min(count, len(plans))).round().astype(np.int64))
        return [hops[-1].nodes for hops in self._sample_many((plans[k], epoch * len(plans) + int(k)) for k in picks)]

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
        thread then gathers nothing past it, so every rank stops its collective gathers at the same batch (an
        evaluation in mid-epoch, train.max_iterations). It still samples past it for the cache's window, so
        the cache decides exactly as in one unbroken epoch. The next segment starts after
        :meth:`load_state_dict` with :meth:`state_dict`, as a resumed run does."""
        self.close()  # a new epoch ends any epoch still running
        self._stop = threading.Event()
        ready: queue.Queue = queue.Queue(maxsize=self.prefetch)
        plans = self._epoch_plans(self.epoch)
        skip, self._resume_position = self._resume_position, 0
        self._running_epoch, self._epoch_length = self.epoch, len(plans)
        self._epoch_first, self._position = self.iteration, skip
        count = len(plans) - skip if until is None else max(0, min(until, len(plans)) - skip)
        self._worker = threading.Thread(target=self._produce, args=(plans[skip:], count, self.iteration + skip,
                                                                    ready, self._stop),
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

    def _produce(self, plans, count: int, first: int, ready: queue.Queue, stop: threading.Event) -> None:
        """Samples ``plans`` and gathers the first ``count`` of them (the rest only feed the window)."""
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
            ahead = pushed = 0  # batches sampled so far; of them, those pushed into the window

            def sample_up_to(end: int) -> None:
                """Samples the batches from ``ahead`` to ``end``: side by side on the sampler's threads when there
                are several (a window filling), each one's seconds the mean of theirs."""
                nonlocal ahead
                if end <= ahead:
                    return
                start = time.perf_counter()
                found = self._sample_many((plans[j], first + j) for j in range(ahead, end))
                seconds = (time.perf_counter() - start) / (end - ahead)
                for j, hops in enumerate(found, ahead):
                    sampled[j] = hops, seconds
                ahead = end

            # Counters between batches: each batch's io is what the features did since the batch before was
            # gathered, so reads made in between (a cache reading ahead) count too.
            last = self.features.counters()  # this thread is the features' only reader while the epoch runs
            for k in range(count):
                if stop.is_set():
                    return
                # The window's batches (k + 1 to k + window after the pop) and one more, sampled but not yet in
                # the window: the batch that enters it before the next gather, which this gather announces.
                sample_up_to(min(len(plans), k + self.window + 2))
                while window is not None and pushed < min(ahead, k + self.window + 1):
                    window.push(sampled[pushed][0][-1].nodes)
                    pushed += 1
                hops, sample_s = sampled.pop(k)
                if window is not None:
                    window.pop()
                nodes = hops[-1].nodes
                start = time.perf_counter()
                following = None
                if k + 1 < count:  # a shared cache sends the next request while this batch is served
                    entering = [] if window is None else [sampled[j][0][-1].nodes
                                                          for j in range(pushed, min(ahead, k + self.window + 2))]
                    following = (sampled[k + 1][0][-1].nodes, entering)
                x, hit = self.features.gather(nodes, future=None if window is None else window.buffers,
                                              following=following)
                gather_s = time.perf_counter() - start
                if self.prefetch_features:  # e.g. the next iteration's victims move while this batch trains
                    self.features.prefetch()
                after = self.features.counters()
                batch = self._make_batch(first + k, plans[k], hops, x, hit)
                batch.timings = {"sample": sample_s, "gather": gather_s, **self.features.last_timings}
                batch.io = {key: after[key] - last[key] for key in after}
                last = after
                if self.features.trainable:
                    found = self.features.gather_trainable(nodes, None if window is None else window.buffers,
                                                           training=self.training, stop=stop)
                    if found is None:  # stopped while waiting for the previous batch's update
                        return
                    batch.emb, timings, io = found
                    batch.timings.update(timings)
                    batch.io.update(io)
                if not put(batch.unwrap(self.one_type)):
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
