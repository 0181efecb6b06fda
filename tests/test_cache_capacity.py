"""A cache larger than its file holds every row, yet allocates no more lines than that needs."""
import numpy as np
import pytest
import torch

from lsm_gnn.cache import SoftwareCache, cache_geometry
from lsm_gnn.cache.geometry import set_of
from lsm_gnn.testing import tiny_cache_setup

NODES = 600  # the tiny_cache fixture's


def every_row_has_a_way(num_rows, num_sets, ways) -> bool:
    return np.bincount(set_of(np.arange(num_rows), num_sets), minlength=num_sets).max() <= ways


class TestCapacityClamp:
    @pytest.mark.parametrize("request_rows", [None, NODES * 10])
    def test_a_cache_far_larger_than_the_file_is_cut_to_what_holds_every_row(self, tiny_cache, request_rows):
        storage = tiny_cache[0]
        cache = SoftwareCache(storage, capacity="1T" if request_rows is None else request_rows * storage.row_bytes)
        assert every_row_has_a_way(NODES, cache.num_sets, cache.ways)
        assert cache.num_lines < 2 * NODES  # not the terabyte asked for
        assert cache.data.shape[0] == cache.state.tags.shape[0] == cache.num_lines  # what is allocated
        assert cache.capacity_bytes == cache.num_lines * storage.row_bytes

    def test_a_capacity_just_above_the_file_is_kept_as_asked(self, tiny_cache):
        storage = tiny_cache[0]
        cache = SoftwareCache(storage, capacity=NODES * storage.row_bytes)
        assert NODES - 32 < cache.num_lines <= NODES  # never more than asked

    def test_a_cache_smaller_than_the_file_is_as_asked(self, tiny_cache):
        storage = tiny_cache[0]
        assert SoftwareCache(storage, capacity=(NODES - 7) * storage.row_bytes).num_lines == (NODES - 7) // 32 * 32

    @pytest.mark.parametrize("ways", [1, 7, 8, 32])
    def test_the_cut_follows_the_ways(self, tiny_cache, ways):
        storage = tiny_cache[0]
        cache = SoftwareCache(storage, capacity="1G", ways=ways)
        assert cache.ways == ways and every_row_has_a_way(NODES, cache.num_sets, ways)

    def test_a_dataset_smaller_than_one_set_gets_one_set(self, tmp_path):
        storage = tiny_cache_setup(tmp_path / "ds", num_nodes=10)[0]
        assert SoftwareCache(storage, capacity="1G").num_lines == 32
        assert SoftwareCache(storage, capacity=10 * storage.row_bytes).num_lines == 32  # covers every row
        with pytest.raises(ValueError, match="fewer than one set"):
            SoftwareCache(storage, capacity=9 * storage.row_bytes)

    def test_geometry_without_a_row_count_and_explicit_sets_are_not_cut(self, tiny_cache):
        storage = tiny_cache[0]
        assert cache_geometry("1M", 64, 32) == ((1 << 20) // 64 // 32, 32)
        assert cache_geometry("1M", 64, 32, num_rows=NODES)[0] < 2 * NODES // 32
        assert SoftwareCache(storage, num_sets=100, ways=32).num_lines == 3200

    @pytest.mark.parametrize("policy", ["rr", "hybrid"])
    def test_a_cut_cache_serves_every_row_exactly_and_then_only_hits(self, tiny_cache, policy):
        storage, features, _ = tiny_cache
        cache = SoftwareCache(storage, capacity="1G", policy=policy)
        ids = torch.randperm(NODES)
        for start in range(0, NODES, 150):
            rows, _ = cache.lookup(ids[start:start + 150])
            assert torch.equal(rows, features[ids[start:start + 150]])
        for start in range(0, NODES, 150):
            rows, hits = cache.lookup(ids[start:start + 150])
            assert torch.equal(rows, features[ids[start:start + 150]]) and bool(hits.all())
