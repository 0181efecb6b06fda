"""The compaction kernels of a lookup with misses (lsm_gnn/kernels/compact.py) against torch: the distinct ids
of a request, the assign's segments by set and the misses packed for the one read back, run by Triton's
interpreter, with blocks of the default size and of 4 positions (so that a batch spans many blocks and each
program sums the counts before it in several chunks)."""
import os

import numpy as np
import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are defined: before their import
pytest.importorskip("triton")

from lsm_gnn.kernels import compact, using  # noqa: E402
from lsm_gnn.kernels import ops as _ops  # noqa: E402,F401  (registers torch.ops.lsm_gnn)
from lsm_gnn.kernels.layout import NO_ID  # noqa: E402

NUM_ROWS = 50


@pytest.fixture(params=["default blocks", "small blocks"])
def blocks(request, monkeypatch):
    """``blocks(n)`` before a call on ``n`` positions: small blocks are 4 positions (64 past 200, so that the
    interpreter's programs stay few), their counts summed 2 (4) at a time."""
    def use(n: int) -> None:
        if request.param == "small blocks":
            monkeypatch.setattr(compact, "BLOCK", 4 if n <= 200 else 64)
            monkeypatch.setattr(compact, "CHUNK", 2 if n <= 200 else 4)
    return use


IDS = {
    "random, repeats": lambda rng: rng.integers(0, NUM_ROWS, 37),
    "one": lambda rng: np.array([NUM_ROWS - 1]),
    "all equal": lambda rng: np.full(9, 3),
    "distinct, reversed": lambda rng: np.arange(NUM_ROWS)[::-1].copy(),
    "both ends": lambda rng: np.array([0, NUM_ROWS - 1, 0, 7, NUM_ROWS - 1]),
    "more than a default block": lambda rng: rng.integers(0, 4 * NUM_ROWS, 2500),
}
OUTSIDE = {"negative": -1, "the row count": NUM_ROWS, "the largest int64": NO_ID}


def native(op: str, *args):
    """The op's CPU kernel in the native mode: torch's own ops."""
    with using("native"):
        return getattr(torch.ops.lsm_gnn, op)(*args)


@pytest.mark.parametrize("case", list(IDS))
def test_distinct_ids_are_torch_unique_padded(blocks, case):
    ids = torch.from_numpy(IDS[case](np.random.default_rng(len(case))))
    num_rows = 4 * NUM_ROWS
    blocks(ids.numel())
    unique, inverse, facts = compact.distinct_ids(ids, num_rows)
    expected, expected_inverse = torch.unique(ids, sorted=True, return_inverse=True)
    k = expected.numel()
    assert torch.equal(unique[:k], expected) and bool((unique[k:] == NO_ID).all())
    assert torch.equal(inverse, expected_inverse)
    assert facts.tolist() == [k, int(ids.min()), int(ids.max())]
    for got, want in zip((unique, inverse, facts), native("distinct_ids", ids, num_rows)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("where", ["first", "last", "middle"])
@pytest.mark.parametrize("outside", list(OUTSIDE))
def test_an_id_outside_the_rows_pads_every_distinct_id(blocks, where, outside):
    """So an assign gives no id a line before the caller reads the range and refuses the batch."""
    ids = np.random.default_rng(5).integers(0, NUM_ROWS, 11)
    ids[{"first": 0, "last": -1, "middle": 5}[where]] = OUTSIDE[outside]
    ids = torch.from_numpy(ids)
    blocks(ids.numel())
    unique, inverse, facts = compact.distinct_ids(ids, NUM_ROWS)
    assert bool((unique == NO_ID).all())
    assert facts.tolist()[1:] == [int(ids.min()), int(ids.max())]
    for got, want in zip((unique, inverse, facts), native("distinct_ids", ids, NUM_ROWS)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("num_sets,n", [(1, 1), (1, 9), (3, 20), (64, 40), (5, 1500)])
def test_segments_start_at_each_sets_first_miss(blocks, num_sets, n):
    """``by_set`` as the hit kernel leaves it (a miss's set, ``num_sets`` for a hit), ordered by a stable sort:
    one segment per set with misses, in set order, then ``n``."""
    rng = np.random.default_rng(num_sets * n)
    by_set = torch.from_numpy(rng.integers(0, num_sets + 1, n))
    order = torch.argsort(by_set, stable=True)
    blocks(n)
    sorted_sets, starts = compact.set_segments(by_set, order, num_sets)
    assert torch.equal(sorted_sets, by_set[order])
    s = sorted_sets.tolist()
    expected = [k for k in range(n) if s[k] < num_sets and (k == 0 or s[k] != s[k - 1])]
    assert starts.tolist() == expected + [n] * (n - len(expected))


@pytest.mark.parametrize("n,share", [(1, 0.0), (1, 1.0), (30, 0.5), (30, 0.0), (30, 1.0), (1200, 0.3)])
def test_misses_are_packed_in_order_with_their_lines_and_the_counts(blocks, n, share):
    rng = np.random.default_rng(n)
    hit = torch.from_numpy(rng.random(n) >= share)
    unique = torch.from_numpy(np.sort(rng.choice(10 * n, n, replace=False)))
    line = torch.from_numpy(rng.integers(-1, 64, n))
    counts, facts = torch.tensor([3, 1, 2, int((~hit).sum())]), torch.tensor([n, 0, 10 * n])
    blocks(n)
    packed, position = compact.pack_misses(hit, unique, line, counts, facts)
    misses = int((~hit).sum())
    head = compact.PACKED_HEAD
    assert packed.numel() == head + 2 * n and position.numel() == n
    assert packed[:head].tolist() == counts.tolist() + facts.tolist()
    missed = torch.nonzero(~hit).reshape(-1)
    assert torch.equal(position[:misses], missed)
    assert torch.equal(packed[head:head + misses], unique[missed])
    assert torch.equal(packed[head + n:head + n + misses], line[missed])
    want, want_position = native("pack_misses", hit, unique, line, counts, facts)
    assert torch.equal(position[:misses], want_position[:misses])
    for start in (0, head, head + n):  # the entries the host reads
        count = head if start == 0 else misses
        assert torch.equal(packed[start:start + count], want[start:start + count])


@pytest.mark.launches_no_kernel  # refused before any launch
@pytest.mark.parametrize("num_facts", [2, 5])
def test_packing_refuses_a_head_it_has_no_room_for(num_facts):
    hit, unique, line = torch.zeros(4, dtype=torch.bool), torch.arange(4), torch.arange(4)
    with pytest.raises(ValueError, match="4 counts and 3 or 4 facts"):
        compact.pack_misses(hit, unique, line, torch.zeros(4, dtype=torch.int64),
                            torch.zeros(num_facts, dtype=torch.int64))


@pytest.mark.parametrize("ids", [torch.empty(0, dtype=torch.int64), torch.arange(3, dtype=torch.int32),
                                 torch.zeros(2, 2, dtype=torch.int64)], ids=["empty", "int32", "2-d"])
@pytest.mark.parametrize("mode", ["native", "triton"])
@pytest.mark.launches_no_kernel  # refused before any launch
def test_distinct_ids_refuse_what_they_cannot_pad(ids, mode):
    with using(mode), pytest.raises(ValueError, match="non-empty 1-d int64 tensor of ids"):
        torch.ops.lsm_gnn.distinct_ids(ids, NUM_ROWS)
