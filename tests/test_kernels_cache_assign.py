"""The Triton assign kernels decide exactly as the C++ core, run on CPU tensors by Triton's interpreter."""
import os

import numpy as np
import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are defined: before their import
pytest.importorskip("triton")

from lsm_gnn import _C, open_storage  # noqa: E402
from lsm_gnn.cache import SoftwareCache  # noqa: E402
from lsm_gnn.cache.policies import POLICIES, POLICY_CODE  # noqa: E402
from lsm_gnn.kernels.cache_assign import cache_assign  # noqa: E402
from lsm_gnn.kernels.layout import NO_ID  # noqa: E402
from lsm_gnn.testing import write_tiny_dataset  # noqa: E402

NODES = 400
OUTPUTS = ("line", "hit", "evicted_tag", "evicted_record", "evicted_line")
STATE = ("tags", "records", "flags", "static_score", "last_use", "rr_pointer")


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    dataset, _ = write_tiny_dataset(tmp_path_factory.mktemp("kernels") / "ds", num_nodes=NODES, dim=4)
    return open_storage(dataset, "memory")


def power_law_batches(rng, count, size):
    """Distinct ids per batch, skewed so that some nodes recur often (as sampled GNN batches do)."""
    weights = 1.0 / np.arange(1, NODES + 1) ** 0.8
    weights /= weights.sum()
    perm = rng.permutation(NODES)
    return [np.unique(perm[rng.choice(NODES, size, p=weights)]) for _ in range(count)]


def assert_same_assign(cache, ids, t, window=None):
    """Runs the C++ and the Triton assign on copies of ``cache``'s state with the arguments its lookup of
    iteration ``t`` uses (``window``: the window's first occurrences), and compares every output and every
    state tensor."""
    p = cache.policy
    room = cache.pvp.room() if cache.pvp is not None and p.name == "hybrid_pvp_room" else None
    *arrays, front = window if window is not None and p.assign_next_use else (None, None, None, 0)
    args = (torch.from_numpy(ids), cache.node_static, POLICY_CODE[p.name], t, cache.scan_base, p.near_threshold,
            list(p.level_rank), room, *arrays, front, p.window, p.bypass)
    native_state = cache.state.clone().tensors()
    native = _C.cache_assign(*native_state, cache.ways, *args, 1)
    misses = int((~native[1]).sum())
    # As a lookup calls it, and as one serving hits first does where some id missed: told so, over the distinct
    # ids padded with NO_ID to twice their number (the padding takes no line and counts as a hit).
    calls = [(args, {})]
    if misses:
        padded = torch.cat([args[0], torch.full((len(ids),), NO_ID)])
        calls.append(((padded, *args[1:]), dict(has_misses=True)))
    for call_args, kwargs in calls:
        triton_state = cache.state.clone().tensors()
        *entries, counts = cache_assign(*triton_state, cache.ways, *call_args, **kwargs)
        for name, a, b in zip(OUTPUTS, native[:5], entries):
            b = b[:len(ids)]
            assert torch.equal(a, b), f"iteration {t}: {name} differs at {torch.nonzero(a != b)[:5].tolist()}"
        assert counts.tolist() == [*native[5:], misses], f"iteration {t}: counts differ ({kwargs})"
        for name, a, b in zip(STATE, native_state, triton_state):
            assert torch.equal(a, b), f"iteration {t}: state {name} differs ({kwargs})"


GEOMETRIES = [
    (4, 32, 60, False),    # the paper's 32 ways, batches well inside the cache
    (2, 8, 50, True),      # oversubscribed: sets get more misses than ways, lines are taken twice
    (8, 4, 30, True),      # narrow sets, victim queues with little room
]
# The interpreter runs programs one by one (5-15 s a case): the quick run keeps two hard cases (the second with
# next uses at assign and bypassed misses); CI runs all, the others in its job beside the suite, and in the
# alternating program order the oversubscribed geometry of each policy (where sets take more misses than ways and
# lines twice).
QUICK = {("hybrid_pvp_room", 8), ("farthest", 8)}
CASES = [pytest.param(policy, *geometry,
                      marks=[*(() if (policy, geometry[1]) in QUICK else [pytest.mark.slow, pytest.mark.beside]),
                             *(() if geometry[1] == 8 else [pytest.mark.natural_order_only])])
         for policy in POLICIES for geometry in GEOMETRIES]


@pytest.mark.parametrize("policy,num_sets,ways,batch,pvp", CASES)
def test_triton_assign_equals_the_cpp_core(storage, policy, num_sets, ways, batch, pvp):
    rng = np.random.default_rng(num_sets * 31 + ways)
    scores = np.random.default_rng(1).random(NODES)
    cache = SoftwareCache(storage, num_sets=num_sets, ways=ways, policy=policy, window=6, period=2,
                          static_scores=scores, oversubscribe=True, pvp=pvp, pvp_queue_capacity=3)
    batches = power_law_batches(rng, 14, batch)
    for t, ids in enumerate(batches):
        future = [torch.from_numpy(b) for b in batches[t + 1:t + 7]]
        if (cache.policy.uses_window or pvp) and t % cache.policy.period == 0:
            cache.scan(future)  # what this iteration's lookup does first (a second scan changes nothing)
        assert_same_assign(cache, ids, t, cache._first_occurrence(future))
        cache.lookup(ids, future=future)  # the native cache moves on to the next iteration


def test_adversarial_batches(storage):
    """An empty batch, one id, every id of a set at once, and a batch of ids already all cached."""
    cache = SoftwareCache(storage, num_sets=2, ways=8, policy="hybrid", oversubscribe=True)
    same_set = np.flatnonzero(np.array([int(s) for s in _sets(np.arange(NODES), 2)]) == 0)[:20]
    for t, ids in enumerate([np.array([], np.int64), np.array([7]), same_set, same_set[:8], same_set[:8]]):
        assert_same_assign(cache, np.sort(ids).astype(np.int64), t)
        cache.lookup(torch.from_numpy(np.sort(ids).astype(np.int64)))


def _sets(ids, num_sets):
    from lsm_gnn.cache.geometry import set_of

    return set_of(ids, num_sets)


@pytest.mark.launches_no_kernel  # refused before any launch
def test_ways_must_be_a_power_of_two_for_the_kernels(storage):
    cache = SoftwareCache(storage, num_sets=2, ways=6, policy="hybrid")
    with pytest.raises(ValueError, match="power of two"):
        cache_assign(*cache.state.tensors(), 6, torch.arange(3), None, POLICY_CODE["hybrid"], 0, 0, 1, [0, 1, 2, 3])
