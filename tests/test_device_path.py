"""The device-resident data path: staged miss reads, the exchange's device, a cache on a GPU.

The staging buffer's logic and the backend choice run everywhere. The GPU cases (a cache on the device
returns the file's bytes and decides as the CPU cache does, for every policy, without PVP and in both PVP
modes) need a CUDA GPU and triton and are skipped otherwise; benchmarks/gpu_suite.sh runs them on a GPU
machine. A few of them also run here with the Triton kernels under the interpreter, which checks the test.
"""
import contextlib

import numpy as np
import pytest
import torch
import torch.distributed as dist

from lsm_gnn import kernels, open_storage
from lsm_gnn.cache import POLICIES, SoftwareCache, WindowBuffer
from lsm_gnn.cache.staging import MissStaging, side_stream
from lsm_gnn.comm.shared_cache import exchange_backend
from lsm_gnn.testing import power_law_trace, write_tiny_dataset

try:
    import triton  # noqa: F401

    HAVE_CUDA = torch.cuda.is_available()
except ImportError:
    HAVE_CUDA = False
needs_cuda = pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA GPU and triton")
# The cpu_triton cases run the kernels under Triton's interpreter, which lsm_gnn turns on only where no GPU is seen.
needs_interpreter = pytest.mark.skipif(HAVE_CUDA, reason="triton compiles for the GPU in this process: no interpreter")


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


@contextlib.contextmanager
def kernels_of(device: str):
    """The kernels a cache on ``device`` runs: Triton compiled for the GPU, or for ``cpu`` the same Triton source
    under the interpreter (kernels=triton), which runs the test's logic on any machine."""
    if device != "cpu":  # cuda: the compiled kernels; native: the C++ core
        yield
        return
    with kernels.using("triton"):
        yield


def run_trace(cache, batches, window, device="native"):
    """Per batch (rows, hit mask, the line of every id of the graph), and the final snapshot, of a cache serving
    ``batches`` with a window of what follows, on ``device``'s kernels ("native": the C++ core on CPU tensors)."""
    out = []
    every_id = torch.arange(cache.storage.num_rows)
    with kernels_of(device):
        for k, batch in enumerate(batches):
            buffer = WindowBuffer(window + 1, cache.storage.num_rows)
            for future in batches[k + 1:k + 1 + window]:
                buffer.push(future)
            rows, hit = cache.lookup(batch, future=buffer)
            out.append((rows.cpu(), hit.cpu(), cache.lines_of(every_id).cpu()))
            cache.prefetch()
        cache.settle()
    return out, cache.snapshot()


PVP_MODES = {"off": {}, "reinstall": dict(pvp=True, pvp_queue_capacity=8),
             "paper": dict(pvp=True, pvp_queue_capacity=8, pvp_reinstall=False)}
# The cpu cases run the Triton kernels under the interpreter (seconds a batch): one policy per PVP mode, fewer
# batches, enough to check the test itself (all but one marked slow); the GPU runs every policy in every mode.
CPU_CASES = {("hybrid", "paper"): [], ("lru", "reinstall"): [pytest.mark.slow], ("farthest", "off"): [pytest.mark.slow]}


def device_cases():
    for policy in POLICIES:
        for mode in PVP_MODES:
            yield pytest.param("cuda", policy, mode, marks=needs_cuda, id=f"cuda-{policy}-{mode}")
            if (policy, mode) in CPU_CASES:
                yield pytest.param("cpu", policy, mode, marks=[needs_interpreter, *CPU_CASES[policy, mode]],
                                   id=f"cpu_triton-{policy}-{mode}")


