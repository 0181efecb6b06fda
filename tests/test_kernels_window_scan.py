"""The Triton window scan sets exactly the C++ core's records and flags, and a window index's device
mirror stays equal to the index through pushes and pops; run by Triton's interpreter."""
import os

import numpy as np
import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are defined: before their import
pytest.importorskip("triton")

from lsm_gnn import _C  # noqa: E402
from lsm_gnn.cache import WindowBuffer  # noqa: E402
from lsm_gnn.kernels.layout import FRESH, INVALID_TAG, NO_REUSE_RECORD  # noqa: E402
from lsm_gnn.kernels.window_scan import cache_scan  # noqa: E402


def power_law_batches(rng, num_nodes, count, size):
    weights = 1.0 / np.arange(1, num_nodes + 1) ** 1.1
    weights /= weights.sum()
    return [torch.from_numpy(rng.choice(num_nodes, size=size, p=weights)) for _ in range(count)]


def cache_lines(rng, lines, num_nodes):
    """Tags with invalid lines, nodes beyond the index (a smaller index than the cache's storage) and
    stale records and flags that the scan must overwrite or keep."""
    tags = rng.integers(0, num_nodes + 20, lines)
    tags[rng.random(lines) < 0.2] = INVALID_TAG
    records = rng.integers(-(1 << 62), 1 << 62, lines)
    flags = rng.integers(0, 4, lines).astype(np.uint8)
    return torch.from_numpy(tags), torch.from_numpy(records), torch.from_numpy(flags)


@pytest.mark.parametrize("num_nodes,lines,window,limit", [(300, 256, 6, 6), (2000, 1000, 10, 4), (50, 77, 3, 1)])
def test_triton_scan_equals_the_cpp_core(num_nodes, lines, window, limit):
    rng = np.random.default_rng(num_nodes + lines)
    buffer = WindowBuffer(window, num_nodes)
    batches = power_law_batches(rng, num_nodes, 3 * window, 64)
    reused = 0
    for step, batch in enumerate(batches):
        if buffer.full:
            buffer.pop()
        buffer.push(batch, rank=step % 3)
        tags, records, flags = cache_lines(rng, lines, num_nodes)
        native = (records.clone(), flags.clone())
        twin = (records.clone(), flags.clone())
        first = buffer.first_occurrence("cpu")
        _C.cache_scan(tags, *native, *first, limit, 1)
        cache_scan(tags, *twin, *first, limit)
        assert torch.equal(native[0], twin[0]), f"step {step}: records differ"
        assert torch.equal(native[1], twin[1]), f"step {step}: flags differ"
        valid = tags != INVALID_TAG
        assert torch.equal(records[~valid], twin[0][~valid]) and torch.equal(flags[~valid], twin[1][~valid])
        assert not (twin[1][valid] & FRESH).any()
        reused += int((twin[0][valid] != NO_REUSE_RECORD).sum())
    assert reused > 0, "some lines must have a reuse in the window"


@pytest.mark.launches_no_kernel  # refused or empty: no launch
def test_scan_of_an_empty_cache_and_mismatched_arrays():
    buffer = WindowBuffer(2, 10)
    buffer.push(torch.tensor([1, 2]))
    empty = torch.empty(0, dtype=torch.int64)
    cache_scan(empty, empty.clone(), torch.empty(0, dtype=torch.uint8), *buffer.first_occurrence(), 2)
    iteration, position, rank, front = buffer.first_occurrence()
    with pytest.raises(ValueError, match="one entry per node"):
        cache_scan(torch.tensor([1]), torch.tensor([0]), torch.tensor([0], dtype=torch.uint8), iteration,
                   position[:5], rank, front, 2)


