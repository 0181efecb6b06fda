"""The Triton PVP enqueue decides and copies exactly as the C++ core, run by Triton's interpreter."""
import os

import numpy as np
import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are defined: before their import
pytest.importorskip("triton")

from lsm_gnn import _C  # noqa: E402
from lsm_gnn.cache import VictimBuffer  # noqa: E402
from lsm_gnn.kernels.layout import INVALID_TAG, NO_REUSE, pack_record  # noqa: E402
from lsm_gnn.kernels.victim_enqueue import victim_enqueue  # noqa: E402


def signed(record: int) -> int:
    return record - (1 << 64) if record >= 1 << 63 else record


def victims(rng, n, lines, iteration, scan_base, window):
    """Assign outputs of one batch: some entries evict nothing, reuses inside, beyond and before the window."""
    tags = rng.integers(0, 10_000, n)
    tags[rng.random(n) < 0.2] = INVALID_TAG
    reuse = iteration - scan_base + rng.integers(-2, window + 3, n)
    records = [signed(pack_record(NO_REUSE if (r <= 0 or rng.random() < 0.15) else int(r), int(rng.integers(0, 4)),
                                  int(rng.integers(0, 1 << 30)))) for r in reuse]
    line = rng.integers(0, lines, n)
    line[tags == INVALID_TAG] = -1
    return (torch.from_numpy(tags), torch.tensor(records, dtype=torch.int64), torch.from_numpy(line))


@pytest.mark.parametrize("window,capacity,batch,dim", [(4, 3, 40, 5), (8, 16, 60, 128), (2, 1, 25, 3)])
def test_triton_enqueue_equals_the_cpp_core(window, capacity, batch, dim):
    rng = np.random.default_rng(window * 7 + capacity)
    native = VictimBuffer(window, capacity, dim, torch.float32)
    twin = VictimBuffer(window, capacity, dim, torch.float32)
    for buffer in (native, twin):  # the same starting garbage in unclaimed slots, so whole tensors compare
        buffer.node.zero_(), buffer.record.zero_(), buffer.data.zero_()
    cache_data = torch.from_numpy(rng.standard_normal((200, dim)).astype(np.float32))
    scan_base = 0
    totals = np.zeros(3, dtype=np.int64)
    for t in range(10):
        if t % 2 == 0:
            scan_base = t
        tag, record, line = victims(rng, batch, cache_data.shape[0], t, scan_base, window)
        expected = _C.victim_enqueue(native.count, native.queue_iteration, native.node, native.record, native.data,
                                     tag, record, line, cache_data, t, scan_base, 1)
        before = twin.tallies.clone()
        victim_enqueue(twin.count, twin.queue_iteration, twin.node, twin.record, twin.data, tag, record, line,
                       cache_data, t, scan_base, twin.tallies, check=t % 2 == 0)
        assert (twin.tallies - before).tolist() == list(expected), f"iteration {t}: outcomes differ"
        for name in ("count", "node", "record", "data"):
            assert torch.equal(getattr(native, name), getattr(twin, name)), f"iteration {t}: {name} differs"
        totals += expected
        for buffer in (native, twin):  # the queue of this iteration is served: both recycle it alike
            buffer.prefetch(t + 1)
    assert (totals > 0).all(), f"every outcome must occur (enqueued, no reuse, full): {totals}"


@pytest.mark.launches_no_kernel  # refused or empty: no launch
def test_bad_lines_and_empty_batches():
    buffer = VictimBuffer(2, 4, 3, torch.float32)
    data = torch.zeros(10, 3)
    empty = torch.empty(0, dtype=torch.int64)
    victim_enqueue(buffer.count, buffer.queue_iteration, buffer.node, buffer.record, buffer.data, empty, empty,
                   empty, data, 0, 0, buffer.tallies)
    assert buffer.tallies.tolist() == [0, 0, 0]
    one = torch.tensor([5])
    with pytest.raises(ValueError, match="outside the cache"):
        victim_enqueue(buffer.count, buffer.queue_iteration, buffer.node, buffer.record, buffer.data, one,
                       torch.tensor([signed(pack_record(1, 0, 0))]), torch.tensor([10]), data, 0, 0, buffer.tallies)


@pytest.mark.launches_no_kernel  # refused before any launch
@pytest.mark.parametrize("mode", ["native", "triton"])
@pytest.mark.parametrize("tallies", [torch.zeros(2, dtype=torch.int64), torch.zeros(3, dtype=torch.int32)],
                         ids=["two counters", "int32"])
def test_tallies_that_cannot_take_the_outcomes_are_refused(mode, tallies):
    from lsm_gnn.kernels import using

    buffer = VictimBuffer(2, 4, 3, torch.float32)
    one = torch.tensor([5])
    with using(mode), pytest.raises(ValueError, match="tallies must be an int64 tensor of 3 counters"):
        torch.ops.lsm_gnn.victim_enqueue(buffer.count, buffer.queue_iteration, buffer.node, buffer.record,
                                         buffer.data, one, torch.tensor([signed(pack_record(1, 0, 0))]),
                                         torch.tensor([0]), torch.zeros(10, 3), 0, 0, tallies, 1)