@pytest.mark.parametrize("device,policy,pvp", list(device_cases()))
def test_a_device_cache_returns_the_file_and_decides_as_the_cpu_cache(dataset, device, policy, pvp):
    """Line by line: the rows equal the file's bytes, and hits, the line of every id, evictions, victim-buffer
    counts and the cache's whole state equal the CPU cache's, batch by batch over power-law batches."""
    path, features = dataset
    storage = open_storage(path, "pread")
    num_batches = 16 if device == "cuda" else 7
    batches = [torch.from_numpy(b) for b in power_law_trace(3, num_batches, 60, storage.num_rows, 0.8)]
    caches = [SoftwareCache(storage, 100 * storage.row_bytes, ways=4, policy=policy, window=4, period=2,
                            device=on, **PVP_MODES[pvp]) for on in ("cpu", device)]
    # The reference is the CPU cache on the C++ core; the cache under test runs ``device``'s kernels.
    (want, want_state), (got, got_state) = run_trace(caches[0], batches, 4, "native"), \
        run_trace(caches[1], batches, 4, device)
    for k, ((want_rows, want_hit, want_lines), (rows, hit, lines)) in enumerate(zip(want, got)):
        assert torch.equal(rows, features[batches[k]]), f"batch {k}: rows differ from the file"
        assert torch.equal(want_rows, features[batches[k]]), f"batch {k}: the CPU cache's rows differ from the file"
        assert torch.equal(hit, want_hit), f"batch {k}: hits differ from the CPU cache"
        assert torch.equal(lines, want_lines), f"batch {k}: the lines of ids differ from the CPU cache"
    for name in want_state:
        assert np.array_equal(want_state[name], got_state[name]), f"{name} differs from the CPU cache"
    cpu, dev = caches
    assert vars(dev.stats) == vars(cpu.stats) and cpu.stats.hits > 0 and cpu.stats.evictions > 0
    if cpu.pvp is not None:
        assert dev.pvp.stats == cpu.pvp.stats
        assert dev.pvp.snapshot() == cpu.pvp.snapshot(), "victim queues differ"


def test_the_table_held_on_the_device_returns_the_file(dataset):
    """cache.features=device: the whole table where the model is (a GPU run's ceiling); on a CPU it is the RAM
    table, and asking for a GPU without one says what to use instead."""
    from lsm_gnn.storage.memory import DeviceMemoryStorage

    ds, features = dataset
    table = DeviceMemoryStorage(ds, "cuda" if HAVE_CUDA else "cpu")
    ids = torch.tensor([5, 0, 499, 5])
    rows, hit = table.gather(ids)
    assert rows.device.type == table.device.type and torch.equal(rows.cpu(), features[ids]) and not hit.any()
    with pytest.raises(IndexError, match="out of range"):
        table.gather(torch.tensor([500]))
    if not HAVE_CUDA:
        with pytest.raises(RuntimeError, match="cache.features=memory"):
            DeviceMemoryStorage(ds, "cuda")


def test_features_on_the_device_are_a_config_choice(dataset):
    from lsm_gnn.build import build_features, resolve
    from lsm_gnn.config import load_config

    ds, features = dataset
    cfg = load_config(None, [f"dataset={ds.path}", "cache.features=device"])
    source = build_features(resolve(cfg, ds), ds, torch.device("cpu"))
    assert torch.equal(source.gather({"node": torch.arange(10)})[0]["node"], features[:10])
    with pytest.raises(TypeError, match=r"nodes are given as \{node type: ids\}, got Tensor: e.g. \{'node': ids\}"):
        source.gather(torch.arange(10))


def test_features_on_the_device_are_one_table_refused_for_several_featured_types(tmp_path):
    """One table on the device: a typed graph's one featured type is held there; several are refused."""
    from lsm_gnn.build import build_features, resolve
    from lsm_gnn.config import ConfigError, load_config
    from lsm_gnn.data.hetero_writer import HeteroDatasetWriter
    from lsm_gnn.testing import write_tiny_hetero_dataset

    ds = write_tiny_hetero_dataset(tmp_path / "h")
    ds = ds[0] if isinstance(ds, tuple) else ds
    cfg = load_config(None, [f"dataset={ds.path}", "cache.features=device"])
    with pytest.raises(ConfigError, match="cache.features=cache or memory"):
        build_features(resolve(cfg, ds), ds, torch.device("cpu"))
    written = np.random.default_rng(0).standard_normal((40, 8)).astype(np.float32)
    with HeteroDatasetWriter(tmp_path / "one", node_types={"paper": {"num_nodes": 40, "feature_dim": 8},
                                                           "topic": {"num_nodes": 4}}, target=None) as w:
        w.write_features("paper", written)
        w.write_edges(("topic", "topic_of", "paper"), [(np.arange(40) % 4, np.arange(40))])
        one = w.commit()
    cfg = load_config(None, [f"dataset={one.path}", "cache.features=device"])
    source = build_features(resolve(cfg, one), one, torch.device("cpu"))
    ids = torch.tensor([3, 0, 39])
    assert torch.equal(source.gather({"paper": ids})[0]["paper"], torch.from_numpy(written[ids.numpy()]))
