"""The farthest policy evicts in Belady's order as far as the window shows: no reuse, then the
farthest known reuse, with lines without information ranked as if reused at the threshold."""
from lsm_gnn.cache import PolicyConfig, ReferenceCache
from lsm_gnn.cache.layout import NO_REUSE


def test_victims_follow_known_reuse_with_fresh_at_the_threshold(tiny_cache):
    storage, _, _ = tiny_cache
    config = PolicyConfig("farthest", window=16, period=4)
    assert config.near_threshold == 4  # window // 4; the paper's hybrid keeps window // 8
    assert PolicyConfig("hybrid", window=16).near_threshold == 2
    cache = ReferenceCache(storage, num_sets=1, ways=5, policy=config)
    L = cache.lines
    cache.iteration, cache.scan_base = 10, 8
    L.tags[:] = [10, 11, 12, 13, 14]
    L.last_use[:] = -1
    L.static[:] = [0, 9, 0, 0, 0]  # static scores only break ties: the lowest must not decide here
    distances = [1, None, 9, 6, 3]  # None: fresh; reuse = d + iteration - scan_base
    for way, d in enumerate(distances):
        L.fresh[way] = d is None
        L.reuse[way] = 0 if d is None else d + 2
    order = []
    for _ in range(4):
        way = cache.choose_victim(0)
        order.append(way)
        L.last_use[way] = cache.iteration  # in use: evicted only when nothing else is left
    assert order == [2, 3, 1, 4]  # far 9, far 6, fresh (as if 4 ahead), near 3; near 1 stays

    L.last_use[:] = -1
    L.reuse[0] = NO_REUSE  # no reuse in the window goes first, before any known reuse
    assert cache.choose_victim(0) == 0
