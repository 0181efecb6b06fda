"""The Triton sampler draws the very hops of the CPU sampler, run by Triton's interpreter."""
import os

import numpy as np
import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are defined: before their import
pytest.importorskip("triton")

from lsm_gnn import _C  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from lsm_gnn.kernels import sampler  # noqa: E402
from lsm_gnn.kernels.sampler import (RELABEL_BLOCK, _mulhi, _relabel, hash_table_size, hop_bounds,  # noqa: E402
                                    max_degree, sample_hops)
from lsm_gnn.utils.hashing import mix64  # noqa: E402

CorruptGraph = _C.CorruptGraphError


def power_law_csr(rng, num_nodes, avg_degree, index_dtype):
    degree = np.minimum(rng.zipf(1.8, num_nodes) * avg_degree // 2, 300)
    degree[rng.random(num_nodes) < 0.1] = 0  # isolated nodes
    indptr = np.concatenate([[0], np.cumsum(degree)]).astype(np.int64)
    indices = rng.integers(0, num_nodes, int(indptr[-1])).astype(index_dtype)
    return torch.from_numpy(indptr), torch.from_numpy(indices)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("fanouts", [[5, 2], [10, -1], [0, 3], [1, 1, 1], [-1]])
def test_triton_hops_equal_the_cpu_sampler(index_dtype, fanouts):
    rng = np.random.default_rng(len(fanouts) * 10 + fanouts[0])
    indptr, indices = power_law_csr(rng, 500, 6, index_dtype)
    for iteration in (0, 7):
        seeds = torch.from_numpy(rng.choice(500, 40, replace=False))
        expected = _C.sample_hops(indptr, indices, seeds, fanouts, 1234, iteration, 1)
        # An int32 indptr too, as the op may be given (lsm_gnn/testing/kernel_launches.py); the C++ core takes int64.
        got = sample_hops(indptr.to(indices.dtype), indices, seeds, fanouts, 1234, iteration)
        assert len(got) == len(expected)
        for h, ((n1, d1, s1, t1), (n2, d2, s2, t2)) in enumerate(zip(expected, got)):
            assert d1 == d2, f"hop {h}: destinations"
            for name, a, b in (("nodes", n1, n2), ("src", s1, s2), ("dst", t1, t2)):
                assert torch.equal(a, b), f"hop {h}: {name} differs"


def test_a_large_seed_and_iteration_key_the_same_streams():
    rng = np.random.default_rng(3)
    indptr, indices = power_law_csr(rng, 300, 8, np.int64)
    seeds = torch.arange(0, 300, 7)
    for seed, iteration in ((2**63 + 5, 3), (0, 2**40)):
        expected = _C.sample_hops(indptr, indices, seeds, [4, 4], seed, iteration, 1)
        got = sample_hops(indptr, indices, seeds, [4, 4], seed, iteration)
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[2], b[2]) for a, b in zip(expected, got))


@pytest.mark.parametrize("corruption", ["decreasing indptr", "indptr past indices", "neighbor too large",
                                        "negative neighbor"])
def test_corrupt_topology_is_an_error_naming_the_node(corruption):
    indptr = torch.tensor([0, 2, 4, 6], dtype=torch.int64)
    indices = torch.tensor([1, 2, 0, 2, 0, 1], dtype=torch.int64)
    if corruption == "decreasing indptr":
        indptr[1] = 5
    elif corruption == "indptr past indices":
        indptr[3] = 60
    elif corruption == "neighbor too large":
        indices[2] = 99
    else:
        indices[3] = -4
    with pytest.raises(CorruptGraph, match="node"):  # every index is followed
        sample_hops(indptr, indices, torch.tensor([0, 1, 2]), [-1], 0, 0)
    for seed in range(6):  # a draw may skip a bad entry: then both samplers answer, and alike
        try:
            expected = _C.sample_hops(indptr, indices, torch.tensor([0, 1, 2]), [1], seed, 0, 1)
        except ValueError:
            with pytest.raises(CorruptGraph, match="node"):
                sample_hops(indptr, indices, torch.tensor([0, 1, 2]), [1], seed, 0)
        else:
            got = sample_hops(indptr, indices, torch.tensor([0, 1, 2]), [1], seed, 0)
            assert torch.equal(got[0][0], expected[0][0]) and torch.equal(got[0][2], expected[0][2])


def test_bad_seeds():
    indptr, indices = torch.tensor([0, 1, 2]), torch.tensor([1, 0])
    with pytest.raises(IndexError, match="seed node 5"):
        sample_hops(indptr, indices, torch.tensor([5]), [1], 0, 0)
    with pytest.raises(ValueError, match="distinct"):
        sample_hops(indptr, indices, torch.tensor([1, 1]), [1], 0, 0)
    assert [h[1] for h in sample_hops(indptr, indices, torch.tensor([], dtype=torch.int64), [1, 1], 0, 0)] == [0, 0]


