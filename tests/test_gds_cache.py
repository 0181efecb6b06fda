"""A cache over ``storage.kind=gds``: its misses take the path that the storage's read device implies, and it
returns exactly the bytes on disk, as the reference model does. On CPU the gds backend runs over a stand-in for
KvikIO (tests/fake_kvikio.py) reading to the CPU, under a CPU cache (a cache posed as a device one, as
tests/host_budget.py does, runs the Triton kernels under the interpreter: minutes here); the last test runs the real KvikIO on a GPU, which benchmarks/gpu_suite.sh
does in KvikIO's compatibility mode, and is skipped elsewhere."""
import numpy as np
import pytest
import torch

import fake_kvikio
from lsm_gnn import open_storage
from cache_oracle import check_against_reference, id_batches
from lsm_gnn.cache import PolicyConfig, SoftwareCache
from lsm_gnn.cache.staging import miss_path
from lsm_gnn.testing import write_tiny_dataset

N, SETS, WAYS = 200, 8, 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    dataset, features = write_tiny_dataset(tmp_path_factory.mktemp("gds") / "ds", num_nodes=N, dim=13)
    return dataset, torch.from_numpy(np.asarray(features))


@pytest.mark.parametrize("read_device,cache_device,path", [
    ("cpu", "cpu", "direct"), ("cuda:0", "cuda:0", "direct"),  # a file into a CPU cache; gds into a GPU cache
    ("cpu", "cuda:0", "staged"),  # a file into a GPU cache: through pinned host memory
    ("cuda:0", "cpu", "copied"), ("cuda:1", "cuda:0", "copied")])  # gds on a GPU the cache is not on
def test_the_miss_path_follows_where_the_storage_reads_to(read_device, cache_device, path):
    assert miss_path(torch.device(read_device), torch.device(cache_device)) == path


def test_a_cache_over_gds_returns_the_bytes_on_disk(tiny, monkeypatch):
    dataset, features = tiny
    fake_kvikio.install(monkeypatch)
    config = PolicyConfig("hybrid", window=2, period=1)
    with open_storage(dataset, "gds", device="cpu", max_request_bytes=512) as storage, \
            open_storage(dataset, "memory") as reference_storage:
        reads_into = []
        read_into = storage.read_into
        monkeypatch.setattr(storage, "read_into", lambda ids, out, slots: (reads_into.append(ids.numel()),
                                                                          read_into(ids, out, slots)))
        cache = SoftwareCache(storage, num_sets=SETS, ways=WAYS, policy=config, read_ahead=0)
        # The storage reads to the cache's device: misses go straight into their lines, no staging buffer.
        assert cache.miss_path == "direct"
        reference = check_against_reference(cache, reference_storage, features, config, id_batches(seed=0))
        # Every miss was read once by the gds storage, straight into the lines where the batch kept them all (a
        # batch that evicts lines it uses reads its misses into a tensor on the same device instead).
        assert storage.stats().rows == cache.stats.misses == reference.stats.misses > 0
        assert 0 < sum(reads_into) < cache.stats.misses


class ReadsElsewhere:
    """A storage whose reads land on another device than the cache's (``meta`` posing as a GPU): its rows come
    back as CPU tensors, but it refuses to read into the cache's lines, as gds on a GPU refuses a CPU ``out``."""

    writable, device = False, torch.device("meta")

    def __init__(self, storage):
        self._inner = storage
        self.num_rows, self.dim, self.dtype = storage.num_rows, storage.dim, storage.dtype
        self.row_bytes, self.backend = storage.row_bytes, storage.backend

    def read(self, ids):
        return self._inner.read(ids)

    def read_into(self, ids, out, slots):
        raise AssertionError(f"read_into an out on {out.device}: this storage reads to {self.device}")


def test_a_cache_over_a_storage_on_another_device_reads_then_moves(tiny):
    dataset, features = tiny
    with open_storage(dataset, "memory") as storage:
        cache = SoftwareCache(ReadsElsewhere(storage), num_sets=SETS, ways=WAYS, read_ahead=0)
        assert cache.miss_path == "copied"
        for t, ids in enumerate(id_batches(seed=2)):
            rows, _ = cache.lookup(ids)
            assert torch.equal(rows, features[ids]), f"batch {t}: not the bytes on disk"


def test_a_gds_storage_refuses_an_out_on_another_device(tiny, monkeypatch):
    fake_kvikio.install(monkeypatch)
    with open_storage(tiny[0], "gds", device="meta") as storage:
        assert storage.device == torch.device("meta")
        ids = torch.tensor([3, 1])
        with pytest.raises(ValueError, match="on meta, got .* on cpu"):
            storage.read_into(ids, torch.empty((4, 13)), torch.tensor([0, 2]))
        with pytest.raises(ValueError, match="on meta, got .* on cpu"):
            storage.read(ids, out=torch.empty((2, 13)))


def test_node_types_sharing_one_cache_read_where_their_gds_storages_read(tiny, monkeypatch):
    """Types of one row format share a cache over their storages one after another: that whole reads where its
    parts do (a GPU cache over gds parts then reads its misses straight in, not through host memory)."""
    from lsm_gnn.storage.concat import ConcatStorage

    fake_kvikio.install(monkeypatch)
    with open_storage(tiny[0], "gds", device="meta") as a, open_storage(tiny[0], "gds", device="meta") as b, \
            open_storage(tiny[0], "memory") as host:
        assert ConcatStorage([a, b], ["paper", "author"]).device == torch.device("meta")
        assert ConcatStorage([host], ["paper"]).device == torch.device("cpu")
        with pytest.raises(ValueError, match="paper, author read to different devices"):
            ConcatStorage([a, host], ["paper", "author"])


def test_a_gpu_cache_over_gds_with_the_real_kvikio(tiny):
    """On a GPU with KvikIO (benchmarks/gpu_suite.sh sets KVIKIO_COMPAT_MODE=ON: POSIX reads, no GDS driver)."""
    pytest.importorskip("kvikio")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    dataset, features = tiny
    with open_storage(dataset, "gds", device="cuda") as storage:
        cache = SoftwareCache(storage, num_sets=SETS, ways=WAYS, device="cuda", read_ahead=0)
        assert storage.device == cache.device and cache.miss_path == "direct"
        for t, ids in enumerate(id_batches(seed=1)):
            rows, _ = cache.lookup(ids)
            assert torch.equal(rows.cpu(), features[ids]), f"batch {t}: not the bytes on disk"
        assert cache.stats.misses > 0 and storage.stats().bytes_read > 0
