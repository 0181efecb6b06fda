"""The row gather kernel (the ``pinned`` storage's reads) copies exactly ``table[ids]`` into ``out``, or into
``out[slots]``, byte for byte for every dtype and row width; run by Triton's interpreter. The same launcher on a
GPU over a pinned table: tests/test_gpu_paths.py. A device cache's last gather (``rows_by_line``) gives each
position its distinct id's line and hit flag, as the torch ops it replaces (the op's CPU kernel) do."""
import os

import numpy as np
import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are defined: before their import
pytest.importorskip("triton")

from lsm_gnn.kernels import ops  # noqa: E402,F401  (registers torch.ops.lsm_gnn)
from lsm_gnn.kernels.row_gather import gather_rows, rows_by_line, word_bytes  # noqa: E402

NUM_ROWS = 37


def table_of(dtype: torch.dtype, dim: int, seed: int) -> torch.Tensor:
    """Random bytes seen as ``dtype`` (every bit pattern, NaNs of every payload included: bytes are compared)."""
    rng = np.random.default_rng(seed)
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.from_numpy(rng.integers(0, 256, (NUM_ROWS, dim * size), dtype=np.uint8))
    return raw.view(dtype)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


ID_CASES = {
    "random": lambda rng: rng.integers(0, NUM_ROWS, 50),
    "repeats, both ends": lambda rng: np.array([NUM_ROWS - 1, 0, 5, 5, NUM_ROWS - 1, 0, 5]),
    "one": lambda rng: np.array([NUM_ROWS - 1]),
    "every row, reversed": lambda rng: np.arange(NUM_ROWS)[::-1].copy(),
}


# Widths whose rows move as 1-, 2-, 4- and 8-byte words, odd ones, and one wider than a block of words.
@pytest.mark.parametrize("dtype,dim", [(torch.float32, 13), (torch.float32, 2), (torch.float32, 700),
                                       (torch.float16, 13), (torch.float16, 4), (torch.uint8, 13),
                                       (torch.uint8, 6), (torch.uint8, 1)])
@pytest.mark.parametrize("case", list(ID_CASES))
def test_the_gather_copies_the_tables_rows(dtype, dim, case):
    table = table_of(dtype, dim, seed=dim)
    ids = torch.from_numpy(ID_CASES[case](np.random.default_rng(dim)))
    out = torch.empty((ids.numel(), dim), dtype=dtype)
    gather_rows(table, ids, out)
    assert same_bytes(out, table[ids])


@pytest.mark.parametrize("dtype,dim", [(torch.float32, 13), (torch.float16, 3), (torch.uint8, 9)])
def test_the_gather_into_slots_writes_those_rows_only(dtype, dim):
    """Rows land in ``out[slots]`` (a cache's lines); every other row of ``out`` keeps its bytes."""
    rng = np.random.default_rng(dim)
    table = table_of(dtype, dim, seed=1)
    out = table_of(dtype, dim, seed=2)[:30].clone()
    before = out.clone()
    ids = torch.from_numpy(rng.integers(0, NUM_ROWS, 12))
    slots = torch.from_numpy(np.concatenate([[29, 0], rng.permutation(np.arange(1, 29))[:10]]))  # distinct, both ends
    gather_rows(table, ids, out, slots)
    assert same_bytes(out[slots], table[ids])
    untouched = torch.ones(30, dtype=torch.bool)
    untouched[slots] = False
    assert same_bytes(out[untouched], before[untouched])


@pytest.mark.launches_no_kernel  # empty or refused: no launch
def test_an_empty_batch_launches_nothing_and_bad_arguments_are_refused():
    table = table_of(torch.float32, 5, seed=0)
    out = torch.full((2, 5), 7.0)
    gather_rows(table, torch.empty(0, dtype=torch.int64), out)
    assert torch.equal(out, torch.full((2, 5), 7.0))
    with pytest.raises(ValueError, match="one dtype and row width"):
        gather_rows(table, torch.tensor([1]), torch.empty((1, 4)))
    with pytest.raises(ValueError, match="one dtype and row width"):
        gather_rows(table, torch.tensor([1]), torch.empty((1, 5), dtype=torch.float16))
    with pytest.raises(ValueError, match="contiguous"):
        gather_rows(table[:, :4], torch.tensor([1]), torch.empty((1, 4)))
    with pytest.raises(ValueError, match="2 slots for 1 ids"):
        gather_rows(table, torch.tensor([1]), out, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="on out's device"):
        gather_rows(table, torch.tensor([1], device="meta"), out)