@pytest.mark.launches_no_kernel  # host bookkeeping only
def test_device_mirror_follows_the_index_through_pushes_and_pops():
    """What a CUDA cache reads: a copy refreshed per batch must equal the index after every step."""
    rng = np.random.default_rng(5)
    buffer = WindowBuffer(5, 400)
    mirrored = buffer.first_occurrence("cpu", mirror=True)  # created on an empty window
    for step, batch in enumerate(power_law_batches(rng, 400, 40, 50)):
        if buffer.full:
            buffer.pop()
        buffer.push(batch, rank=step % 2)
        if step % 7 == 3:
            buffer.pop()
        views = buffer.first_occurrence("cpu")
        mirrored = buffer.first_occurrence("cpu", mirror=True)
        assert mirrored[0] is not views[0], "the mirror is a copy, not the index's memory"
        for name, view, copy in zip(("iteration", "position", "rank"), views[:3], mirrored[:3]):
            assert torch.equal(view, copy), f"step {step}: first {name} differs"
        assert mirrored[3] == views[3]


@pytest.mark.launches_no_kernel
def test_first_occurrence_needs_an_index():
    with pytest.raises(ValueError, match="num_nodes"):
        WindowBuffer(3).first_occurrence()


@pytest.mark.parametrize("start,rebase_after", [(2**31 - 4, None), (0, 3)])
def test_triton_scan_equals_the_cpp_core_across_moves_of_the_base(start, rebase_after):
    """Iterations counted from a base that moves (past 2^31 and every few batches): both scans read
    the same int32 arrays and the same front and write the same records."""
    rng = np.random.default_rng(start + 7)
    num_nodes, lines, window = 300, 256, 5
    buffer = WindowBuffer(window, num_nodes, start_iteration=start, rebase_after=rebase_after)
    bases = set()
    for step, batch in enumerate(power_law_batches(rng, num_nodes, 12, 64)):
        if buffer.full:
            buffer.pop()
        buffer.push(batch, rank=step % 4)
        bases.add(buffer.index.iteration_base)
        tags, records, flags = cache_lines(rng, lines, num_nodes)
        native, twin = (records.clone(), flags.clone()), (records.clone(), flags.clone())
        first = buffer.first_occurrence("cpu")
        assert first[0].dtype == first[1].dtype == torch.int32
        _C.cache_scan(tags, *native, *first, window, 1)
        cache_scan(tags, *twin, *first, window)
        assert torch.equal(native[0], twin[0]) and torch.equal(native[1], twin[1]), f"step {step}"
        known = (tags >= 0) & (tags < num_nodes)
        assert torch.equal(native[0][known], buffer.index.next_records(tags[known], window)), f"step {step}"
    assert len(bases) > 1, "the base must have moved during the test"


@pytest.mark.launches_no_kernel  # host bookkeeping only
def test_device_mirror_follows_the_index_across_moves_of_the_base():
    rng = np.random.default_rng(8)
    buffer = WindowBuffer(4, 200, rebase_after=6)
    buffer.first_occurrence("cpu", mirror=True)
    for step, batch in enumerate(power_law_batches(rng, 200, 30, 40)):
        if buffer.full:
            buffer.pop()
        buffer.push(batch, rank=step % 3)
        views = buffer.first_occurrence("cpu")
        mirrored = buffer.first_occurrence("cpu", mirror=True)
        for name, view, copy in zip(("iteration", "position", "rank"), views[:3], mirrored[:3]):
            assert torch.equal(view, copy), f"step {step}: first {name} differs"
        assert mirrored[3] == views[3] == buffer.index.front_offset
    assert buffer.index.iteration_base > 0


@pytest.mark.launches_no_kernel  # refused before any launch
def test_scan_refuses_arrays_of_another_dtype():
    buffer = WindowBuffer(2, 10)
    iteration, position, rank, front = buffer.first_occurrence()
    tags = torch.tensor([1])
    with pytest.raises(TypeError, match="first_iteration must be torch.int32"):
        cache_scan(tags, torch.tensor([0]), torch.tensor([0], dtype=torch.uint8), iteration.long(), position, rank,
                   front, 2)
