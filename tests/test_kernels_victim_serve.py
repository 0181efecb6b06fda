"""The PVP serve (pvp_match), scatter (pvp_scatter), reinstalling fill (pvp_fill) and install (pvp_install) kernels,
C++ (torch's CPU ops for the install) and Triton
(run by Triton's interpreter), compute exactly what their torch definitions in lsm_gnn.cache.pvp compute, on
random and adversarial batches."""
import os

import numpy as np
import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are defined: before their import
pytest.importorskip("triton")

from lsm_gnn.cache import SoftwareCache, pvp  # noqa: E402
from lsm_gnn.kernels.layout import INDEX_MASK, pack_record  # noqa: E402
from lsm_gnn.kernels import using  # noqa: E402
from lsm_gnn.kernels import victim_serve  # noqa: E402


def both_modes(op, *args):
    """The op's result on CPU tensors with kernels=native (C++) and kernels=triton (interpreter), each first
    checked against the op's torch definition; each call gets its own copy of the arguments, which it may
    write."""
    definition = {torch.ops.lsm_gnn.pvp_match: pvp.match_prefetched,
                  torch.ops.lsm_gnn.pvp_scatter: pvp.scatter_prefetched,
                  torch.ops.lsm_gnn.pvp_fill: pvp.fill_prefetched,
                  torch.ops.lsm_gnn.pvp_install: pvp.install_prefetched}[op]
    copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    expected = (definition(*copies), copies)
    results = []
    for mode in ("native", "triton"):
        copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        with using(mode):
            results.append((op(*copies), copies))
        for what, want, got in (("output", expected[0], results[-1][0]), ("arguments", expected[1], copies)):
            want, got = (x if isinstance(x, (tuple, list)) else [x] for x in (want, got))
            assert all(a is b or (isinstance(a, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b))
                       for a, b in zip(want, got)), f"{mode} {what} differ from the torch definition"
    return results


def batch_of(ids):
    ids = torch.as_tensor(ids, dtype=torch.int64)
    unique, inverse = torch.unique(ids, sorted=True, return_inverse=True)
    return ids, inverse, unique.numel()


def record(index, reuse=1, rank=0):
    value = pack_record(reuse, rank, index)
    return value - (1 << 64) if value >= 1 << 63 else value  # as the signed int64 the buffer stores


def assert_match_equal(ids, inverse, num_unique, node, records):
    node, records = torch.as_tensor(node, dtype=torch.int64), torch.as_tensor(records, dtype=torch.int64)
    (native, _), (triton, _) = both_modes(torch.ops.lsm_gnn.pvp_match, ids, inverse, num_unique, node, records)
    for name, a, b in zip(("served", "entry", "position"), native, triton):
        assert a.dtype == b.dtype and torch.equal(a, b), f"{name} differs: {a} vs {b}"
    return native


def random_prefetch(rng, ids, num_lines):
    """Prefetched lines: about half valid (their index holds their node), the others pointing past the batch,
    at another node, or carrying high reuse bits that set the record's sign bit."""
    batch = ids.numel()
    index = rng.integers(0, max(2 * batch, 1), num_lines)
    node = rng.integers(0, 60, num_lines)
    valid = (rng.random(num_lines) < 0.5) & (index < batch)
    node[valid] = ids.numpy()[index[valid]]
    records = [record(int(i), reuse=int(r)) for i, r in zip(index, rng.integers(1, 1 << 16, num_lines))]
    return torch.from_numpy(node), torch.tensor(records, dtype=torch.int64)


@pytest.mark.parametrize("seed,batch,num_lines", [(0, 70, 40), (1, 300, 400), (2, 5, 30)])
def test_triton_match_equals_the_torch_one_on_random_batches(seed, batch, num_lines):
    rng = np.random.default_rng(seed)
    ids, inverse, num_unique = batch_of(rng.integers(0, 60, batch))  # repeats: 60 nodes
    node, records = random_prefetch(rng, ids, num_lines)
    served, _, _ = assert_match_equal(ids, inverse, num_unique, node, records)
    assert 0 < int(served.sum()) < num_unique


def test_match_adversarial_batches():
    ids, inverse, num_unique = batch_of([7, 3, 7, 9, 3, 3])
    none = torch.empty(0, dtype=torch.int64)
    served, entry, position = assert_match_equal(ids, inverse, num_unique, none, none)  # empty prefetch buffer
    assert not served.any() and (entry == -1).all() and (position == -1).all()
    empty, empty_inverse, zero = batch_of([])
    assert assert_match_equal(empty, empty_inverse, zero, [7], [record(0)])[0].numel() == 0  # empty batch
    assert_match_equal(empty, empty_inverse, zero, none, none)
    # Lines 0-3 never serve: index past the batch, the largest index, another node there, a sign bit set.
    # Lines 4 and 6 both serve node 3 (at its two stored positions): the first (4) wins; line 5 serves 9.
    node = [7, 7, 9, 9, 3, 9, 3, 7]
    records = [record(6), record(INDEX_MASK), record(0), record(2, reuse=0xFFFF), record(4), record(3), record(1),
               record(2, reuse=0xFFFF)]
    served, entry, position = assert_match_equal(ids, inverse, num_unique, node, records)
    assert served.tolist() == [True, True, True] and entry.tolist() == [4, 7, 5] and position.tolist() == [4, 2, 3]
    assert_match_equal(ids, inverse, num_unique, node[:4], records[:4])  # nothing valid