@pytest.mark.launches_no_kernel
def test_rows_move_as_the_widest_word_their_bytes_and_addresses_allow():
    base = torch.empty(64, dtype=torch.uint8)
    assert [word_bytes(n, base) for n in (52, 26, 13, 8, 24)] == [4, 2, 1, 8, 8]
    assert word_bytes(8, base[1:]) == 1 and word_bytes(8, base[2:]) == 2  # an address off the word


def _lookup_of(rng, positions: int, distinct: int, lines: int):
    """A lookup's assign: ``distinct`` ids with a line each (distinct lines) or -1 (bypassed: a quarter), a hit
    flag each, and ``positions`` requested positions (every distinct id among them)."""
    line = torch.from_numpy(rng.permutation(lines)[:distinct].astype(np.int64))
    line[torch.from_numpy(rng.random(distinct) < 0.25)] = -1
    hit = torch.from_numpy(rng.random(distinct) < 0.5) & (line >= 0)
    inverse = torch.from_numpy(np.concatenate([np.arange(distinct), rng.integers(0, distinct, positions - distinct)]))
    return line, hit, inverse[torch.from_numpy(rng.permutation(positions))]


# Rows moved as 4-, 2-, 1- and 8-byte words; 300 positions span several programs (128 rows of 13 words a block).
@pytest.mark.parametrize("dtype,dim", [(torch.float32, 13), (torch.float16, 3), (torch.uint8, 9), (torch.float64, 600)])
def test_rows_by_line_gathers_each_position_from_its_ids_line(dtype, dim):
    """Every row and hit flag are the torch ops' (the CPU kernel's) exactly: a position's line's row, line 0's
    where its line is -1 (a bypassed miss, whose row the cache then copies from elsewhere)."""
    rng = np.random.default_rng(dim)
    data = table_of(dtype, dim, seed=3)
    line, hit, inverse = _lookup_of(rng, positions=300, distinct=NUM_ROWS - 5, lines=NUM_ROWS)
    rows = torch.from_numpy(rng.integers(0, 256, (300, dim * data.element_size()), dtype=np.uint8)).view(dtype)
    expected_rows = torch.empty_like(rows)
    expected_hit = torch.ops.lsm_gnn.rows_by_line(data, line, hit, inverse, expected_rows)  # the CPU kernel
    request_hit = rows_by_line(data, line, hit, inverse, rows)
    assert request_hit.dtype == torch.bool and torch.equal(request_hit, expected_hit)
    assert same_bytes(rows, expected_rows)
    has_line = line[inverse] >= 0
    assert same_bytes(rows[has_line], data[line[inverse][has_line]]) and (~has_line).any() and hit.any()


@pytest.mark.launches_no_kernel  # empty or refused: no launch
def test_rows_by_line_with_no_positions_launches_nothing_and_refuses_mismatches():
    data, line, hit = table_of(torch.float32, 5, seed=0), torch.tensor([2, -1]), torch.tensor([True, False])
    assert rows_by_line(data, line, hit, torch.empty(0, dtype=torch.int64), torch.empty((0, 5))).numel() == 0
    with pytest.raises(ValueError, match="one dtype and row width"):
        rows_by_line(data, line, hit, torch.tensor([0]), torch.empty((1, 4)))
    with pytest.raises(ValueError, match="one row per position"):
        rows_by_line(data, line, hit, torch.tensor([0, 1]), torch.empty((1, 5)))
    with pytest.raises(ValueError, match="one line and hit per distinct id"):
        rows_by_line(data, line, hit[:1], torch.tensor([0]), torch.empty((1, 5)))
