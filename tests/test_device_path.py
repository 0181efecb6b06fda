"""The device-resident data path: staged miss reads, the exchange's device, a cache on a GPU.

The staging buffer's logic and the backend choice run everywhere. The GPU cases (a cache on the device
returns the file's bytes and decides as the CPU cache does, with and without PVP) need a CUDA GPU and
triton and are skipped otherwise; benchmarks/gpu_suite.sh runs them on a GPU machine.
"""
import contextlib

import numpy as np
import pytest
import torch
import torch.distributed as dist

from lsm_gnn import open_storage
from lsm_gnn.cache import SoftwareCache, WindowBuffer
from lsm_gnn.cache.staging import MissStaging, side_stream
from lsm_gnn.comm.shared_cache import exchange_backend
from lsm_gnn.testing import write_tiny_dataset

try:
    import triton  # noqa: F401

    HAVE_CUDA = torch.cuda.is_available()
except ImportError:
    HAVE_CUDA = False
needs_cuda = pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA GPU and triton")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path, features = write_tiny_dataset(tmp_path_factory.mktemp("device") / "ds", num_nodes=500, dim=6)
    return path, torch.from_numpy(np.asarray(features))


def test_staging_returns_the_rows_and_reuses_its_buffer(dataset):
    path, features = dataset
    storage = open_storage(path, "pread")
    staging = MissStaging("cpu", pin=False)  # the logic a GPU cache runs, without page-locking
    first = staging.read(storage, torch.arange(100, 140))
    assert torch.equal(first, features[100:140]) and staging.capacity == 40
    buffer = staging._buffer
    second = staging.read(storage, torch.tensor([7, 3, 3, 499]))
    assert torch.equal(second, features[[7, 3, 3, 499]])
    assert staging._buffer is buffer, "a smaller batch reuses the buffer"
    assert torch.equal(first, features[100:140]), "rows handed out never alias the buffer"
    staging.read(storage, torch.arange(0, 50))
    assert staging.capacity == 80, "the buffer grows geometrically"
    assert staging.read(storage, torch.empty(0, dtype=torch.int64)).shape == (0, 6)


def test_side_stream_without_a_stream_changes_nothing():
    with side_stream(None) as caller:
        assert caller is None


@pytest.mark.parametrize("fail", [False, True])
def test_side_stream_makes_the_caller_wait_even_when_the_block_raises(monkeypatch, fail):
    from fake_cuda import StreamRecorder

    rec = StreamRecorder()
    rec.install(monkeypatch)
    side = torch.cuda.Stream()
    with pytest.raises(RuntimeError) if fail else contextlib.nullcontext():
        with side_stream(side) as caller:
            assert caller is rec.default and torch.cuda.current_stream() is side
            if fail:
                raise RuntimeError("a lookup failed after issuing work on the side stream")
    assert torch.cuda.current_stream() is rec.default
    assert rec.log == [("record", "default"), ("wait", side.name, "default"),  # the side stream starts after
                       ("record", side.name), ("wait", "default", side.name)]  # and the caller waits for it


def test_exchange_backend(monkeypatch):
    assert exchange_backend(torch.device("cpu")) == "gloo"
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert exchange_backend(torch.device("cuda", 0)) == "nccl"
    assert exchange_backend(torch.device("cpu")) == "gloo"
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    assert exchange_backend(torch.device("cuda", 0)) == "gloo"


@pytest.mark.skipif(HAVE_CUDA, reason="checks the refusal on a machine without a GPU")
def test_a_cuda_cache_without_a_gpu_is_refused(dataset):
    storage = open_storage(dataset[0], "memory")
    with pytest.raises(RuntimeError, match="no CUDA device.*device='cpu'"):
        SoftwareCache(storage, "2K", device="cuda")


def run_trace(cache, batches, window):
    """(rows, hit masks, final snapshot) of a cache serving ``batches`` with a window of what follows."""
    out = []
    for k, batch in enumerate(batches):
        buffer = WindowBuffer(window + 1, cache.storage.num_rows)
        for future in batches[k + 1:k + 1 + window]:
            buffer.push(future)
        rows, hit = cache.lookup(batch, future=buffer)
        out.append((rows.cpu(), hit.cpu()))
        cache.prefetch()
    return out, cache.snapshot()


@needs_cuda
@pytest.mark.parametrize("pvp", [False, True])
@pytest.mark.parametrize("policy", ["hybrid", "lru", "dynamic"])
def test_a_gpu_cache_returns_the_file_and_decides_as_the_cpu_cache(dataset, policy, pvp):
    path, features = dataset
    storage = open_storage(path, "pread")
    rng = np.random.default_rng(3)
    batches = [torch.from_numpy(rng.choice(500, 60)) for _ in range(30)]
    caches = [SoftwareCache(storage, 100 * storage.row_bytes, ways=4, policy=policy, window=4, device=device,
                            pvp=pvp, pvp_queue_capacity=8) for device in ("cpu", "cuda")]
    (cpu_out, cpu_state), (gpu_out, gpu_state) = (run_trace(c, batches, 4) for c in caches)
    for k, ((cpu_rows, cpu_hit), (gpu_rows, gpu_hit)) in enumerate(zip(cpu_out, gpu_out)):
        assert torch.equal(gpu_rows, features[batches[k]]), f"batch {k}: rows differ from the file"
        assert torch.equal(gpu_hit, cpu_hit), f"batch {k}: hits differ from the CPU cache"
    for name in cpu_state:
        assert np.array_equal(cpu_state[name], gpu_state[name]), f"{name} differs from the CPU cache"
    assert caches[1].stats.hits == caches[0].stats.hits > 0
