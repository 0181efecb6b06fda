"""Fixtures shared by several test modules."""
import pytest
import torch

from lsm_gnn.testing import tiny_cache_setup, write_tiny_dataset

TINY_CACHE_NODES = 600


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
    """(memory storage, features, quantized degree scores) of a 600-node dataset, for cache tests."""
    return tiny_cache_setup(tmp_path_factory.mktemp("cache") / "ds", num_nodes=TINY_CACHE_NODES)


@pytest.fixture(scope="module")
def loader_graph(tmp_path_factory):
    """(dataset, features) of a 2000-node graph, for loader tests."""
    dataset, features = write_tiny_dataset(tmp_path_factory.mktemp("loader") / "ds", num_nodes=2000, dim=8,
                                           avg_degree=5)
    return dataset, torch.from_numpy(features)
