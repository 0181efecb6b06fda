"""The software cache and the reference model compared stage by stage (:mod:`lsm_gnn.cache.plan`): after each
named stage of a lookup, what both have decided so far agrees, on random and adversarial batches, with and
without the victim buffer, over a storage the cache writes back to."""
import numpy as np
import pytest
import torch

from lsm_gnn import testing
from lsm_gnn.cache import PolicyConfig, ReferenceCache, SoftwareCache, WindowBuffer, replay
from lsm_gnn.cache.geometry import set_of
from lsm_gnn.cache.plan import STAGES
from lsm_gnn.kernels.layout import INVALID_TAG

N = 600  # nodes of the tiny_cache fixture (conftest.py)
NUM_SETS, WAYS, WINDOW = 4, 8, 4
MODES = {"no pvp": {}, "reinstall": {"pvp_reinstall": True}, "paper": {"pvp_reinstall": False}}


def staged(cache, ids, future):
    """One lookup of ``cache`` run stage by stage, as ``lookup`` runs them (without its lock and streams):
    yields the plan after each stage, and ``(rows, hit mask)`` after the last."""
    plan = cache._begin(ids, future)
    yield plan
    for stage in STAGES[1:-1]:
        getattr(cache, f"_{stage}")(plan)
        yield plan
    yield cache._account(plan)


def check_begin(nat, ref, ctx):
    assert np.array_equal(nat.unique.numpy(), ref.unique) and np.array_equal(nat.inverse.numpy(), ref.inverse)


def check_before_assign(nat, ref, ctx):
    assert np.array_equal(nat.cache_ids.numpy(), ref.unique[ref.cache_u]), "the cache sees other ids"


def check_assign(nat, ref, ctx):
    cache_ids = nat.cache_ids.tolist()
    got = dict(zip(cache_ids, zip(nat.hit.tolist(), nat.line.tolist())))
    want = {int(ref.unique[u]): (bool(ref.hit[u]), int(ref.where[u])) for u in ref.cache_u}
    assert got == want, "hits or lines differ"
    a, b = ctx["ref"].snapshot(), ctx["nat"].snapshot()
    for key in a:
        assert np.array_equal(a[key], b[key]), f"line metadata {key} differs"


def check_evict(nat, ref, ctx):
    cache, model = ctx["nat"], ctx["ref"]
    done = nat.done
    victims = done.evicted_line[done.evicted_tag != INVALID_TAG]
    assert not bool(cache.dirty[victims].any()), "a dirty victim was not written back before its line is refilled"
    if cache.pvp is not None:  # the queue of t is the model's until account, the buffer's prefetch already
        queued = {T: lines for T, lines in model.pvp_snapshot().items() if T != nat.t}
        assert queued == cache.pvp.snapshot(), "the victim queues differ"
        for counter in ("enqueued", "dropped_no_reuse", "dropped_full"):
            assert getattr(model.pvp_stats, counter) == getattr(cache.pvp.stats, counter), counter


def check_after_assign(nat, ref, ctx):
    from_pvp = np.zeros(ref.unique.size, bool) if nat.from_pvp is None else nat.from_pvp.numpy()
    assert np.array_equal(from_pvp, ref.from_pvp), "other ids are served from the victim buffer"
    assert np.array_equal(nat.hit.numpy(), ref.hit) and np.array_equal(nat.line.numpy(), ref.where)


def check_fill(nat, ref, ctx):
    expected = ctx["features"][torch.from_numpy(ref.ids)]
    assert torch.equal(ref.rows, expected)
    assert torch.equal(nat.rows, expected), "rows differ from the bytes on disk"
    assert np.array_equal(nat.miss.numpy(), ref.miss), "other ids were read from storage"
    for cache in (ctx["nat"], ctx["ref"]):  # every line holds its node's stored row
        tags = torch.as_tensor(cache.snapshot()["tags"])
        valid = torch.nonzero(tags != INVALID_TAG).reshape(-1)
        assert torch.equal(cache.data[valid], ctx["features"][tags[valid]]), f"{type(cache).__name__}: a stale line"


def check_account(nat, ref, ctx):
    (rows_nat, hit_nat), (rows_ref, hit_ref) = nat, ref
    assert torch.equal(rows_nat, rows_ref) and torch.equal(hit_nat, hit_ref)
    assert ctx["nat"].stats.as_dict() == {**ctx["ref"].stats.as_dict(), "written_back": ctx["nat"].stats.written_back,
                                          "bytes_written": ctx["nat"].stats.bytes_written}
    if ctx["nat"].pvp is not None:
        assert ctx["nat"].pvp.stats == ctx["ref"].pvp_stats


CHECKS = {"begin": check_begin, "before_assign": check_before_assign, "assign": check_assign,
          "evict": check_evict, "after_assign": check_after_assign, "fill": check_fill, "account": check_account}


