"""``storage.kind=pinned`` (``cache.backend=pinned``): the feature table in page-locked host memory, its rows
gathered by a Triton kernel (lsm_gnn/kernels/row_gather.py) straight into device memory. On CPU the storage
reads to the CPU with the kernel under Triton's interpreter (``device="cpu"``); a cache posed as a device one
(tests/host_budget.py's device mode) over it takes the direct miss path and must return exactly the bytes on disk
and the reference model's rows and hits. The real UVA path on a GPU: tests/test_gpu_paths.py."""
import numpy as np
import pytest
import torch

from cache_oracle import check_against_reference, id_batches
from lsm_gnn import open_storage
from lsm_gnn.cache import PolicyConfig
from lsm_gnn.kernels import triton_interpreted
from lsm_gnn.testing import write_tiny_dataset

pytestmark = pytest.mark.skipif(not triton_interpreted(), reason="needs Triton's interpreter (CPU tensors)")

N = 200
# Odd row widths of each dtype a feature file holds: rows of 52, 14 and 5 bytes.
FORMATS = {"float32": 13, "float16": 7, "uint8": 5}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("pinned")
    made = {}
    for dtype, dim in FORMATS.items():
        dataset, features = write_tiny_dataset(root / dtype, num_nodes=N, dim=dim, dtype=dtype)
        made[dtype] = dataset, torch.from_numpy(np.asarray(features))
    return made


ID_CASES = {
    "random": lambda rng: rng.integers(0, N, 40),
    "repeats, first and last row": lambda rng: np.array([N - 1, 0, 9, 9, N - 1, 0]),
    "empty": lambda rng: np.array([], dtype=np.int64),
}


@pytest.mark.parametrize("dtype", list(FORMATS))
@pytest.mark.parametrize("case", list(ID_CASES))
def test_reads_are_the_rows_on_disk(datasets, dtype, case):
    dataset, features = datasets[dtype]
    ids = torch.from_numpy(ID_CASES[case](np.random.default_rng(len(case))))
    with open_storage(dataset, "pinned", device="cpu") as storage:
        assert storage.device == torch.device("cpu") and storage.dtype == features.dtype
        rows = storage.read(ids)
        assert rows.shape == (ids.numel(), FORMATS[dtype])
        assert torch.equal(rows.view(torch.uint8), features[ids].view(torch.uint8))
        lines = torch.zeros((N + 5, FORMATS[dtype]), dtype=storage.dtype)
        slots = torch.randperm(N + 5, generator=torch.Generator().manual_seed(1))[:ids.unique().numel()]
        storage.read_into(ids.unique(), lines, slots)
        assert torch.equal(lines[slots].view(torch.uint8), features[ids.unique()].view(torch.uint8))


def test_ids_and_slots_out_of_range_are_refused(datasets):
    dataset, _ = datasets["float32"]
    with open_storage(dataset, "pinned", device="cpu") as storage:
        with pytest.raises(IndexError, match=f"node id {N} at position 1 is out of range.*0..{N - 1}"):
            storage.read([3, N])
        with pytest.raises(IndexError, match="node id -1 at position 0"):
            storage.read([-1])
        with pytest.raises(IndexError, match=r"slots must lie in \[0, 4\).*got 0..4"):
            storage.read_into([1, 2], torch.zeros((4, 13)), torch.tensor([0, 4]))
        with pytest.raises(TypeError, match="read-only"):
            storage.write([1], torch.zeros((1, 13)))


def test_it_is_refused_without_cuda_or_the_memory_to_hold_it(datasets, monkeypatch):
    from lsm_gnn.storage import pinned

    dataset, _ = datasets["float32"]
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="torch sees no CUDA device.*backend 'memory'"):
            open_storage(dataset, "pinned")
    with pytest.raises(ValueError, match="reads rows into a CUDA GPU, not meta"):
        open_storage(dataset, "pinned", device="meta")
    monkeypatch.setattr(pinned, "available_memory", lambda: 4096)
    with pytest.raises(MemoryError, match=f"10.2 KiB \\({N} rows of 52 B\\), but only 4.0 KiB is available"):
        open_storage(dataset, "pinned", device="cpu")


def test_a_training_run_on_the_cpu_is_refused_it(datasets):
    from lsm_gnn.build import build_features, resolve
    from lsm_gnn.config import ConfigError, load_config

    dataset, _ = datasets["float32"]
    spec = resolve(load_config(None, [f"dataset={dataset.path}", "cache.backend=pinned", "cache.capacity=50%"]),
                   dataset)
    with pytest.raises(ConfigError, match="cache.backend=pinned .* training runs on cpu.*cache.backend=memory"):
        build_features(spec, dataset, torch.device("cpu"))


@pytest.mark.slow  # about 2 s: ten lookups with the kernels under the interpreter
def test_a_device_cache_over_it_reads_misses_into_its_lines(datasets, monkeypatch):
    from host_budget import device_cache, device_mode

    dataset, features = datasets["float32"]
    config = PolicyConfig("hybrid", window=2, period=1)
    with device_mode(monkeypatch), open_storage(dataset, "pinned", device="cpu") as storage, \
            open_storage(dataset, "memory") as host:
        reads_into = []
        read_into = storage.read_into
        monkeypatch.setattr(storage, "read_into", lambda ids, out, slots: (reads_into.append(ids.numel()),
                                                                          read_into(ids, out, slots)))
        cache = device_cache(storage, misses="direct", num_sets=8, ways=4, policy=config, read_ahead=0)
        assert cache.miss_path == "direct" and cache._stream is not None
        reference = check_against_reference(cache, host, features, config, id_batches(seed=3))
        # Every miss gathered once by the kernel, straight into the lines where the batch kept them all.
        assert storage.stats().rows == cache.stats.misses == reference.stats.misses > 0
        assert 0 < sum(reads_into) < cache.stats.misses


def test_reading_into_device_lines_reads_back_only_the_slots_bounds(datasets):
    """The direct miss path's host work: the slots stay where the lines are and one read brings their bounds back
    (it read back the whole slots, then their minimum and maximum apart); the ids are checked on the host."""
    from host_budget import HostWork

    dataset, features = datasets["float32"]
    ids = torch.tensor([5, N - 1, 0])
    with open_storage(dataset, "pinned", device="cpu") as storage:
        lines = torch.zeros((16, 13))
        work = HostWork()
        work.device(lines)
        work.call(lambda slots: storage.read_into(ids, lines, slots), torch.tensor([3, 15, 0]))
        assert torch.equal(lines[[3, 15, 0]], features[ids])
        work.check({"reads_back": 1, "bytes_to_host": 16})
