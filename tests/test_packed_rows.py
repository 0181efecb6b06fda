"""Packed small rows: several rows per aligned 512-byte block, read byte-exact by every path.

Every feature dtype and a dense sweep of row sizes from 1 byte to past 1 KiB
(every power-of-two boundary and its neighbours) is written, then read back on
every backend, O_DIRECT and buffered, through the software cache and by plain
file reads, and compared with the bytes written: random bytes, so a row read
from the wrong offset, a neighbour's bytes or padding can never pass.
"""
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lsm_gnn import DatasetWriter, _C, open_dataset, open_storage
from lsm_gnn.cache import SoftwareCache
from lsm_gnn.data.format import DatasetError, read_rows_direct, row_stride_for, row_stride_problem
from lsm_gnn.testing import edit_meta

BLOCK = 512
NATIVE = ["io_uring", "pread", "mmap"] if _C.io_uring_available() else ["pread", "mmap"]
NUM_ROWS = 517  # prime: the last block is partly filled for every packed stride


def powers_and_neighbours(limit):
    """Every power of two up to ``limit`` and its neighbours, from 1."""
    sizes = set()
    for p in (1 << k for k in range(limit.bit_length())):
        sizes.update({p - 1, p, p + 1})
    return {s for s in sizes if 1 <= s <= limit}


# (dtype, dim) pairs. Quick: every stride class (4 B to 512 B, 1024 B, 1536 B) with rows at, just under and just
# over a power of two, including 508/512/516/1020/1024/1028-byte rows. Slow: float32 dims 1..130, float16 dims
# 2..300 sampled densely, int8 up to 1100 dims, every power of two of items +-1.
QUICK_SIZES = sorted(
    {("float32", d) for d in (1, 3, 16, 17, 33, 65, 127, 128, 129)}
    | {("float16", d) for d in (2, 127, 128, 129, 192)}
    | {("int8", d) for d in (5, 255, 257)}
    | {("uint8", d) for d in (1020, 1024, 1028, 1100)})
SLOW_SIZES = sorted(
    ({("float32", d) for d in range(1, 131)}
     | {("float16", d) for d in range(2, 301, 3)} | {("float16", d) for d in powers_and_neighbours(300)}
     | {("int8", d) for d in range(4, 1101, 37)} | {("int8", d) for d in powers_and_neighbours(1100)}
     | {("uint8", d) for d in (508, 512, 516, 1020, 1024, 1028)}) - set(QUICK_SIZES))


