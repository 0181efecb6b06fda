"""The farthest policy evicts in Belady's order as far as the window shows: no reuse, then the
farthest known reuse, with lines without information ranked as if reused at the threshold. Hit and
installed lines read their next use from the window at once, and a miss needed after its victim is
served without being cached (Belady's bypass)."""
import pytest
import torch

from lsm_gnn.cache import PolicyConfig, ReferenceCache, SoftwareCache, replay
from lsm_gnn.kernels.layout import INVALID_TAG, NO_REUSE

N = 600  # nodes of the tiny_cache fixture (conftest.py)


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


def make_cache(kind, storage, ways, config):
    """The reference model or the native cache, one set of ``ways`` ways."""
    if kind == "reference":
        return ReferenceCache(storage, num_sets=1, ways=ways, policy=config)
    return SoftwareCache(storage, num_sets=1, ways=ways, policy=config)


def lines_by_tag(cache) -> dict[int, tuple[int, bool, int]]:
    """tag -> (reuse counted from the last scan, fresh, index in the batch of that reuse) of valid lines."""
    snap = cache.snapshot()
    return {int(tag): (int(reuse), bool(fresh), int(index))
            for tag, reuse, fresh, index in zip(snap["tags"], snap["reuse"], snap["fresh"], snap["pvp_index"])
            if tag != INVALID_TAG}


@pytest.mark.parametrize("kind", ["reference", "native"])
def test_hit_and_installed_lines_take_their_next_use_between_scans(tiny_cache, kind):
    storage, features, _ = tiny_cache
    trace = [[1, 2], [1, 3], [2], [3], [5, 1], [7]]
    cache = make_cache(kind, storage, 4, PolicyConfig("farthest", window=8, period=4))  # scans at iteration 0 only
    for t, (current, future) in enumerate(replay(trace, 8, num_nodes=N)):
        rows, _ = cache.lookup(current, future)
        assert torch.equal(rows, features[current])
        if t == 1:
            break
    # Iteration 1, one past the scan: 1 (hit) is next used at 4, position 1, and 3 (installed) at 3: reuse
    # counts from the scan (iteration 0), so 4 and 3. Neither is fresh. 2 keeps its install-time record.
    assert lines_by_tag(cache) == {1: (4, False, 1), 2: (2, False, 0), 3: (3, False, 0)}


@pytest.mark.parametrize("kind", ["reference", "native"])
def test_the_paper_policy_still_marks_lines_fresh_until_the_next_scan(tiny_cache, kind):
    storage, _, _ = tiny_cache
    cache = make_cache(kind, storage, 4, PolicyConfig("hybrid", window=8, period=4))
    assert not cache.policy.assign_next_use and not cache.policy.bypass
    for t, (current, future) in enumerate(replay([[1, 2], [1, 3], [2], [3]], 8, num_nodes=N)):
        cache.lookup(current, future)
        if t == 1:
            break
    assert lines_by_tag(cache) == {1: (NO_REUSE, True, 0), 2: (NO_REUSE, True, 0), 3: (NO_REUSE, True, 0)}


BYPASS_TRACE = [[1, 2], [3], [1], [2], [1, 2], [3]]


@pytest.mark.parametrize("kind", ["reference", "native"])
@pytest.mark.parametrize("bypass,hits,bypassed", [(True, 4, 1), (False, 3, 0)])
def test_a_miss_needed_after_everything_cached_is_served_but_not_cached(tiny_cache, kind, bypass, hits, bypassed):
    """Two ways hold 1 and 2; 3 misses at iteration 1 and is next needed at 5, after both. Belady's MIN does
    not cache it: 1 and 2 then hit at 2, 3 and 4 (4 hits). Installing it evicts 2, which misses at 3 (3 hits)."""
    storage, features, _ = tiny_cache
    config = PolicyConfig("farthest", window=8, period=4, bypass=bypass)
    cache = make_cache(kind, storage, 2, config)
    for t, (current, future) in enumerate(replay(BYPASS_TRACE, 8, num_nodes=N)):
        rows, hit = cache.lookup(current, future)
        assert torch.equal(rows, features[current]), f"iteration {t}"
        if t == 1:
            assert sorted(lines_by_tag(cache)) == ([1, 2] if bypass else [1, 3])
    assert (cache.stats.hits, cache.stats.bypassed) == (hits, bypassed)


def test_bypass_needs_the_next_use_at_assign_and_a_window_policy():
    assert PolicyConfig("farthest").assign_next_use and PolicyConfig("farthest").bypass
    assert not PolicyConfig("farthest", assign_next_use=False).bypass
    with pytest.raises(ValueError, match="needs assign_next_use"):
        PolicyConfig("hybrid", bypass=True)
    with pytest.raises(ValueError, match="window policy"):
        PolicyConfig("lru", assign_next_use=True)
