"""Helpers the benchmark scripts share: timing medians, result files and reused datasets."""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import platform
import sys
import time

from lsm_gnn.data import DatasetError, open_dataset
from lsm_gnn.data.dataset import ONE_TYPE
from lsm_gnn.utils.fileio import atomic_write_bytes
from lsm_gnn.utils.timing import median_seconds  # noqa: F401  (the benchmark scripts take it from here too)


def write_json(path: str, result, indent: int = 2) -> None:
    """Writes a result file atomically (a killed run never leaves half a JSON behind)."""
    atomic_write_bytes(json.dumps(result, indent=indent).encode(), path)


def disk_read_bytes(path: str) -> int:
    """Bytes read so far, by every process, from the block device that holds ``path``
    (``/sys/dev/block/<major>:<minor>/stat``); -1 where that is unknown (not a block device, not Linux).
    Two readings around a measurement show whether another job was reading the same disk."""
    dev = os.stat(path).st_dev
    try:
        with open(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat") as f:
            return int(f.read().split()[2]) * 512  # sectors read, in 512-byte units whatever the device's
    except (OSError, IndexError, ValueError):
        return -1


def machine_info() -> dict:
    """What a result file records about the machine it was measured on."""
    import torch

    return {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__}


@functools.lru_cache(maxsize=None)
def load_script(path: str):
    """A benchmark script as a module (benchmarks/ is no package), loaded once per path and registered in
    ``sys.modules`` as ``benchmarks.<name>`` (dataclasses look their module up there)."""
    name = "benchmarks." + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def feature_paths(dataset) -> list[str]:
    """The feature files of a dataset: one per node type that has features."""
    return [dataset.node_type(t).feature_path for t in dataset.feature_types]


def reusable_dataset(path: str, *, num_nodes: int | None = None, node_counts: dict[str, int] | None = None,
                     feature_dim: int | None = None, feature_dtype: str | None = None, generator: dict | None = None,
                     log=None):
    """The dataset an earlier run left at ``path`` if it opens and matches, else None (the caller writes it).

    It matches when it has ``node_counts`` nodes of each type named there (``num_nodes``: a one-type dataset's
    count, of schema 1's one type) and, where given, ``feature_dim``, ``feature_dtype`` (a numpy name: the target
    type's) and the ``generator`` settings recorded in its meta. An unreadable one is reported through ``log``
    when given.
    """
    if (num_nodes is None) == (node_counts is None):
        raise ValueError("give exactly one of num_nodes (a one-type dataset's count) and node_counts (per node type)")
    wanted = {ONE_TYPE: num_nodes} if node_counts is None else node_counts
    if not os.path.isdir(path):
        return None
    try:
        ds = open_dataset(path, check="shape")
    except DatasetError as exc:
        if log is not None:
            log(f"  {path} is unusable ({exc}); re-creating it")
        return None
    recorded = ds.meta.get("generator") or {}
    if any(recorded.get(key) != value for key, value in (generator or {}).items()):
        return None
    if any(t not in ds.types or ds.num_nodes_of(t) != n for t, n in wanted.items()) \
            or (feature_dim is not None and ds.feature_dim != feature_dim) \
            or (feature_dtype is not None and ds.feature_dtype.name != feature_dtype):
        return None
    return ds


def side_by_side_per_batch(sampler, batches, group: int = 8) -> float:
    """Seconds per batch of ``sampler.sample_many`` over ``batches``, ``group`` at a time (each group's hops
    dropped before the next, as a loader's window keeps about that many: holding every batch's hops at once
    would time fresh memory's page faults, not the sampler)."""
    start = time.perf_counter()
    for first in range(0, len(batches), group):
        sampler.sample_many([(s, first + k) for k, s in enumerate(batches[first:first + group])])
    return (time.perf_counter() - start) / len(batches)
