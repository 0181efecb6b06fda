"""The window index's compact layout: 13 bytes per node, iterations stored in 32 bits from a base that
moves, positions in 32 bits, occurrences linked through a ring; every answer equal to a scan of the
batches held, whatever the iteration counter's value."""
import numpy as np
import pytest
import torch

from lsm_gnn import _C
from lsm_gnn.cache import WindowBuffer
from lsm_gnn.testing import power_law_trace

INT32_MAX = 2**31 - 1
NO_REUSE = 0xFFFF


def expected_first(batches, v):
    """(k, position) of node v's first occurrence among the batches (k from 0), or None."""
    for k, batch in enumerate(batches):
        hits = np.flatnonzero(batch == v)
        if hits.size:
            return k, int(hits[0])
    return None


def check_against_the_batches(window: WindowBuffer, ranks: list[int], num_nodes: int, limit: int):
    """Every node's record, first arrays and absolute first iteration equal a scan of the batches held."""
    index = window.index
    batches = [b.numpy() for b in window]
    records = index.next_records(torch.arange(num_nodes), limit).numpy().view(np.uint64)
    first_iteration, first_position, first_rank = index.first_iteration, index.first_position, index.first_rank
    assert 0 <= index.front_offset <= INT32_MAX
    assert index.front_iteration == index.iteration_base + index.front_offset
    for v in range(num_nodes):
        first = expected_first(batches, v)
        reuse = int(records[v] >> np.uint64(48))
        if first is None:
            assert reuse == NO_REUSE and first_iteration[v] == -1, f"node {v} is not in the window"
            continue
        k, position = first
        assert first_iteration[v] == index.front_offset + k, f"node {v}: stored first iteration"
        assert first_position[v] == position and first_rank[v] == ranks[k], f"node {v}: position or rank"
        if k < limit:
            assert reuse == k + 1 and int(records[v] & np.uint64((1 << 40) - 1)) == position
            assert int(records[v] >> np.uint64(40)) & 0xFF == ranks[k]
        else:
            assert reuse == NO_REUSE


def slide(window: WindowBuffer, trace, num_nodes: int, limit: int, rng):
    """Pushes and pops (sometimes several, sometimes none) over the trace, checking after each step."""
    ranks: list[int] = []
    for step, batch in enumerate(trace):
        while window.full or (len(window) and rng.random() < 0.2):
            window.pop()
            ranks.pop(0)
        rank = int(rng.integers(0, 256))
        window.push(batch, rank=rank)
        ranks.append(rank)
        check_against_the_batches(window, ranks, num_nodes, limit)


@pytest.mark.parametrize("rebase_after", [1, 3, 8, 1000])
def test_records_equal_a_scan_of_the_batches_however_often_the_base_moves(rebase_after):
    num_nodes = 80
    rng = np.random.default_rng(rebase_after)
    trace = power_law_trace(rebase_after, 40, 30, num_nodes)
    window = WindowBuffer(6, num_nodes, rebase_after=rebase_after)
    slide(window, trace, num_nodes, 4, rng)
    if rebase_after < 40:
        assert window.index.iteration_base > 0, "the base must have moved"
    else:
        assert window.index.iteration_base == 0


def test_the_base_moves_when_an_iteration_would_leave_int32():
    """The default bound: iterations stored up to 2^31 - 1, then one O(num_nodes) move of the base."""
    num_nodes = 60
    rng = np.random.default_rng(1)
    start = INT32_MAX - 6
    window = WindowBuffer(5, num_nodes, start_iteration=start)
    assert window.index.front_iteration == start and window.index.iteration_base == 0
    trace = power_law_trace(1, 20, 25, num_nodes)
    slide(window, trace, num_nodes, 5, rng)
    index = window.index
    assert index.front_iteration > INT32_MAX, "the counter went past 2^31"
    assert index.iteration_base > 0 and index.front_offset < 40


@pytest.mark.parametrize("start", [2**16 - 4, 5 * 2**32 + 7])
def test_iteration_counters_across_16_bits_and_beyond_32_bits(start):
    """Occurrences keep their batch's iteration modulo 2^16; an index may start past 2^32."""
    num_nodes = 30
    window = WindowBuffer(4, num_nodes, start_iteration=start)
    slide(window, power_law_trace(2, 12, 12, num_nodes), num_nodes, 3, np.random.default_rng(2))
    assert window.index.front_iteration >= start + 8


def test_the_same_records_with_and_without_moves_of_the_base():
    num_nodes = 200
    trace = power_law_trace(3, 60, 50, num_nodes)
    plain, moved = WindowBuffer(8, num_nodes), WindowBuffer(8, num_nodes, rebase_after=5)
    ids = torch.arange(num_nodes)
    for batch in trace:
        for w in (plain, moved):
            if w.full:
                w.pop()
            w.push(batch, rank=3)
        assert torch.equal(plain.index.next_records(ids, 8), moved.index.next_records(ids, 8))
        absolute = [w.index.first_iteration.long() + w.index.iteration_base for w in (plain, moved)]
        held = plain.index.first_iteration >= 0
        assert torch.equal(absolute[0][held], absolute[1][held])
        assert torch.equal(plain.index.first_position, moved.index.first_position)


def test_positions_beyond_16_bits_and_repeats_within_a_batch():
    num_nodes = 1000
    batch = np.concatenate([np.full(70_000, 3), [7, 3, 9, 7]])  # node 7 first at 70000, 9 at 70002
    window = WindowBuffer(3, num_nodes)
    window.push(batch)
    window.push(np.array([9, 9, 7]))
    index = window.index
    assert index.first_position[[3, 7, 9]].tolist() == [0, 70_000, 70_002]
    window.pop()
    assert index.first_position[[3, 7, 9]].tolist() == [0, 2, 0]
    assert index.first_iteration[[3, 7, 9]].tolist() == [-1, 1, 1]


def test_bytes_per_node_stay_at_13():
    """Per node: first iteration and position (int32 each), rank (uint8), last occurrence (uint32).
    The rest grows with the ids in the window, never with the graph."""
    assert _C.WindowIndex.bytes_per_node == 13
    sizes = {}
    for num_nodes in (10_000, 1_000_000):
        window = WindowBuffer(8, num_nodes)
        empty = window.index.allocated_bytes
        assert 13 * num_nodes <= empty <= 13 * num_nodes + 4096, f"{empty / num_nodes:.2f} B/node"
        for batch in power_law_trace(4, 8, 500, 10_000):
            window.push(batch)
        sizes[num_nodes] = window.index.allocated_bytes - empty
    assert sizes[10_000] == sizes[1_000_000], "the window's own memory must not depend on the node count"
    assert 0 < sizes[10_000] <= 64 * 8 * 500


def test_start_and_rebase_arguments_are_checked():
    with pytest.raises(ValueError, match="start"):
        _C.WindowIndex(10, -1)
    with pytest.raises(ValueError, match="rebase_after"):
        _C.WindowIndex(10, 0, 0)