def test_a_bad_inverse_raises_instead_of_writing_outside():
    from lsm_gnn import _C

    ids = torch.tensor([4, 5])
    with pytest.raises(ValueError, match="outside"):
        victim_serve.pvp_match(ids, torch.tensor([0, 2]), 2, torch.tensor([5]), torch.tensor([record(1)]))
    with pytest.raises(ValueError, match=r"inverse\[1\] = 2 is not in \[0, 2\)"):
        _C.pvp_match(ids, torch.tensor([0, 2]), 2, torch.tensor([5]), torch.tensor([record(1)]))


def scatter_case(rng, batch, num_unique, num_lines, cache_lines, dim, dtype):
    inverse = torch.from_numpy(rng.integers(0, num_unique, batch))
    from_pvp = torch.from_numpy(rng.random(num_unique) < 0.5)
    entry = torch.from_numpy(rng.integers(0, num_lines, num_unique))
    line = torch.from_numpy(rng.permutation(cache_lines)[:num_unique])  # a line is taken by one id at most
    line[torch.from_numpy(rng.random(num_unique) < 0.3)] = -1  # no line (an oversubscribed set)
    rows = torch.from_numpy(rng.standard_normal((batch, dim))).to(dtype)
    cache_data = torch.from_numpy(rng.standard_normal((cache_lines, dim))).to(dtype)
    pf_rows = torch.from_numpy(rng.standard_normal((num_lines, dim))).to(dtype)
    return rows, cache_data, pf_rows, inverse, from_pvp, entry, line


@pytest.mark.parametrize("reinstall", [False, True])
@pytest.mark.parametrize("batch,num_unique,dim,dtype", [(90, 40, 8, torch.float32), (30, 30, 130, torch.float16),
                                                        (1, 1, 3, torch.float64)])
def test_triton_scatter_equals_the_torch_one(reinstall, batch, num_unique, dim, dtype):
    rng = np.random.default_rng(batch + dim)
    rows, cache_data, pf_rows, inverse, from_pvp, entry, line = scatter_case(rng, batch, num_unique, 20, 60, dim,
                                                                              dtype)
    from_pvp[0] = True  # at least one served id
    args = (rows, cache_data, pf_rows, inverse, from_pvp, entry, line if reinstall else None)
    (_, native), (_, triton) = both_modes(torch.ops.lsm_gnn.pvp_scatter, *args)
    assert torch.equal(native[0], triton[0]), "rows differ"
    assert torch.equal(native[1], triton[1]), "cache lines differ"
    assert torch.equal(native[1], cache_data) != (reinstall and bool((from_pvp & (line >= 0)).any()))
    served = from_pvp[inverse]
    assert torch.equal(native[0][served], pf_rows[entry[inverse[served]]])
    assert torch.equal(native[0][~served], rows[~served])


def test_scatter_adversarial_cases():
    from lsm_gnn import _C

    rng = np.random.default_rng(3)
    rows, cache_data, pf_rows, inverse, from_pvp, entry, line = scatter_case(rng, 12, 6, 4, 10, 5, torch.float32)
    nothing = torch.zeros_like(from_pvp)
    for served in (nothing, ~nothing):  # no id served; every id served
        (_, native), (_, triton) = both_modes(torch.ops.lsm_gnn.pvp_scatter, rows, cache_data, pf_rows, inverse,
                                              served, entry, line)
        assert all(torch.equal(a, b) for a, b in zip(native, triton))
    empty = torch.empty(0, dtype=torch.int64)
    (_, native), (_, triton) = both_modes(torch.ops.lsm_gnn.pvp_scatter, rows[:0], cache_data, pf_rows[:0], empty,
                                          nothing[:0], empty, empty)  # an empty batch and buffer
    assert torch.equal(native[1], cache_data) and torch.equal(triton[1], cache_data)
    bad_entry, bad_line = entry.clone(), line.clone()
    bad_entry[0], bad_line[1] = 4, 10
    for entry_, line_ in ((bad_entry, line), (entry, bad_line)):
        with pytest.raises(ValueError, match="outside"):
            victim_serve.pvp_scatter(rows.clone(), cache_data.clone(), pf_rows, inverse, ~nothing, entry_, line_)
        with pytest.raises(ValueError, match="is not a prefetched line|is not a cache line"):
            _C.pvp_scatter(rows.clone(), cache_data.clone(), pf_rows, inverse, ~nothing, entry_, line_)