def same_outcome(cpp, triton_call):
    """Both samplers give the same hops, or raise the same error type with the same message."""
    try:
        expected = cpp()
    except (IndexError, ValueError) as exc:  # CorruptGraph too
        with pytest.raises(type(exc)) as raised:
            triton_call()
        assert str(raised.value) == str(exc)
        return
    got = triton_call()
    assert len(got) == len(expected)
    for h, (a, b) in enumerate(zip(expected, got)):
        assert a[1] == b[1], f"hop {h}: destinations"
        for name, x, y in (("nodes", a[0], b[0]), ("src", a[2], b[2]), ("dst", a[3], b[3])):
            assert torch.equal(x, y), f"hop {h}: {name} differs"


@pytest.mark.parametrize("seeds", [[1, 1, 9], [9, 1, 1], [2, 0, 2, -1], [3, 1, 3, 1], [0, 1, 2, 3]])
def test_bad_seeds_raise_the_cpp_samplers_error(seeds):
    """The C++ sampler raises at the first seed, by position, that is out of range or repeats an earlier one."""
    indptr, indices = torch.tensor([0, 1, 2, 2, 3]), torch.tensor([1, 0, 2])
    seeds = torch.tensor(seeds)
    same_outcome(lambda: _C.sample_hops(indptr, indices, seeds, [1, 1], 0, 0, 1),
                 lambda: sample_hops(indptr, indices, seeds, [1, 1], 0, 0))


@pytest.mark.parametrize("indptr,indices,seeds", [
    ([0, 2, 1, 3], [1, 7, 0], [0, 1]),  # row 0's neighbor is bad, row 1's range: the C++ checks rows first
    ([0, 2, 3, 6], [1, 2, 0, 1, -1, 9], [1, 2]),  # the first bad neighbor of the row, at its position
    ([0, 1, 2, 9], [2, 0], [0]),  # a bad row reached at the second hop
])
def test_corrupt_topology_raises_the_cpp_samplers_error(indptr, indices, seeds):
    indptr, indices, seeds = torch.tensor(indptr), torch.tensor(indices), torch.tensor(seeds)
    with pytest.raises(CorruptGraph):
        _C.sample_hops(indptr, indices, seeds, [-1, -1], 0, 0, 1)
    same_outcome(lambda: _C.sample_hops(indptr, indices, seeds, [-1, -1], 0, 0, 1),
                 lambda: sample_hops(indptr, indices, seeds, [-1, -1], 0, 0))


def colliding_ids(num_ids, table_size, count):
    """``count`` ids below ``num_ids`` (the largest first) whose home slots in a table of ``table_size`` match."""
    home = lambda i: (mix64(i) >> 1) & (table_size - 1)  # noqa: E731  (the kernels' _home_slot)
    target, found = home(num_ids - 1), []
    for i in range(num_ids - 1, -1, -1):
        if home(i) == target:
            found.append(i)
            if len(found) == count:
                return found
    raise AssertionError("too few colliding ids")


@pytest.mark.parametrize("fanouts", [[-1], [3], [-1, 2]])
def test_ids_sharing_a_home_slot_are_numbered_as_the_cpp_sampler_does(fanouts, monkeypatch):
    """Neighbor ids that all probe from one slot of the hash table (repeated, near num_ids, in rows that take all
    and rows that draw) get the C++ sampler's local ids in first-occurrence order."""
    num_nodes, seeds = 3000, torch.tensor([5, 0, 7])
    table_size = hash_table_size(hop_bounds(3, fanouts, num_nodes, 8 * 15, num_nodes, 8, {}))  # 15 rows of 8
    ids = colliding_ids(num_nodes, table_size, 12)
    sizes = []
    monkeypatch.setattr(sampler, "hash_table_size", lambda bounds: sizes.append(hash_table_size(bounds)) or sizes[-1])
    rng = np.random.default_rng(len(fanouts))
    degree = np.zeros(num_nodes, dtype=np.int64)
    degree[seeds.numpy()] = 8
    degree[ids] = 8
    indptr = np.concatenate([[0], np.cumsum(degree)])
    indices = rng.choice(ids + [5, 7], int(indptr[-1]))  # repeats, and seeds reached again
    csr = torch.from_numpy(indptr), torch.from_numpy(indices)
    expected = _C.sample_hops(*csr, seeds, fanouts, 9, 1, 1)
    assert len(set(expected[0][0].tolist()) & set(ids)) > 4, "the hash table must hold colliding ids"
    same_outcome(lambda: expected, lambda: sample_hops(*csr, seeds, fanouts, 9, 1))
    assert sizes == [table_size], "the ids collide in the table the call used"


@pytest.mark.parametrize("fanouts", [[-1, -1], [4, 4], [-1]])
def test_overlapping_rows_past_the_edge_bound_rerun_exactly(fanouts):
    """Rows 0 and 2 overlap (row 1, never reached, runs backwards): a frontier of both has more edges than the
    CSR, the bound of a valid one. The hop's edges past it are dropped and the call reruns at the exact count."""
    indptr = torch.tensor([0, 4, 2, 6, 8])
    indices = torch.tensor([0, 2, 3, 0, 2, 3, 0, 2])
    seeds = torch.tensor([3] if len(fanouts) > 1 else [0, 2])
    same_outcome(lambda: _C.sample_hops(indptr, indices, seeds, fanouts, 4, 2, 1),
                 lambda: sample_hops(indptr, indices, seeds, fanouts, 4, 2))