def write_random_dataset(path, num_rows, dtype, dim, row_alignment=None, seed=0):
    """A dataset whose feature rows are random bytes; returns it opened and the rows as a uint8 array."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (num_rows, dim * np.dtype(dtype).itemsize), dtype=np.uint8)
    with DatasetWriter(path, num_nodes=num_rows, feature_dim=dim, feature_dtype=dtype,
                       row_alignment=row_alignment) as writer:
        for start in range(0, num_rows, 200):
            writer.write_features(raw[start:start + 200].view(dtype))
        writer.write_csr(np.zeros(num_rows + 1, dtype=np.int64), np.empty(0, dtype=np.int64))
        dataset = writer.commit()
    return dataset, raw


def batches(num_rows, stride, seed):
    """Random and adversarial id batches for a file of ``num_rows`` rows at ``stride``."""
    per_block = max(1, BLOCK // stride)
    last_block = (num_rows - 1) // per_block * per_block
    rng = np.random.default_rng(seed)
    yield "random_with_duplicates", rng.integers(0, num_rows, 150)
    yield "one_block_every_row", np.arange(min(per_block, num_rows))[::-1]
    yield "one_block_scattered", np.array([per_block - 1, 0, per_block // 2, 0]) % num_rows
    yield "last_row", np.array([num_rows - 1])
    yield "first_and_last_block", np.concatenate([np.arange(per_block), np.arange(last_block, num_rows)]) % num_rows
    yield "every_third_row", np.arange(0, num_rows, 3)
    yield "every_other_block", np.concatenate([np.arange(b, min(b + per_block, num_rows))
                                               for b in range(0, num_rows, 2 * per_block)])
    yield "whole_file_shuffled", rng.permutation(num_rows)
    yield "all_same", np.full(50, num_rows // 2)


def read_options():
    """(name, backend, open_storage options): O_DIRECT and buffered, short requests, a shallow queue."""
    yield "memory", "memory", {}
    for backend in NATIVE:
        for direct in ([True, False] if backend != "mmap" else [False]):
            kind = "" if direct else "-buffered"
            yield f"{backend}{kind}", backend, {"direct": direct}
            yield f"{backend}{kind}-short", backend, {"direct": direct, "max_request_bytes": 1024, "queue_depth": 2}


# O_DIRECT reads wait for the device (milliseconds each on a busy shared disk): the quick sweep sends it one
# random batch (runs of one and several blocks, duplicates, skips inside aligned reads), the slow sweep every
# case. Buffered, mmap and memory readers get every case in both sweeps; the plan tests below cover the rest.
QUICK_DIRECT_CASES = ("random_with_duplicates",)


def check_every_read_path(dataset, raw, seed=0, direct_cases=None):
    stride = dataset.features.row_stride
    for name, backend, options in read_options():
        with open_storage(dataset, backend, **options) as storage:
            direct = getattr(storage, "direct", False)
            for case, ids in batches(dataset.num_nodes, stride, seed):
                if direct and direct_cases is not None and case not in direct_cases:
                    continue
                got = storage.read(torch.from_numpy(ids.copy())).view(torch.uint8).numpy()
                assert np.array_equal(got, raw[ids]), f"{name}, {case}, row stride {stride}"


@pytest.mark.parametrize("dtype,dim", QUICK_SIZES)
def test_every_backend_reads_the_bytes_written(tmp_path, dtype, dim):
    dataset, raw = write_random_dataset(tmp_path / "ds", NUM_ROWS, dtype, dim, seed=dim)
    assert dataset.features.row_stride == row_stride_for(raw.shape[1])
    check_every_read_path(dataset, raw, seed=dim, direct_cases=QUICK_DIRECT_CASES)


@pytest.mark.slow
@pytest.mark.parametrize("dtype,dim", SLOW_SIZES)
def test_every_backend_reads_the_bytes_written_dense_sweep(tmp_path, dtype, dim):
    dataset, raw = write_random_dataset(tmp_path / "ds", NUM_ROWS, dtype, dim, seed=dim)
    check_every_read_path(dataset, raw, seed=dim)


@pytest.mark.parametrize("row_bytes", [4, 60, 256, 300, 512, 1028])
def test_file_holds_rows_at_their_stride_zero_padded(tmp_path, row_bytes):
    dataset, raw = write_random_dataset(tmp_path / "ds", NUM_ROWS, "uint8", row_bytes)
    stride = dataset.features.row_stride
    data = np.fromfile(dataset.feature_path, dtype=np.uint8)
    assert data.size == dataset.features.file_bytes and data.size % 4096 == 0
    rows = data[:NUM_ROWS * stride].reshape(NUM_ROWS, stride)
    assert np.array_equal(rows[:, :row_bytes], raw)
    assert not rows[:, row_bytes:].any() and not data[NUM_ROWS * stride:].any()


@pytest.mark.parametrize("row_bytes,stride", [
    (1, 1), (4, 4), (5, 8), (52, 64), (64, 64), (65, 128), (256, 256), (257, 512), (384, 512), (508, 512),
    (512, 512), (516, 1024), (1020, 1024), (1024, 1024), (1028, 1536)])
def test_packed_stride_is_the_next_power_of_two_below_512_else_a_multiple_of_512(row_bytes, stride):
    assert row_stride_for(row_bytes) == stride
    assert row_stride_problem(row_bytes, stride) is None
    assert BLOCK % stride == 0 or stride % BLOCK == 0  # a row never straddles a block


def test_explicit_alignment_pads_every_row_as_before_packing():
    assert row_stride_for(4, 512) == 512 and row_stride_for(516, 512) == 1024 and row_stride_for(60, 4096) == 4096
    with pytest.raises(ValueError, match="multiple of 512"):
        row_stride_for(60, 256)


@pytest.mark.parametrize("row_bytes,stride,problem", [
    (40, 32, "smaller than row_bytes"), (40, 48, "neither a multiple of 512 nor a power of two"),
    (40, 500, "straddle"), (600, 768, "neither"), (4, 3, "smaller")])
def test_invalid_strides_are_named(row_bytes, stride, problem):
    assert problem in row_stride_problem(row_bytes, stride)


@pytest.mark.parametrize("stride,accepted", [(48, False), (96, False), (32, False), (64, True), (128, True),
                                             (512, True), (1024, True), (1000, False)])
def test_open_accepts_exactly_the_valid_strides(tmp_path, stride, accepted):
    dataset, _ = write_random_dataset(tmp_path / "ds", 64, "float32", 10)  # 40-byte rows, packed at 64

    def change(meta):
        meta["features"]["row_stride"] = stride
        meta["features"]["file_bytes"] = -(-64 * stride // 4096) * 4096

    edit_meta(dataset, change)
    if accepted:  # a valid layout: only the file's size, written for stride 64, can be wrong
        if stride != 64:
            with pytest.raises(DatasetError, match="feature file"):
                open_dataset(dataset.path)
        else:
            open_dataset(dataset.path)
    else:
        with pytest.raises(DatasetError, match=f"row_stride={stride}.*re-create the dataset"):
            open_dataset(dataset.path)


@pytest.mark.parametrize("dtype,dim", [("float32", 13), ("float16", 128), ("int8", 4), ("uint8", 600)])
def test_unpacked_datasets_still_open_and_read(tmp_path, dtype, dim):
    # row_alignment=512 writes the layout of every dataset made before packing: one row per 512-byte multiple.
    dataset, raw = write_random_dataset(tmp_path / "ds", NUM_ROWS, dtype, dim, row_alignment=512)
    assert dataset.features.row_stride % BLOCK == 0
    check_every_read_path(open_dataset(dataset.path), raw, direct_cases=QUICK_DIRECT_CASES)


def test_read_rows_direct_and_the_software_cache_return_the_bytes_written(tmp_path):
    for dtype, dim in [("float16", 128), ("float32", 1), ("int8", 100), ("uint8", 1028)]:
        dataset, raw = write_random_dataset(tmp_path / f"{dtype}-{dim}", NUM_ROWS, dtype, dim)
        ids = np.random.default_rng(dim).integers(0, NUM_ROWS, 400)
        direct = read_rows_direct(dataset.feature_path, dataset.features, NUM_ROWS, ids)
        assert np.array_equal(direct.view(np.uint8), raw[ids])
        for backend in NATIVE[:1] + ["memory"]:
            with open_storage(dataset, backend, **({} if backend == "memory" else {"direct": False})) as storage:
                cache = SoftwareCache(storage, num_sets=16, ways=8)  # 128 lines for 517 rows: misses every batch
                for step in range(4):
                    batch = np.concatenate([ids[step * 100:(step + 1) * 100], [NUM_ROWS - 1, 0]])
                    rows, _ = cache.lookup(torch.from_numpy(batch))
                    assert np.array_equal(rows.view(torch.uint8).numpy(), raw[batch]), (dtype, dim, backend, step)


# -- the read plan: which bytes the storage engine asks for ------------------------------------------------------

def plan(ids, row_bytes, stride, num_rows=4096, alignment=BLOCK, max_request=128 << 10):
    file_bytes = -(-num_rows * stride // 4096) * 4096
    return _C.plan_reads(torch.tensor(ids, dtype=torch.int64), num_rows, row_bytes, stride, file_bytes, alignment,
                         max_request)


def reads(p):
    return list(zip(p["file_offset"].tolist(), p["length"].tolist()))


def test_rows_of_one_block_cost_one_read_of_that_block():
    # 256-byte rows (128 x float16): two per block; 64-byte rows: eight.
    assert reads(plan([7, 6], 256, 256)) == [(3 * 512, 512)]
    p = plan([17, 23, 20, 17], 60, 64)  # block 2 holds rows 16..23
    assert reads(p) == [(1024, 512)] and p["bytes_read"] == 512 and p["unique_rows"] == 3
    assert p["num_rows"].tolist() == [3]


def test_rows_in_adjacent_blocks_share_a_read_rows_further_apart_do_not():
    assert reads(plan([1, 9], 60, 64)) == [(0, 1024)]                 # blocks 0 and 1
    assert reads(plan([1, 17], 60, 64)) == [(0, 512), (1024, 512)]    # a whole block between: two reads
    assert reads(plan([1, 2, 3], 4, 4)) == [(0, 512)]
    # Unpacked 512-byte rows coalesce only when consecutive, as before packing.
    assert reads(plan([4, 5, 7], 300, 512)) == [(2048, 1024), (3584, 512)]


def test_no_block_is_read_twice_with_a_coarser_device_alignment():
    # O_DIRECT on a 4 KiB device: rows 0 and 7 of 512-byte stride share a 4 KiB block, so one read serves both.
    assert reads(plan([0, 7], 512, 512, alignment=4096)) == [(0, 4096)]
    assert reads(plan([0, 7, 9], 100, 128, alignment=4096)) == [(0, 4096)]


def test_buffered_reads_ask_only_for_the_rows_span():
    # alignment 1 (no O_DIRECT): rows of one block merge, the read stops at the last row's end.
    assert reads(plan([2, 5], 60, 64, alignment=1)) == [(128, 5 * 64 + 60 - 128)]
    assert reads(plan([0, 1], 300, 512, alignment=1)) == [(0, 812)]
    assert reads(plan([0, 2], 300, 512, alignment=1)) == [(0, 300), (1024, 300)]


def test_runs_are_cut_at_max_request_bytes():
    p = plan(list(range(64)), 60, 64, max_request=1024)  # 64 rows in 8 blocks: four reads of two blocks
    assert reads(p) == [(i * 1024, 1024) for i in range(4)]
    assert reads(plan([0, 1], 600, 1024, max_request=512)) == [(0, 1024), (1024, 1024)]  # one row may be longer


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(0, 299), min_size=1, max_size=120), row_bytes=st.integers(1, 1100),
       pad=st.sampled_from([None, 512, 4096, "any"]), alignment=st.sampled_from([1, 512, 4096]),
       max_request=st.sampled_from([0, 512, 1000, 4096, 65536]), extra=st.integers(0, 300))
def test_property_plan_covers_every_row_once_within_the_staging_bound(ids, row_bytes, pad, alignment, max_request,
                                                                      extra):
    # Any stride the native layer accepts, not only the format's: the plan must stay right for every layout.
    stride = row_bytes + extra if pad == "any" else row_stride_for(row_bytes, pad)
    num_rows = 300
    p = plan(ids, row_bytes, stride, num_rows, alignment, max_request)
    offsets, lengths, counts = p["file_offset"].tolist(), p["length"].tolist(), p["num_rows"].tolist()
    file_end = -(-num_rows * stride // 4096) * 4096
    assert p["bytes_read"] == sum(lengths) and p["unique_rows"] == len(set(ids)) == sum(counts)
    rows = sorted(set(ids))
    for k, (off, length) in enumerate(zip(offsets, lengths)):  # run k serves the next counts[k] distinct rows
        assert off % alignment == 0 and length % alignment == 0 and 0 < length <= p["max_run_bytes"]
        assert off + length <= -(-file_end // alignment) * alignment
        served = rows[sum(counts[:k]):sum(counts[:k + 1])]
        assert all(off <= r * stride and r * stride + row_bytes <= off + length for r in served)
        first_span = -(-(served[0] * stride + row_bytes) // alignment) * alignment - off
        assert length <= max(max_request, first_span)  # longer than a request only to finish the first row's unit
    assert offsets == sorted(offsets)
    if stride % alignment == 0 or alignment % stride == 0:  # no row straddles an aligned unit: no unit read twice
        assert all(a + la <= b for (a, la), b in zip(zip(offsets, lengths), offsets[1:]))


def test_reader_counters_show_one_block_read_for_rows_sharing_it(tmp_path):
    dataset, raw = write_random_dataset(tmp_path / "ds", NUM_ROWS, "float16", 128)  # 256-byte rows, 2 per block
    for backend in NATIVE[:2]:
        with open_storage(dataset, backend) as storage:
            if not storage.direct or storage._reader.alignment != BLOCK:
                pytest.skip(f"needs O_DIRECT with 512-byte alignment here, got alignment {storage._reader.alignment}")
            assert np.array_equal(storage.read([41, 40, 41]).view(torch.uint8).numpy(), raw[[41, 40, 41]])
            stats = storage.stats()
            assert (stats.requests, stats.bytes_read, stats.bytes_useful) == (1, 512, 512)
            assert stats.amplification == 1.0


def test_truncated_packed_file_is_caught(tmp_path):
    dataset, _ = write_random_dataset(tmp_path / "ds", NUM_ROWS, "float32", 5)  # 20-byte rows at stride 32
    os.truncate(dataset.feature_path, 32 * (NUM_ROWS - 1))
    for backend in NATIVE:
        with pytest.raises(RuntimeError, match="truncated"):
            open_storage(dataset, backend)


@pytest.mark.parametrize("row_alignment,strides", [(None, {"a": 8, "b": 1024}), (512, {"a": 512, "b": 1024})])
def test_heterogeneous_datasets_pack_each_type_and_read_back(tmp_path, row_alignment, strides):
    from lsm_gnn.data.hetero_writer import HeteroDatasetWriter

    rng = np.random.default_rng(3)
    raw = {"a": rng.integers(0, 256, (300, 6), dtype=np.uint8), "b": rng.integers(0, 256, (40, 1000), dtype=np.uint8)}
    dtypes = {"a": "float16", "b": "uint8"}
    types = {t: {"num_nodes": len(r), "feature_dim": r.shape[1] // np.dtype(dtypes[t]).itemsize,
                 "feature_dtype": dtypes[t]} for t, r in raw.items()}
    with HeteroDatasetWriter(tmp_path / "h", node_types=types, row_alignment=row_alignment) as writer:
        for t, r in raw.items():
            writer.write_features(t, r.view(dtypes[t]))
        writer.write_csr(("a", "to", "b"), np.zeros(41, dtype=np.int64), np.empty(0, dtype=np.int64))
        dataset = writer.commit()
    for t, r in raw.items():
        part = dataset.node_type(t)
        assert part.features.row_stride == strides[t]
        for backend in NATIVE + ["memory"]:
            with open_storage(part, backend) as storage:
                ids = rng.integers(0, len(r), 100)
                assert np.array_equal(storage.read(ids).view(torch.uint8).numpy(), r[ids]), (t, backend)
