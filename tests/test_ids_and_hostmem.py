"""The base layer's id helpers, huge-page host buffers and row copies."""
import numpy as np
import pytest
import torch

from lsm_gnn.utils import hostmem
from lsm_gnn.utils.hostmem import host_zeros
from lsm_gnn.utils.ids import unique_ids


def _expect(ids: np.ndarray):
    unique, inverse = np.unique(ids, return_inverse=True)
    return unique, inverse.reshape(-1)


@pytest.mark.parametrize("case", ["empty", "one", "zeros", "all_distinct", "many_repeats", "huge_ids", "descending",
                                  "digit_edges"])
def test_unique_ids_equals_numpy(case):
    rng = np.random.default_rng(7)
    ids = {"empty": np.zeros(0, np.int64), "one": np.array([5]), "zeros": np.zeros(100, np.int64),
           "all_distinct": rng.permutation(70_000),
           "many_repeats": rng.integers(0, 50, 10_000),
           "huge_ids": rng.integers(0, 2**62, 5_000),  # six radix passes
           "descending": np.arange(10_000)[::-1].copy(),
           # ids that differ only in the bits of one radix digit boundary (2^11, 2^22, 2^33)
           "digit_edges": np.array([2**11 - 1, 2**11, 2**22 - 1, 2**22, 2**33 - 1, 2**33, 0, 2**11] * 3)}[case]
    unique, inverse = unique_ids(torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)))
    want_unique, want_inverse = _expect(ids.astype(np.int64))
    assert unique.dtype == inverse.dtype == torch.int64
    np.testing.assert_array_equal(unique.numpy(), want_unique)
    np.testing.assert_array_equal(inverse.numpy(), want_inverse)


def test_unique_ids_keeps_negative_ids_first_for_the_range_checks():
    ids = torch.tensor([3, -7, 3, 9, -1])
    unique, inverse = unique_ids(ids)
    assert unique.tolist() == [-7, -1, 3, 9]
    assert inverse.tolist() == [2, 0, 2, 3, 1]


def test_unique_ids_of_a_strided_view():
    base = torch.arange(20)
    unique, inverse = unique_ids(base[::3])
    assert unique.tolist() == list(range(0, 20, 3))
    assert torch.equal(unique[inverse], base[::3])


@pytest.mark.parametrize("shape,dtype", [((3, 5), torch.float32), ((1 << 20, 3), torch.float16),
                                         ((600, 1024), torch.uint8), ((0, 4), torch.float32)])
def test_host_zeros_behaves_like_torch_zeros(shape, dtype):
    t = host_zeros(shape, dtype)
    assert tuple(t.shape) == shape and t.dtype == dtype and t.is_contiguous() and t.device.type == "cpu"
    assert not bool(t.any())
    t.view(-1)[-1:] = 1  # writable to the last byte
    assert int(t.sum()) == (1 if t.numel() else 0)


def test_host_zeros_outlives_its_map_object():
    rows = host_zeros((1024, 1024), torch.float32)[100:]  # a view: the map must stay alive through it
    import gc

    gc.collect()
    rows.fill_(2.0)
    assert float(rows.sum()) == 2.0 * 924 * 1024


def test_host_zeros_gets_huge_pages_where_the_kernel_allows(tmp_path):
    try:
        mode = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        pytest.skip("no transparent huge pages on this platform")
    if "[never]" in mode:
        pytest.skip(f"transparent huge pages are off here ({mode.strip()})")
    before = _anon_huge_kib()
    table = host_zeros((64 << 20) // 4, torch.float32)  # 64 MiB
    table.fill_(1.0)  # fault it in
    grown = _anon_huge_kib() - before
    assert grown >= 2 << 10, f"no huge page in a 64 MiB buffer advised MADV_HUGEPAGE ({grown} KiB)"
    del table


def _anon_huge_kib() -> int:
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    pytest.skip("no AnonHugePages in /proc/self/smaps_rollup")


def test_small_buffers_are_plain_tensors(monkeypatch):
    calls = []
    monkeypatch.setattr(hostmem.mmap, "mmap", lambda *a, **k: calls.append(a))
    host_zeros((4, 4), torch.float32)
    assert calls == []


def test_a_pool_hands_a_map_out_again_only_once_no_view_or_array_of_it_is_left():
    pool = hostmem.HostBufferPool(keep=2)
    shape = ((4 << 20) // 4096, 1024)  # 4 MiB of float32
    first = pool.empty(shape, torch.float32)
    first.fill_(1.0)
    kept_view, kept_array = first[10:20], first[:5].numpy()
    address = first.data_ptr()
    del first
    second = pool.empty(shape, torch.float32)  # the first map is still in use, through a view and an array
    assert second.data_ptr() != address and not np.shares_memory(second.numpy(), kept_array)
    del kept_view
    assert pool.empty(shape, torch.float32).data_ptr() != address  # the array still holds it
    del kept_array
    smaller = pool.empty((shape[0] // 2, shape[1]), torch.float32)
    assert smaller.data_ptr() == address and tuple(smaller.shape) == (shape[0] // 2, shape[1])
    assert smaller.is_contiguous() and smaller.dtype == torch.float32
    smaller.fill_(3.0)  # writable to its last byte
    assert float(smaller[-1, -1]) == 3.0


def test_a_pool_keeps_at_most_its_maps_and_replaces_a_free_one_too_small():
    pool = hostmem.HostBufferPool(keep=2)
    small, held = pool.empty((4 << 20,), torch.uint8), pool.empty((4 << 20,), torch.uint8)
    extra = pool.empty((4 << 20,), torch.uint8)  # past keep: allocated, not kept
    assert len(pool._maps) == 2
    del small, extra
    big = pool.empty((16 << 20,), torch.uint8)  # the free small map makes way for a big one
    assert len(pool._maps) == 2 and max(len(m) for m in pool._maps) >= 16 << 20
    address = big.data_ptr()
    del big
    assert pool.empty((12 << 20,), torch.uint8).data_ptr() == address
    assert pool.empty((3,), torch.uint8).numel() == 3 and len(pool._maps) == 2  # small: a plain tensor
    del held


def test_copy_rows_gathers_and_scatters_rows_in_one_copy_and_refuses_bad_rows():
    from lsm_gnn import _C

    rng = np.random.default_rng(1)
    src = torch.from_numpy(rng.integers(0, 256, (50, 24), dtype=np.uint8))
    dst = torch.zeros((40, 24), dtype=torch.uint8)
    to = torch.from_numpy(rng.permutation(40)[:30])
    frm = torch.from_numpy(rng.integers(0, 50, 30))  # repeats allowed in the sources
    _C.copy_rows(dst, to, src, frm)
    want = torch.zeros_like(dst)
    want[to] = src[frm]
    assert torch.equal(dst, want)
    with pytest.raises(IndexError, match="row 50 of 50"):
        _C.copy_rows(dst, torch.tensor([0]), src, torch.tensor([50]))
    with pytest.raises(IndexError, match="to row -1 of 40"):
        _C.copy_rows(dst, torch.tensor([-1]), src, torch.tensor([0]))
    with pytest.raises(ValueError, match="same row_bytes"):
        _C.copy_rows(torch.zeros((4, 8), dtype=torch.uint8), torch.tensor([0]), src, torch.tensor([0]))
    with pytest.raises(ValueError, match="one source row per destination"):
        _C.copy_rows(dst, torch.tensor([0, 1]), src, torch.tensor([0]))
