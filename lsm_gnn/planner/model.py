"""The throughput model: stage times per iteration in, wall time, bound stage and a recommendation out.

Pure arithmetic over measured or simulated inputs (no I/O), so every rule
here is tested on hand-made numbers. The trainer's pipeline it models:

  loader thread   sample batch k+W  ->  gather batch k (cache lookup + storage reads for the misses)
  main thread     train batch k-1 (overlapped)

With two or more cores the steady state runs at the pace of the slower
thread; with one core the threads' CPU work adds up, and only the time the
loader waits on storage overlaps training. Before the first batch the
loader samples the window (``window`` batches) alone: a fixed start-up
cost per epoch that short runs feel.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

#: loader components, in the order the bound is reported when several tie
LOADER_STAGES = ("sample", "cache", "read")


@dataclass(frozen=True)
class StageMs:
    """Milliseconds per iteration of each stage: ``cache`` is the cache's CPU work in gather (lookup
    metadata, copying hits out and misses in), ``read`` the storage reads of the misses."""

    sample: float
    cache: float
    read: float
    train: float

    @property
    def gather(self) -> float:
        return self.cache + self.read

    @property
    def loader(self) -> float:
        """The loader thread's time per iteration: sampling one batch and gathering one."""
        return self.sample + self.gather

    def as_dict(self) -> dict:
        return {**asdict(self), "gather": self.gather, "loader": self.loader}


def steady_ms(stages: StageMs, cores: int) -> float:
    """Milliseconds per iteration once the pipeline is full."""
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    if cores >= 2:
        return max(stages.train, stages.loader)
    # One core: CPU work is serial; a storage read (the CPU waits on the device) overlaps training.
    return max(stages.train + stages.sample + stages.cache, stages.loader)


def bound_stage(stages: StageMs, cores: int) -> str:
    """The stage that sets the pace: ``train`` when the loader keeps up, else the loader's largest part
    (``sample``, ``cache`` or ``read``); with one core ``cpu`` when the threads' CPU work adds up to more
    than the loader alone."""
    if cores < 2 and stages.train + stages.sample + stages.cache > stages.loader:
        return "cpu" if stages.sample + stages.cache > 0 and stages.train > 0 else "train"
    if stages.train >= stages.loader:
        return "train"
    parts = {"sample": stages.sample, "cache": stages.cache, "read": stages.read}
    return max(LOADER_STAGES, key=lambda k: parts[k])


def run_ms(stages: StageMs, cores: int, *, iterations: int, window: int, fill_sample_ms: float,
           epoch_length: int) -> float:
    """Total milliseconds of a run of ``iterations``: per epoch started, the window's fill (``window``
    batches sampled at ``fill_sample_ms`` each, the trainer waiting) and the first gather, then the
    steady state."""
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    epochs = math.ceil(iterations / max(epoch_length, 1))
    fill = epochs * (window * fill_sample_ms + stages.gather)
    return fill + iterations * steady_ms(stages, cores)


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
