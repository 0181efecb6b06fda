"""Every feature source implements the one Features interface, and readers need nothing else."""
import numpy as np
import pytest
import torch

from lsm_gnn import Features, open_storage
from lsm_gnn.cache import SoftwareCache
from lsm_gnn.features import BASE_COUNTERS, PVP_COUNTERS
from lsm_gnn.loader import NodeLoader


def sources(dataset):
    storage = open_storage(dataset, "io_uring")
    return {
        "storage": storage,
        "memory": open_storage(dataset, "memory"),
        "cache": SoftwareCache(open_storage(dataset, "pread"), num_sets=16, ways=32, window=4),
        "cache+pvp": SoftwareCache(open_storage(dataset, "pread"), num_sets=4, ways=32, window=4, pvp=True,
                                   pvp_queue_capacity=32, oversubscribe=True),
    }


@pytest.mark.parametrize("name", ["storage", "memory", "cache", "cache+pvp"])
def test_each_source_gathers_the_file_bytes_and_counts_alike(loader_graph, name):
    dataset, features = loader_graph
    source = sources(dataset)[name]
    assert isinstance(source, Features)
    assert (source.num_rows, source.dim, source.dtype) == (dataset.num_nodes, dataset.feature_dim, torch.float32)
    assert source.row_bytes == dataset.feature_dim * 4
    rng = np.random.default_rng(0)
    for _ in range(3):
        ids = torch.from_numpy(rng.choice(dataset.num_nodes, 300, replace=False))
        before = source.counters()
        rows, hit = source.gather(ids)
        after = source.counters()
        assert torch.equal(rows, features[ids]) and hit.dtype == torch.bool and hit.shape == (300,)
        # Storage is asked for exactly the rows not served without it (RAM reads no file: nothing to count).
        misses = 0 if name == "memory" else int((~hit).sum())
        assert after["bytes_useful"] - before["bytes_useful"] == misses * source.row_bytes
        source.prefetch()
    source.settle()
    expected = set(BASE_COUNTERS) | (set(PVP_COUNTERS) if name == "cache+pvp" else set())
    assert set(source.counters()) == expected
    assert source.caches == name.startswith("cache")
    few = torch.arange(40)
    source.gather(few)
    _, again = source.gather(few)
    assert bool(again.all()) == source.caches  # a cache serves a repeat from its lines; storage never "hits"
    assert source.describe().endswith(("storage, no cache", "over io_uring storage", "over pread storage"))
    if source.caches:
        assert f"{source.policy.name} cache (" in source.describe()


def test_the_loader_refuses_what_is_not_a_features_source(loader_graph):
    dataset, features = loader_graph
    with pytest.raises(TypeError, match="lsm_gnn.features.Features"):
        NodeLoader(dataset, torch.from_numpy(np.asarray(features)), [2], 32)
