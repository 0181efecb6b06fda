"""Every storage backend returns exactly the bytes on disk, in request order."""
import os
import tempfile
import threading

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fake_kvikio

from lsm_gnn import open_dataset, open_storage
from lsm_gnn.storage import BACKENDS
from lsm_gnn.testing import write_tiny_dataset

HOST_BACKENDS = ["io_uring", "pread", "mmap", "memory"]
N = 1000


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    dataset, features = write_tiny_dataset(tmp_path_factory.mktemp("ds") / "tiny", num_nodes=N, dim=13)
    return dataset, torch.from_numpy(features)


@pytest.fixture(scope="module", params=HOST_BACKENDS)
def storage(request, tiny):
    with open_storage(tiny[0], request.param) as s:
        yield s


ADVERSARIAL = {
    "single": [5],
    "first_and_last": [0, N - 1],
    "all_same": [7] * 300,
    "sorted_run": list(range(100, 400)),
    "reversed": list(range(N - 1, -1, -1)),
    "duplicates_interleaved": [3, 9, 3, 9, 3, 998, 999, 998],
    "every_row_twice": list(range(N)) * 2,
}


@pytest.mark.parametrize("case", sorted(ADVERSARIAL))
def test_adversarial_batches_return_the_rows_on_disk(storage, tiny, case):
    ids = torch.tensor(ADVERSARIAL[case])
    assert torch.equal(storage.read(ids), tiny[1][ids])


def test_random_batches_match_direct_file_reads(storage, tiny):
    rng = np.random.default_rng(1)
    for _ in range(5):
        ids = rng.integers(0, N, rng.integers(1, 3000))
        assert np.array_equal(storage.read(ids).numpy(), tiny[0].read_features_direct(ids))


def test_empty_batch(storage, tiny):
    out = storage.read(torch.empty(0, dtype=torch.int64))
    assert out.shape == (0, tiny[0].feature_dim)


@pytest.mark.parametrize("bad", [-1, N, N + 10**9])
def test_out_of_range_id_raises_index_error_naming_it(storage, bad):
    with pytest.raises(IndexError, match=str(bad)):
        storage.read([0, 1, bad])


def test_float_ids_are_refused(storage):
    with pytest.raises(TypeError, match="integers"):
        storage.read(torch.tensor([1.0, 2.0]))


def test_out_argument_is_filled_and_checked(storage, tiny):
    ids = torch.tensor([4, 2, 4])
    out = torch.empty((3, tiny[0].feature_dim), dtype=storage.dtype)
    assert storage.read(ids, out=out) is out
    assert torch.equal(out, tiny[1][ids])
    with pytest.raises(ValueError, match="shape"):
        storage.read(ids, out=torch.empty((2, tiny[0].feature_dim), dtype=storage.dtype))


@pytest.mark.parametrize("case", sorted(ADVERSARIAL))
def test_read_into_places_each_row_in_its_slot_and_nothing_else(storage, tiny, case):
    """The cache's direct miss path: row of ids[i] into out[slots[i]], every other row of out untouched."""
    ids = torch.tensor(ADVERSARIAL[case])
    rng = np.random.default_rng(len(ids))
    out = torch.full((2 * N + 7, tiny[0].feature_dim), -3.0, dtype=storage.dtype)
    slots = torch.from_numpy(rng.permutation(out.shape[0])[:ids.numel()])
    before = out.clone()
    storage.read_into(ids, out, slots)
    assert torch.equal(out[slots], tiny[1][ids])
    untouched = torch.ones(out.shape[0], dtype=torch.bool)
    untouched[slots] = False
    assert torch.equal(out[untouched], before[untouched])


def test_read_into_checks_its_arguments(storage, tiny):
    out = torch.zeros((10, tiny[0].feature_dim), dtype=storage.dtype)
    storage.read_into(torch.empty(0, dtype=torch.int64), out, torch.empty(0, dtype=torch.int64))  # nothing
    assert not out.any()
    with pytest.raises(IndexError, match=r"slots must lie in \[0, 10\)"):
        storage.read_into([1, 2], out, torch.tensor([3, 10]))
    with pytest.raises(ValueError, match="one row of out per id"):
        storage.read_into([1, 2], out, torch.tensor([3]))
    with pytest.raises(ValueError, match="contiguous"):
        storage.read_into([1, 2], out[:, :2], torch.tensor([3, 4]))
    with pytest.raises(IndexError, match=str(N)):
        storage.read_into([1, N], out, torch.tensor([3, 4]))
    if hasattr(storage, "_reader"):  # the native reader checks slots itself too (its own callers)
        with pytest.raises(IndexError, match=r"slots\[1\] = 10 is not a row of out \(10 rows\)"):
            storage._reader.read(torch.tensor([1, 2]), out.view(torch.uint8).view(-1), torch.tensor([3, 10]))


