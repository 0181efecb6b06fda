"""The throughput model: stage times per iteration in, wall time, bound stage and a recommendation out.

Pure arithmetic over measured or simulated inputs (no I/O), so every rule
here is tested on hand-made numbers. The trainer's pipeline it models:

  loader thread   sample batch k+W  ->  gather batch k (cache lookup + storage reads for the misses)
  main thread     train batch k-1 (overlapped), on ``train_threads`` threads
  read-ahead      with ``cache.read_ahead``: the misses of batch k+1 read while the loader does the rest,
                  so the loader takes the longer of its reads and its other work, not their sum
  node embeddings with ``model.node_embedding``: the main thread updates batch k's rows after its step
                  (``update``), and only then does the loader read batch k+1's rows through their cache
                  (``embedding``): the two run one after the other, between two training steps, whatever
                  else overlaps

Roughly, the run goes at the pace of the slower thread; :func:`pipeline_ms`
plays it iteration by iteration through the loader's queue. Each is slowed by
the other where they compete for cores: with ``c`` cores, training on ``m``
of them and the loader's one thread, ``m + 1 > c`` runnable threads share
``c`` cores fairly, so while both compute each loses ``(m + 1 - c) / c`` of
the time the other computes (one core: the CPU work adds up; enough cores:
no loss). The loader's CPU work is sampling, the cache's work and the CPU
share of the storage reads (submitting, reaping, copying rows out); the
rest of a read is waiting on the device, which costs no core. Before the
first batch the loader samples the window (``window`` batches) alone: a
fixed start-up cost per epoch that short runs feel.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

#: loader components, in the order the bound is reported when several tie
LOADER_STAGES = ("sample", "cache", "read")


@dataclass(frozen=True)
class StageMs:
    """Milliseconds per iteration of each stage, each measured alone: ``cache`` is the cache's CPU work
    in gather (lookup metadata, copying hits out and misses in), ``read`` the storage reads of the misses,
    ``read_cpu`` the part of ``read`` the CPU is busy; ``read_ahead``: the reads run beside the loader's
    other work (the cache reads the next batch's misses ahead). ``embedding``: reading the batch's node
    embeddings through their tables' caches (the cache's work, its reads and write-backs); ``update``: the
    optimizer's step on those rows; each waits for the other, so both add to training's side and the first
    to the loader's too."""

    sample: float
    cache: float
    read: float
    train: float
    read_cpu: float = 0.0
    read_ahead: bool = False
    embedding: float = 0.0
    update: float = 0.0

    @property
    def gather(self) -> float:
        return self.cache + self.read

    @property
    def loader(self) -> float:
        """The loader's time per iteration, alone: sampling one batch and gathering one; with read-ahead the
        reads overlap the rest."""
        if self.read_ahead:
            return max(self.read, self.sample + self.cache)
        return self.sample + self.gather

    @property
    def loader_cpu(self) -> float:
        """The loader's CPU time per iteration (what competes with training for cores)."""
        return self.sample + self.cache + min(self.read_cpu, self.read)

    def as_dict(self) -> dict:
        return {**asdict(self), "gather": self.gather, "loader": self.loader, "loader_cpu": self.loader_cpu}


def contended_ms(stages: StageMs, cores: int, train_threads: int) -> tuple[float, float]:
    """(train, loader) milliseconds per iteration with both threads running on ``cores`` cores."""
    if cores < 1 or train_threads < 1:
        raise ValueError(f"cores and train_threads must be >= 1, got {cores} and {train_threads}")
    used = min(train_threads, cores)
    loss = max(used + 1 - cores, 0) / cores  # share of the other's CPU time each thread loses
    # The embeddings' update and read run while neither thread overlaps them: serial on both sides.
    serial = stages.update + stages.embedding
    train = stages.train + loss * stages.loader_cpu + serial
    slowed = loss * min(stages.train, stages.loader_cpu)  # what training's CPU work adds to the loader's
    if stages.read_ahead:  # only the loader's CPU work is slowed; the reads beside it wait on the device
        return train, max(stages.read, stages.sample + stages.cache + slowed) + stages.embedding
    return train, stages.loader + slowed + stages.embedding