def test_a_wait_that_cannot_end_is_flagged_not_hung(monkeypatch):
    """_relabel waits for local ids that earlier tiles write; one never written (here: ids missing from an empty
    table, as a bug would leave them) sets the call's stuck flag instead of hanging, and the call raises."""
    src, record, flags = torch.tensor([5, 6]), torch.tensor([2, 0, 0]), torch.zeros(3, dtype=torch.int64)
    keys, first, label = torch.zeros(3, 8, dtype=torch.int64)
    counters = torch.zeros(2, dtype=torch.int64)  # the ticket, the tile's status
    _relabel[(1,)](src, torch.empty(2, dtype=torch.int64), torch.empty(4, dtype=torch.int64), record, flags, record,
                   counters[:1], counters[1:], keys, first, label, 2, 2, 4, 7, SEEDS=True, BLOCK=RELABEL_BLOCK,
                   MAX_WAITS=0)
    assert flags.tolist() == [0, 0, 1]
    read_back = sampler._read_back
    monkeypatch.setattr(sampler, "_read_back", lambda report: read_back(report)[:-1] + [1])
    with pytest.raises(RuntimeError, match="gave up waiting"):
        sample_hops(torch.tensor([0, 1, 2]), torch.tensor([1, 0]), torch.tensor([0]), [1], 0, 0)


@pytest.mark.launches_no_kernel
def test_the_largest_degree_is_cached_until_indptr_changes():
    indptr = torch.tensor([0, 3, 3, 5])
    assert max_degree(indptr) == 3
    indptr[2] = 0  # row 1 becomes [3, 0): a corrupt row counts as no longer than 0
    indptr[3] = 7
    assert max_degree(indptr) == 7
    assert max_degree(torch.tensor([0, 0])) == 0 and max_degree(torch.tensor([0])) == 0


@pytest.mark.parametrize("num_ids", [40, 7])  # more and fewer source ids than the CSR's 10 rows
def test_a_relation_between_two_types_bounds_its_neighbors_by_the_source_type(num_ids):
    rng = np.random.default_rng(num_ids)
    degree = rng.integers(0, 12, 10)
    indptr = torch.from_numpy(np.concatenate([[0], np.cumsum(degree)]).astype(np.int64))
    indices = torch.from_numpy(rng.integers(0, num_ids, int(indptr[-1])))
    seeds = torch.tensor([3, 0, 9, 5])
    expected = _C.sample_hops(indptr, indices, seeds, [4], 77, 2, 1, num_ids)
    got = sample_hops(indptr, indices, seeds, [4], 77, 2, num_ids)
    assert all(torch.equal(a, b) for a, b in zip(expected[0][::2], got[0][::2]))
    bad = indices.clone()
    bad[int(indptr[3])] = num_ids  # one past the source type, in the row of seed 3
    for sampler in (lambda: _C.sample_hops(indptr, bad, seeds, [-1], 0, 0, 1, num_ids),
                    lambda: sample_hops(indptr, bad, seeds, [-1], 0, 0, num_ids)):
        with pytest.raises(CorruptGraph, match=rf"outside \[0, {num_ids}\)"):
            sampler()
    # Later hops would sample from source-type ids as if they were rows: one hop at a time only.
    for sampler in (lambda: _C.sample_hops(indptr, indices, seeds, [2, 2], 0, 0, 1, num_ids),
                    lambda: sample_hops(indptr, indices, seeds, [2, 2], 0, 0, num_ids)):
        with pytest.raises(ValueError, match="one hop at a time"):
            sampler()


@triton.jit
def _high_half(a_ptr, b_ptr, out_ptr, BLOCK: tl.constexpr):
    k = tl.arange(0, BLOCK)
    tl.store(out_ptr + k, _mulhi(tl.load(a_ptr + k).to(tl.uint64), tl.load(b_ptr + k).to(tl.uint64)).to(tl.int64))


def test_the_bounded_draw_takes_the_exact_high_half_of_the_product():
    """Lemire's draw needs the high 64 bits of a 64x64-bit product (b < 2**32 here); a rounding error would
    show only once in ~2**32 / b draws, so the arithmetic itself is checked against Python's integers."""
    rng = np.random.default_rng(5)
    a = rng.integers(0, 2**63, 256, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, 256, dtype=np.uint64)
    b = np.concatenate([rng.integers(1, 2**32, 250, dtype=np.uint64), np.array([1, 2, 2**32 - 1] * 2, np.uint64)])
    a[:3] = np.uint64(2**64 - 1)
    out = torch.empty(256, dtype=torch.int64)
    _high_half[(1,)](torch.from_numpy(a.view(np.int64)), torch.from_numpy(b.view(np.int64)), out, BLOCK=256)
    expected = [(int(x) * int(y)) >> 64 for x, y in zip(a, b)]
    assert out.tolist() == expected