def test_read_async_returns_the_same_rows(storage, tiny):
    ids = torch.randint(0, N, (500,))
    assert torch.equal(storage.read_async(ids).result(), tiny[1][ids])


def test_concurrent_reads_from_many_threads(storage, tiny):
    errors = []

    def worker(seed):
        g = torch.Generator().manual_seed(seed)
        for _ in range(10):
            ids = torch.randint(0, N, (700,), generator=g)
            if not torch.equal(storage.read(ids), tiny[1][ids]):
                errors.append(seed)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.parametrize("backend", ["io_uring", "pread"])
def test_counters_report_coalescing_and_amplification(tiny, backend):
    with open_storage(tiny[0], backend) as s:
        s.read(list(range(10, 20)) + [10, 500])  # one run of 10 rows, a duplicate, one lone row
        stats = s.stats()
        assert (stats.batches, stats.rows, stats.unique_rows, stats.requests) == (1, 12, 11, 2)
        assert stats.bytes_useful == 11 * s.row_bytes
        assert stats.bytes_read >= stats.bytes_useful and stats.amplification >= 1.0
        assert stats.last_batch_seconds > 0
        s.reset_stats()
        assert s.stats().batches == 0


@pytest.mark.parametrize("backend", ["io_uring", "pread"])
@pytest.mark.parametrize("queue_depth", [1, 3])
def test_small_queue_depth_and_short_requests(tiny, backend, queue_depth):
    # 512-byte requests cut a whole-file read into one read per 512-byte block (8 packed rows each here).
    with open_storage(tiny[0], backend, queue_depth=queue_depth, max_request_bytes=512) as s:
        ids = torch.arange(N)
        assert torch.equal(s.read(ids), tiny[1])
        assert s.stats().requests == -(-N * tiny[0].features.row_stride // 512)


@pytest.mark.parametrize("backend", ["io_uring", "pread"])
def test_buffered_reads_when_direct_is_off(tiny, backend):
    with open_storage(tiny[0], backend, direct=False) as s:
        assert not s.direct
        ids = torch.randint(0, N, (100,))
        assert torch.equal(s.read(ids), tiny[1][ids])


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs a tmpfs at /dev/shm")
@pytest.mark.parametrize("backend", ["io_uring", "pread"])
def test_reads_from_tmpfs(backend):
    # Older kernels refuse O_DIRECT on tmpfs (the reader then falls back to
    # buffered reads); newer ones accept it. Either way the rows are right.
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        dataset, features = write_tiny_dataset(os.path.join(d, "ds"), num_nodes=50, dim=4)
        with open_storage(dataset, backend) as s:
            assert np.array_equal(s.read(np.arange(50)).numpy(), features)


@pytest.mark.parametrize("dtype", ["float16", "int8", "uint8"])
@pytest.mark.parametrize("dim", [1, 128, 1500])
def test_dtypes_and_row_sizes(tmp_path, dtype, dim):
    rng = np.random.default_rng(dim)
    features = rng.integers(-100 if dtype != "uint8" else 0, 100, (70, dim)).astype(dtype)
    dataset, _ = write_tiny_dataset(tmp_path / "ds", num_nodes=70, dim=dim, dtype=dtype, features=features)
    for backend in HOST_BACKENDS:
        with open_storage(dataset, backend) as s:
            ids = rng.integers(0, 70, 200)
            assert np.array_equal(s.read(ids).numpy(), features[ids]), backend


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.integers(0, N - 1), max_size=400), backend=st.sampled_from(HOST_BACKENDS),
       request_rows=st.sampled_from([1, 2, 7, 256]))
def test_property_any_batch_any_backend(tiny, ids, backend, request_rows):
    options = {} if backend == "memory" else {"max_request_bytes": request_rows * 512, "queue_depth": 4}
    with open_storage(tiny[0], backend, **options) as s:
        assert torch.equal(s.read(torch.tensor(ids, dtype=torch.int64)), tiny[1][torch.tensor(ids, dtype=torch.int64)])


def test_unknown_backend_lists_the_valid_ones(tiny):
    with pytest.raises(ValueError, match="io_uring"):
        open_storage(tiny[0], "spdk")
    assert set(HOST_BACKENDS) <= set(BACKENDS)


def test_memory_backend_refuses_native_options(tiny):
    with pytest.raises(TypeError, match="queue_depth"):
        open_storage(tiny[0], "memory", queue_depth=4)


def test_bad_queue_depth(tiny):
    with pytest.raises(ValueError, match="queue_depth"):
        open_storage(tiny[0], "io_uring", queue_depth=0)


def test_closed_storage_refuses_reads(tiny):
    s = open_storage(tiny[0], "pread")
    s.close()
    with pytest.raises(RuntimeError, match="closed"):
        s.read([1])


def test_open_by_path_and_auto_backend(tiny):
    with open_storage(tiny[0].path) as s:
        assert s.backend in ("io_uring", "pread")
        assert torch.equal(s.read([3, 1]), tiny[1][[3, 1]])