def run_staged(tiny_cache, batches, mode, policy="farthest", oversubscribe=False, futures=None, capacity=6):
    """Both caches over ``batches`` (future: the next ones, or ``futures(k)``), compared after every stage;
    between lookups a few cached rows are updated to their own bytes, so lines turn dirty and are written back."""
    storage, features, static = tiny_cache
    config = PolicyConfig(policy, window=WINDOW, period=2)
    pvp = {} if mode == "no pvp" else {"pvp": True, "pvp_queue_capacity": capacity, **MODES[mode]}
    nat = SoftwareCache(storage, num_sets=NUM_SETS, ways=WAYS, policy=config, static_scores=static,
                        oversubscribe=oversubscribe, **pvp)
    ref = ReferenceCache(storage, NUM_SETS, WAYS, config, static_scores=static, oversubscribe=oversubscribe,
                         pvp_queue_capacity=capacity if pvp else None, pvp_reinstall=MODES[mode].get("pvp_reinstall", False))
    ctx = {"nat": nat, "ref": ref, "features": features}
    rng = np.random.default_rng(len(batches))
    for k, (current, future) in enumerate(replay(batches, WINDOW, num_nodes=N)):
        future = futures(k) if futures is not None else future
        for stage, a, b in zip(STAGES, staged(nat, current, future), staged(ref, current, future)):
            try:
                CHECKS[stage](a, b, ctx)
            except AssertionError as error:
                raise AssertionError(f"iteration {k}, after {stage}: {error}") from None
        lines = nat.lines_of(current)
        cached = current[lines >= 0]
        changed = cached[torch.from_numpy(rng.random(cached.numel()) < 0.3)].unique()
        nat.update(changed, torch.zeros(changed.numel(), 0), lambda rows, _: rows)
    return nat


def power_law(seed, iterations=24, batch=24):
    return [torch.as_tensor(b) for b in testing.power_law_trace(seed, iterations, batch, N, 0.9)]


def one_set(num, seed, set_index=0):
    """``num`` random ids that all live in set ``set_index``."""
    pool = np.flatnonzero(set_of(np.arange(N), NUM_SETS) == set_index)
    return np.random.default_rng(seed).choice(pool, num, replace=False)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("policy", ["farthest", "hybrid_pvp", "lru", "rr"])
def test_random_batches_agree_stage_by_stage(tiny_cache, mode, policy):
    nat = run_staged(tiny_cache, power_law(7), mode, policy)
    s = nat.stats
    assert s.evictions > 0 and s.hits > 0 and s.written_back > 0  # the trace reaches every stage's work
    if nat.pvp is not None:
        assert nat.pvp.stats.hits > 0


@pytest.mark.parametrize("mode", list(MODES))
def test_repeated_ids_and_full_sets_agree(tiny_cache, mode):
    """Every id many times over; then batches that fill one set exactly, or overflow it (oversubscribed)."""
    rng = np.random.default_rng(3)
    batches = [torch.as_tensor(rng.choice(one_set(5, k), 40)) for k in range(6)]
    batches += [torch.as_tensor(np.repeat(one_set(WAYS, k, k % NUM_SETS), 3)) for k in range(8)]
    batches += [torch.as_tensor(rng.permutation(one_set(WAYS + 5, k))) for k in range(8)]
    nat = run_staged(tiny_cache, batches, mode, oversubscribe=True)
    assert nat.stats.evicted_in_use > 0


@pytest.mark.parametrize("mode", list(MODES))
def test_batches_larger_than_the_cache_agree(tiny_cache, mode):
    rng = np.random.default_rng(5)
    batches = [torch.as_tensor(rng.choice(N, NUM_SETS * WAYS + 20, replace=False)) for _ in range(10)]
    batches = [b for pair in zip(batches, power_law(5, 10, 16)) for b in pair]  # and small ones between
    nat = run_staged(tiny_cache, batches, mode, oversubscribe=True)
    assert nat.stats.evicted_in_use > 0 and nat.stats.evictions > 0


@pytest.mark.parametrize("mode", ["reinstall", "paper"])
def test_an_inexact_window_agrees(tiny_cache, mode):
    """Futures whose batches are shuffled: a parked line's stored index holds another id, and goes unused."""
    batches = power_law(11, 20, 24)
    rng = np.random.default_rng(0)
    shuffled = [b[torch.from_numpy(rng.permutation(b.numel()))] for b in batches]
    nat = run_staged(tiny_cache, batches, mode, futures=lambda k: shuffled[k + 1:k + 1 + WINDOW])
    assert nat.pvp.stats.unused > 0


def test_lookup_runs_the_stages_in_order(tiny_cache, monkeypatch):
    """``lookup`` is the stages the comparisons above drive one by one, in the order of STAGES, for both."""
    storage, _, _ = tiny_cache
    for cache in (SoftwareCache(storage, num_sets=NUM_SETS, ways=WAYS, pvp=True, pvp_queue_capacity=4),
                  ReferenceCache(storage, NUM_SETS, WAYS, "farthest")):
        calls = []
        for stage in STAGES:
            original = getattr(cache, f"_{stage}")
            monkeypatch.setattr(cache, f"_{stage}", lambda *a, _s=stage, _f=original, **k: calls.append(_s) or _f(*a, **k))
        future = WindowBuffer(WINDOW, N)
        future.push(torch.arange(5))
        cache.lookup(torch.arange(10), future)
        assert calls == list(STAGES), type(cache).__name__
