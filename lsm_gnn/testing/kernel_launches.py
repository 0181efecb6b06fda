"""Step 1 of the ahead-of-time compile check (:mod:`lsm_gnn.kernels.aot`): the project's own kernel launches,
recorded under Triton's interpreter.

It runs the cache under every policy, both PVP modes and a one-set cache, the read-ahead's miss probe, the
sampler with int32 and int64 indices and several fanouts, and the ``pinned`` storage's reads of rows of each word
width, on CPU tensors with ``kernels=triton``, and keeps each launch's arguments as the launcher sees them. It
drives the cache, the sampler and the storage, so it stands above them, not in ``kernels/``.

    python -m lsm_gnn.testing.kernel_launches launches.json
"""
from __future__ import annotations

import os
import sys
import tempfile

from lsm_gnn.kernels.aot import LaunchRecorder, write_json


def _cache_traces() -> None:
    """The cache as the trainer drives it: every policy, with and without a window, both PVP modes, a one-set
    cache, serving hits first (its graphs too), power-law batches."""
    import numpy as np
    import torch

    from lsm_gnn import open_storage
    from lsm_gnn.cache import SoftwareCache, WindowBuffer
    from lsm_gnn.cache.hits_first import ServeGraphs
    from lsm_gnn.cache.policies import POLICIES
    from lsm_gnn.testing import RecordedGraph, write_tiny_dataset

    with tempfile.TemporaryDirectory() as tmp:
        path, _ = write_tiny_dataset(os.path.join(tmp, "ds"), num_nodes=400, dim=6)
        storage = open_storage(path, "memory")
        rng = np.random.default_rng(0)
        weights = 1.0 / np.arange(1, 401) ** 0.8
        batches = [torch.from_numpy(rng.choice(400, 48, p=weights / weights.sum())) for _ in range(6)]
        runs = [dict(policy=p, ways=8) for p in POLICIES]
        runs += [dict(policy=p, ways=8, pvp=True, pvp_reinstall=r, pvp_queue_capacity=8)
                 for p in ("hybrid_pvp", "hybrid_pvp_room", "farthest") for r in (False, True)]
        runs += [dict(policy="hybrid", ways=32, num_sets=1), dict(policy="farthest", ways=32, num_sets=1),
                 dict(policy="farthest", ways=32), dict(policy="farthest", ways=128)]
        # Serving hits first (a GPU cache's default), over these rows and over rows of 4 KiB (a full copy tile), in
        # caches that hold every row: each batch looked up three times (misses, hits in full, then probed).
        wide, _ = write_tiny_dataset(os.path.join(tmp, "wide"), num_nodes=400, dim=1024)
        runs += [dict(policy=p, ways=w, hits_first=True, num_sets=512 // w)
                 for p, w in (("farthest", 8), ("hybrid", 32), ("lru", 128))]
        runs += [dict(policy="farthest", ways=32, hits_first=True, num_sets=16, storage=open_storage(wide.path, "pread"))]
        for kwargs in runs:
            on = kwargs.pop("storage", storage)
            for window in (0, 3):
                if window == 0 and kwargs.get("pvp"):
                    continue  # PVP needs a window
                capacity = None if "num_sets" in kwargs else max(64, 2 * kwargs["ways"]) * on.row_bytes
                cache = SoftwareCache(on, capacity, window=4, oversubscribe=True, **kwargs)
                out = None
                if kwargs.get("hits_first"):  # the third lookup into an out buffer: served by a graph (opt-in)
                    cache._hits_first.graphs = ServeGraphs(cache.device, new_graph=RecordedGraph.new)
                    out = torch.empty((len(batches[0]), on.dim), dtype=on.dtype)
                for k, batch in enumerate(batches):
                    future = None
                    if window:
                        future = WindowBuffer(window + 1, storage.num_rows)
                        for ahead in batches[k + 1:k + 1 + window]:
                            future.push(ahead)
                    for again in range(3 if kwargs.get("hits_first") else 1):
                        cache.lookup(batch, future=future, out=out if again == 2 else None)
                    cache.prefetch()


def _read_ahead_probes() -> None:
    """The read-ahead's miss probe of a cache on a device (its tags looked up where they are), at the ways the
    cache runs above, a one-set cache's included."""
    import torch

    from lsm_gnn.cache.read_ahead import misses_on_device

    batches = [torch.arange(0, 300, 3), torch.arange(100, 160)]
    for num_sets, ways in ((1, 32), (16, 8), (8, 32), (4, 128)):
        tags = torch.arange(num_sets * ways, dtype=torch.int64) * 5
        misses_on_device(tags, ways, batches, [torch.empty(0, dtype=torch.int64)] * len(batches))


def _sampler_runs() -> None:
    """The sampler over int32 and int64 CSRs, at fanouts -1 (all), 0, 1, 10, 25 and 50, one and several hops."""
    import numpy as np
    import torch

    from lsm_gnn.kernels import ops  # noqa: F401  (registers torch.ops.lsm_gnn)

    rng = np.random.default_rng(1)
    num_nodes = 300
    degree = rng.integers(0, 40, num_nodes)
    indptr = np.concatenate([[0], np.cumsum(degree)])
    indices = rng.integers(0, num_nodes, int(indptr[-1]))
    seeds = torch.from_numpy(rng.choice(num_nodes, 40, replace=False))
    for index_dtype in (torch.int32, torch.int64):
        csr = torch.from_numpy(indptr).to(index_dtype), torch.from_numpy(indices).to(index_dtype)
        for fanouts in ([-1], [0], [1], [10, 5], [25, 10], [1, 1], [50]):
            torch.ops.lsm_gnn.sample_hops(*csr, seeds, fanouts, 7, 3, 1)


def _pinned_reads() -> None:
    """The ``pinned`` storage's gathers, into a batch and into lines, of rows that move as 8-, 4-, 2- and 1-byte
    words (float32 x 256 and x 13, float16 x 13, uint8 x 5)."""
    import torch

    from lsm_gnn import open_storage
    from lsm_gnn.testing import write_tiny_dataset

    with tempfile.TemporaryDirectory() as tmp:
        for dtype, dim in (("float32", 256), ("float32", 13), ("float16", 13), ("uint8", 5)):
            path, _ = write_tiny_dataset(os.path.join(tmp, f"{dtype}-{dim}"), num_nodes=300, dim=dim, dtype=dtype)
            with open_storage(path, "pinned", device="cpu") as storage:
                ids = torch.tensor([299, 0, 17, 17, 42])
                storage.read(ids)
                storage.read_into(ids[:3], torch.empty((8, dim), dtype=storage.dtype), torch.tensor([7, 0, 3]))


def record(path: str) -> int:
    """Runs the project's launches under the interpreter and writes them to ``path``; returns their number."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from lsm_gnn.kernels import using

    import triton

    if type(triton.language.sum).__name__ != "InterpretedFunction":
        raise SystemExit("kernel_launches: triton was imported without its interpreter; run it in a fresh process "
                         "with TRITON_INTERPRET=1")
    with using("triton"), LaunchRecorder() as recorder:
        _cache_traces()
        _read_ahead_probes()
        _sampler_runs()
        _pinned_reads()
    launches = list(recorder.launches.values())
    write_json(path, {"triton": triton.__version__, "launches": launches})
    return len(launches)


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the JSON file of recorded launches (for python -m lsm_gnn.kernels.aot compile)")
    args = p.parse_args(argv)
    print(f"recorded {record(args.out)} distinct launches in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