def fill_case(rng, batch, num_lines, cache_lines, dim, dtype):
    """A batch over 60 nodes, prefetched lines as in random_prefetch, about half the ids hit, distinct lines
    for the ids (a third without one), and random rows."""
    ids, inverse, num_unique = batch_of(rng.integers(0, 60, batch))
    node, records = random_prefetch(rng, ids, num_lines)
    hit = torch.from_numpy(rng.random(num_unique) < 0.5)
    line = torch.from_numpy(rng.permutation(cache_lines)[:num_unique])
    line[torch.from_numpy(rng.random(num_unique) < 0.3)] = -1
    pf_rows = torch.from_numpy(rng.standard_normal((num_lines, dim))).to(dtype)
    cache_data = torch.from_numpy(rng.standard_normal((cache_lines, dim))).to(dtype)
    return ids, inverse, hit, line, node, records, pf_rows, cache_data


@pytest.mark.parametrize("seed,batch,num_lines,dim,dtype", [(0, 70, 40, 8, torch.float32),
                                                            (1, 300, 400, 130, torch.float16),
                                                            (2, 5, 30, 3, torch.float64)])
def test_fill_equals_the_torch_one_on_random_batches(seed, batch, num_lines, dim, dtype):
    rng = np.random.default_rng(seed)
    args = fill_case(rng, batch, num_lines, 200, dim, dtype)
    ids, inverse, hit, line, node, records, pf_rows, cache_data = args
    ((from_pvp, entry), native), ((t_from_pvp, t_entry), triton) = both_modes(torch.ops.lsm_gnn.pvp_fill, *args)
    assert torch.equal(from_pvp, t_from_pvp) and torch.equal(entry, t_entry)
    assert torch.equal(native[7], triton[7]), "cache lines differ"
    served, first, _ = pvp.match_prefetched(ids, inverse, hit.numel(), node, records)
    assert torch.equal(from_pvp, served & ~hit)  # the match, less the ids the cache hit
    assert 0 < int(from_pvp.sum()) < int(served.sum())
    filled = from_pvp & (line >= 0)
    assert torch.equal(native[7][line[filled]], pf_rows[first[filled]])
    untouched = torch.ones(cache_data.shape[0], dtype=torch.bool)
    untouched[line[filled]] = False
    assert torch.equal(native[7][untouched], cache_data[untouched])


def test_fill_adversarial_cases():
    from lsm_gnn import _C

    ids, inverse, num_unique = batch_of([7, 3, 7, 9, 3, 3])  # distinct 3, 7, 9
    none = torch.empty(0, dtype=torch.int64)
    hit, line = torch.zeros(num_unique, dtype=torch.bool), torch.tensor([2, 0, 1])
    rows = torch.arange(8 * 2, dtype=torch.float32).reshape(8, 2)
    cache = torch.full((4, 2), -1.0)
    (result, written), _ = both_modes(torch.ops.lsm_gnn.pvp_fill, ids, inverse, hit, line, none, none, rows[:0],
                                      cache)  # an empty prefetch buffer
    assert not result[0].any() and (result[1] == -1).all() and torch.equal(written[7], cache)
    empty, empty_inverse, _ = batch_of([])
    both_modes(torch.ops.lsm_gnn.pvp_fill, empty, empty_inverse, hit[:0], none, torch.tensor([7]),
               torch.tensor([record(0)]), rows[:1], cache)  # an empty batch
    # As in test_match_adversarial_batches: lines 0-3 never serve; 4 and 6 both match node 3 (4 first);
    # 7 matches node 7, 5 matches node 9. Node 7 is a cache hit, so line 7 is unused; node 9 has no line.
    node = torch.tensor([7, 7, 9, 9, 3, 9, 3, 7])
    records = torch.tensor([record(6), record(INDEX_MASK), record(0), record(2, reuse=0xFFFF), record(4), record(3),
                            record(1), record(2, reuse=0xFFFF)])
    hit, line = torch.tensor([False, True, False]), torch.tensor([2, 0, -1])
    (result, written), _ = both_modes(torch.ops.lsm_gnn.pvp_fill, ids, inverse, hit, line, node, records, rows,
                                      cache)
    assert result[0].tolist() == [True, False, True] and result[1].tolist() == [4, -1, 5]
    assert torch.equal(written[7][2], rows[4]) and torch.equal(written[7][[0, 1, 3]], cache[[0, 1, 3]])
    bad_line = torch.tensor([4, 0, -1])  # node 3's line past the cache
    with pytest.raises(ValueError, match="outside"):
        victim_serve.pvp_fill(ids, inverse, hit, bad_line, node, records, rows, cache.clone())
    with pytest.raises(ValueError, match=r"line\[0\] = 4 is not a cache line"):
        _C.pvp_fill(ids, inverse, hit, bad_line, node, records, rows, cache.clone())
    with pytest.raises(ValueError, match=r"inverse\[1\] = 3 is not in \[0, 3\)"):
        _C.pvp_fill(ids, torch.tensor([0, 3, 0, 2, 1, 1]), hit, line, node, records, rows, cache.clone())


