"""A cache never allocates more lines than its dataset has rows (rounded up to whole sets)."""
import pytest
import torch

from lsm_gnn.cache import SoftwareCache, cache_geometry
from lsm_gnn.testing import tiny_cache_setup

NODES = 600  # the tiny_cache fixture's


class TestCapacityClamp:
    @pytest.mark.parametrize("rows", [None, NODES * 10, NODES])
    def test_a_cache_of_the_whole_file_or_more_holds_num_nodes_rounded_to_sets(self, tiny_cache, rows):
        storage = tiny_cache[0]
        cache = SoftwareCache(storage, capacity="1T" if rows is None else rows * storage.row_bytes)
        assert (cache.num_sets, cache.ways, cache.num_lines) == (19, 32, 608)  # ceil(600 / 32) sets
        assert cache.capacity_bytes == 608 * storage.row_bytes
        assert cache.data.shape[0] == cache.tags.shape[0] == 608  # what is allocated, not the request

    def test_a_cache_smaller_than_the_file_is_as_asked(self, tiny_cache):
        storage = tiny_cache[0]
        assert SoftwareCache(storage, capacity=(NODES - 7) * storage.row_bytes).num_lines == (NODES - 7) // 32 * 32

    def test_the_rounding_follows_the_ways(self, tiny_cache):
        storage = tiny_cache[0]
        assert SoftwareCache(storage, capacity="1G", ways=8).num_lines == NODES
        assert SoftwareCache(storage, capacity="1G", ways=7).num_lines == 86 * 7

    def test_a_dataset_smaller_than_one_set_gets_one_set(self, tmp_path):
        storage = tiny_cache_setup(tmp_path / "ds", num_nodes=10)[0]
        assert SoftwareCache(storage, capacity="1G").num_lines == 32
        assert SoftwareCache(storage, capacity=10 * storage.row_bytes).num_lines == 32  # covers every row
        with pytest.raises(ValueError, match="fewer than one set"):
            SoftwareCache(storage, capacity=9 * storage.row_bytes)

    def test_geometry_without_a_row_count_and_explicit_sets_are_not_clamped(self, tiny_cache):
        storage = tiny_cache[0]
        assert cache_geometry("1M", 64, 32) == ((1 << 20) // 64 // 32, 32)
        assert cache_geometry("1M", 64, 32, num_rows=NODES) == (19, 32)
        assert SoftwareCache(storage, num_sets=100, ways=32).num_lines == 3200

    def test_a_clamped_cache_serves_every_row_exactly(self, tiny_cache):
        storage, features, _ = tiny_cache
        cache = SoftwareCache(storage, capacity="1G", policy="rr")
        ids = torch.randperm(NODES)
        for start in range(0, NODES, 150):
            rows, _ = cache.lookup(ids[start:start + 150])
            assert torch.equal(rows, features[ids[start:start + 150]])
        rows, hits = cache.lookup(ids[:150])
        assert torch.equal(rows, features[ids[:150]]) and hits.float().mean() > 0.5  # hashed sets: not all