def test_missing_feature_file_raises_file_not_found(tmp_path):
    dataset, _ = write_tiny_dataset(tmp_path / "ds", num_nodes=20, dim=4)
    os.remove(dataset.feature_path)
    with pytest.raises(FileNotFoundError, match="features.bin"):
        open_storage(dataset, "io_uring")


def test_truncated_file_is_caught_before_any_read(tmp_path):
    dataset, _ = write_tiny_dataset(tmp_path / "ds", num_nodes=20, dim=4)
    os.truncate(dataset.feature_path, dataset.features.row_stride * 10)
    for backend in ("io_uring", "pread", "mmap"):
        with pytest.raises(RuntimeError, match="truncated"):
            open_storage(dataset, backend)
    with pytest.raises(Exception, match="truncated"):
        open_dataset(dataset.path)


def test_gds_backend_needs_a_gpu(tiny):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the gds path is exercised by the GPU tests")
    with pytest.raises(RuntimeError, match="gds"):
        open_storage(tiny[0], "gds")


def test_gds_backend_logic_with_a_fake_kvikio(tiny, monkeypatch):
    dataset, features = tiny
    fake_kvikio.install(monkeypatch)
    stride = dataset.features.row_stride
    assert stride == 64  # 52-byte rows, 8 per 512-byte block
    ids = torch.tensor([5, 6, 7, 8, 9, 0, N - 1, 6, 5, 40, 41])
    for max_request, reads in [
            # Rows 0..9 lie in blocks 0 and 1, read together; 40 and 41 share block 5; N-1 is alone in its block.
            (128 << 10, [(0, 1024), (2560, 512), ((N - 1) * stride // 512 * 512, 512)]),
            # Requests shorter than a block: one block per read, never a block twice.
            (3 * stride, [(0, 512), (512, 512), (2560, 512), ((N - 1) * stride // 512 * 512, 512)])]:
        with open_storage(dataset, "gds", device="cpu", max_request_bytes=max_request) as storage:
            fake_kvikio.CuFile.requests.clear()
            assert torch.equal(storage.read(ids), features[ids])
            assert sorted(fake_kvikio.CuFile.requests) == reads
            assert storage.stats().bytes_read == sum(n for _, n in reads)
    with open_storage(dataset, "gds", device="cpu") as storage:
        with pytest.raises(IndexError, match="node id"):
            storage.read(torch.tensor([N]))


@pytest.mark.parametrize("dtype,dim,row_alignment", [("float16", 128, None), ("int8", 3, None), ("uint8", 1028, None),
                                                     ("float32", 13, 512), ("uint8", 1028, 4096)])
def test_gds_backend_places_every_row_with_a_fake_kvikio(tmp_path, monkeypatch, dtype, dim, row_alignment):
    # Packed and unpacked layouts, rows over a block at strides of 1536 and 4096: the staging arithmetic.
    fake_kvikio.install(monkeypatch)
    dataset, features = write_tiny_dataset(tmp_path / "ds", num_nodes=300, dim=dim, dtype=dtype,
                                           row_alignment=row_alignment)
    rng = np.random.default_rng(dim)
    for max_request in (512, 2048, 128 << 10):
        with open_storage(dataset, "gds", device="cpu", max_request_bytes=max_request) as storage:
            for ids in (rng.integers(0, 300, 200), np.arange(300)[::-1].copy(), np.array([299, 0, 299])):
                fake_kvikio.CuFile.requests.clear()
                assert np.array_equal(storage.read(ids).numpy(), features[ids])
                blocks = [b for offset, size in fake_kvikio.CuFile.requests for b in range(offset // 512, (offset + size) // 512)]
                assert len(blocks) == len(set(blocks))  # no block read twice


def test_io_uring_reports_whether_buffers_are_registered(tiny):
    with open_storage(tiny[0], "io_uring", queue_depth=2, max_request_bytes=4096) as s:
        # 2 slots of a few KiB fit any locked-memory limit, so registration succeeds.
        assert s.registered_buffers


def test_a_dataset_of_several_node_types_is_refused_naming_the_one_to_open(tmp_path):
    # its num_nodes counts every type while its feature file is the target's: rows would be read past the end
    from lsm_gnn.data.synthetic_hetero import generate_hetero_synthetic

    ds = generate_hetero_synthetic(str(tmp_path / "h"), num_papers=200, feature_dim=8, progress=False)
    with pytest.raises(ValueError, match=r"a feature file per node type \(paper, author, institute, fos\); open "
                                         r"one type's: open_storage\(dataset.node_type\('paper'\)\)"):
        open_storage(ds, "pread")
    with open_storage(ds.node_type("author"), "pread") as storage:
        assert torch.equal(storage.read(np.arange(5)),
                           torch.from_numpy(ds.node_type("author").read_features_direct(np.arange(5))))