@pytest.mark.parametrize("seed,dim,dtype", [(0, 8, torch.float32), (1, 130, torch.float16)])
def test_install_equals_the_torch_one_and_unchecked_reads_nothing_back(seed, dim, dtype):
    """pvp_install (the second half of pvp_fill, which a GPU cache runs after its read back) writes what its
    definition writes, in both modes; unchecked, the Triton twin reads nothing back and writes the same."""
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from host_budget import HostWork

    rng = np.random.default_rng(seed)
    ids, inverse, hit, line, node, records, pf_rows, cache_data = fill_case(rng, 90, 60, 200, dim, dtype)
    served, entry, _ = pvp.match_prefetched(ids, inverse, hit.numel(), node, records)
    from_pvp = served & ~hit
    (_, written), _ = both_modes(torch.ops.lsm_gnn.pvp_install, cache_data, pf_rows, from_pvp, entry, line)
    assert not torch.equal(written[0], cache_data), "some served id has a line"
    for check in (True, False):
        work, lines = HostWork(), cache_data.clone()
        work.call(lambda *a: victim_serve.pvp_install(*a, check=check), lines, pf_rows, from_pvp, entry, line)
        assert torch.equal(lines, written[0])
        assert work.counts.reads_back == int(check), work.what
    bad = torch.where(from_pvp, line.clamp_min(0) + 1000, line)
    for install in (victim_serve.pvp_install, torch.ops.lsm_gnn.pvp_install):
        with pytest.raises(ValueError, match="outside"):
            install(cache_data.clone(), pf_rows, from_pvp, entry, bad)


@pytest.mark.parametrize("reinstall", [False, True])
def test_a_cache_serving_with_the_triton_kernels_equals_one_with_the_cpp_ops(tiny_cache, monkeypatch, reinstall):
    """The lookup's PVP serve, scatter and fill on the Triton kernels (C++ cache decisions, so the run stays quick):
    the same rows, hit masks, cache lines and PVP counts as with the C++ ops, batch by batch."""
    from lsm_gnn import _C
    from lsm_gnn.cache import replay
    from lsm_gnn.testing import power_law_trace

    storage, features, static = tiny_cache
    trace = power_law_trace(0, 30, 40, storage.num_rows)

    def make():
        return SoftwareCache(storage, num_sets=4, ways=16, static_scores=static, pvp=True, pvp_queue_capacity=3,
                             pvp_reinstall=reinstall)

    torch_cache, triton_cache = make(), make()
    calls = {"pvp_match": 0, "pvp_scatter": 0, "pvp_fill": 0}

    def counted(name):
        def run(*args):
            calls[name] += 1
            return getattr(victim_serve, name)(*args)
        return run

    with_lines = 0  # batches with prefetched lines: the others skip the match
    for k, (current, future) in enumerate(replay(trace, 8, num_nodes=storage.num_rows)):
        expected = torch_cache.lookup(current, future=future)
        prefetched = triton_cache.pvp.stats.prefetched
        with monkeypatch.context() as patch:  # the ops' CPU kernels call these: here the Triton ones
            patch.setattr(_C, "pvp_match", counted("pvp_match"))
            patch.setattr(_C, "pvp_scatter", counted("pvp_scatter"))
            patch.setattr(_C, "pvp_fill", counted("pvp_fill"))
            got = triton_cache.lookup(current, future=future)
        with_lines += triton_cache.pvp.stats.prefetched > prefetched
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), f"batch {k} differs"
        assert torch.equal(got[0], features[torch.as_tensor(current)])
        assert torch.equal(triton_cache.data, torch_cache.data)
        assert torch.equal(triton_cache.state.tags, torch_cache.state.tags)
    assert triton_cache.stats.as_dict() == torch_cache.stats.as_dict()
    assert triton_cache.pvp.stats == torch_cache.pvp.stats
    assert torch_cache.pvp.stats.hits > 0
    if reinstall:  # one fill per batch with prefetched lines; match and scatter only where a set overflowed
        assert calls["pvp_fill"] == with_lines > 0 and calls["pvp_match"] == 0
    else:  # the paper's mode: match before the assign, scatter to the batch
        assert calls["pvp_match"] == with_lines > 0 and calls["pvp_scatter"] > 0 and calls["pvp_fill"] == 0