def steady_ms(stages: StageMs, cores: int, train_threads: int = 1) -> float:
    """Milliseconds per iteration once the pipeline is full: the slower of the two threads."""
    return max(contended_ms(stages, cores, train_threads))


def bound_stage(stages: StageMs, cores: int, train_threads: int = 1) -> str:
    """The stage that sets the pace: ``train`` when the loader keeps up (``embedding`` where the node
    embeddings' read and update take longer than the step), else the loader's largest part (``sample``,
    ``cache`` or ``read``)."""
    train, loader = contended_ms(stages, cores, train_threads)
    if train >= loader:
        return "embedding" if stages.embedding + stages.update > stages.train else "train"
    parts = {"sample": stages.sample, "cache": stages.cache, "read": stages.read}
    return max(LOADER_STAGES, key=lambda k: parts[k])


def pipeline_ms(train_ms: list[float], loader_ms: list[float], queue: int, start_ms: float = 0.0) -> float:
    """Milliseconds from the loader's start to the end of the last training step, iteration by iteration:
    the loader produces batch k in ``loader_ms[k]`` once it has put batch k-1 into a queue of ``queue``
    batches (it waits while the queue is full); training takes batch k when it is queued and the step
    before has ended, and trains for ``train_ms[k]``. ``start_ms`` delays the first batch (filling the
    window). A loader slow on some iterations (window scans, many misses) is hidden by the queue only as
    far as the queue reaches: the mean of the maxima, not the maximum of the means."""
    if queue < 1:
        raise ValueError(f"queue must be >= 1, got {queue}")
    if len(train_ms) != len(loader_ms):
        raise ValueError(f"{len(train_ms)} training steps for {len(loader_ms)} batches")
    taken: list[float] = []  # when training took each batch (frees its place in the queue)
    produced_at = start_ms  # when the loader is free to start the next batch
    end = 0.0
    for k, (train, load) in enumerate(zip(train_ms, loader_ms)):
        ready = produced_at + load
        queued = ready if k < queue else max(ready, taken[k - queue])  # a full queue holds the loader
        take = max(queued, end)
        taken.append(take)
        end = take + train
        produced_at = queued
    return end


def run_ms(stages: list[StageMs], cores: int, train_threads: int = 1, *, window: int, fill_sample_ms: float,
           epoch_length: int, queue: int = 2) -> float:
    """Total milliseconds of a run of ``len(stages)`` iterations (one StageMs per iteration): each epoch
    starts with the window's fill (``window`` batches sampled at ``fill_sample_ms`` each, training waiting),
    then the two threads run as :func:`pipeline_ms` says, each slowed by the other (:func:`contended_ms`)."""
    if not stages:
        raise ValueError("a run needs at least one iteration")
    total = 0.0
    for first in range(0, len(stages), max(epoch_length, 1)):
        epoch = stages[first:first + max(epoch_length, 1)]
        times = [contended_ms(s, cores, train_threads) for s in epoch]
        total += pipeline_ms([t for t, _ in times], [ld for _, ld in times], queue, window * fill_sample_ms)
    return total


def recommend(rows: list[dict], tolerance: float = 0.05) -> dict | None:
    """The cheapest setting within ``tolerance`` of the fastest: among ``rows`` (each with
    ``capacity_bytes`` and ``ms_per_iteration``), the smallest cache whose predicted time is at most
    (1 + tolerance) x the best; ties go to the faster. None for no rows."""
    if not rows:
        return None
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    best = min(r["ms_per_iteration"] for r in rows)
    good = [r for r in rows if r["ms_per_iteration"] <= best * (1 + tolerance)]
    return min(good, key=lambda r: (r["capacity_bytes"], r["ms_per_iteration"]))
