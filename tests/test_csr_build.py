"""The bucketed CSR builder gives, byte for byte, the CSR that sorting every edge at once gives."""
import io
import os

import numpy as np
import pytest

import lsm_gnn.data.csr_build as csr_build
from lsm_gnn.data.csr_build import NpyAppender, build_csr_files, npy_header


def oracle(chunks, num_rows, undirected, dedup, self_loops):
    """indptr and indices from all edges at once: rows in order, each row sorted and unique (dedup) or in
    arrival order."""
    src = np.concatenate([np.asarray(s, np.int64) for s, _ in chunks])
    dst = np.concatenate([np.asarray(d, np.int64) for _, d in chunks])
    if not self_loops:
        src, dst = src[src != dst], dst[src != dst]
    if undirected:  # the builder adds each chunk's reverses after that chunk, so build per chunk
        parts = [(np.asarray(s, np.int64), np.asarray(d, np.int64)) for s, d in chunks]
        if not self_loops:
            parts = [(s[s != d], d[s != d]) for s, d in parts]
        src = np.concatenate([np.concatenate([s, d]) for s, d in parts])
        dst = np.concatenate([np.concatenate([d, s]) for s, d in parts])
    if dedup:
        pairs = np.unique(np.stack([dst, src], axis=1), axis=0)  # sorted by (row, neighbor)
        dst, src = pairs[:, 0], pairs[:, 1]
    else:
        order = np.argsort(dst, kind="stable")
        dst, src = dst[order], src[order]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=num_rows))])
    return indptr, src


def saved_bytes(array, dtype):
    out = io.BytesIO()
    np.save(out, np.asarray(array, dtype=dtype))
    return out.getvalue()


def read(path):
    with open(path, "rb") as f:
        return f.read()


def edge_chunks(rng, num_rows, num_cols, sizes, hub=None):
    chunks = []
    for size in sizes:
        src, dst = rng.integers(0, num_cols, size), rng.integers(0, num_rows, size)
        if hub is not None:  # a quarter of the edges end in one row, larger than any bucket
            dst[: size // 4] = hub
        chunks.append((src, dst))
    return chunks


@pytest.mark.parametrize("dedup", [True, False])
@pytest.mark.parametrize("undirected", [True, False])
@pytest.mark.parametrize("self_loops", [True, False])
@pytest.mark.parametrize("small_buckets", [True, False])
def test_the_files_are_those_of_sorting_every_edge_at_once(tmp_path, monkeypatch, dedup, undirected, self_loops,
                                                           small_buckets):
    if small_buckets:  # many buckets, each read in row groups, and a hub row larger than a group
        monkeypatch.setattr(csr_build, "BUCKET_EDGES", 300)
        monkeypatch.setattr(csr_build, "MAX_BUCKETS", 7)
        monkeypatch.setattr(csr_build, "EDGE_CHUNK", 128)
    rng = np.random.default_rng(3)
    n = 501
    chunks = edge_chunks(rng, n, n, [2000, 0, 1500, 7], hub=17)
    num_edges = build_csr_files(str(tmp_path), "x_", chunks, n, n, undirected=undirected, dedup=dedup,
                                self_loops=self_loops, expected_edges=3507)
    indptr, indices = oracle(chunks, n, undirected, dedup, self_loops)
    assert num_edges == indices.size
    assert read(tmp_path / "x_indptr.npy") == saved_bytes(indptr, np.int64)
    assert read(tmp_path / "x_indices.npy") == saved_bytes(indices, np.int32)
    assert sorted(os.listdir(tmp_path)) == ["x_indices.npy", "x_indptr.npy"]  # the buckets are gone


@pytest.mark.parametrize("expected", [None, 1, 10**9])
def test_rectangular_csr_and_any_bucket_guess(tmp_path, monkeypatch, expected):
    monkeypatch.setattr(csr_build, "BUCKET_EDGES", 256)
    rng = np.random.default_rng(4)
    chunks = edge_chunks(rng, 90, 1000, [999, 1001])
    build_csr_files(str(tmp_path), "", chunks, 90, 1000, expected_edges=expected)
    indptr, indices = oracle(chunks, 90, False, True, True)
    assert np.array_equal(np.load(tmp_path / "indptr.npy"), indptr)
    assert np.array_equal(np.load(tmp_path / "indices.npy"), indices)


def test_no_edges_give_an_empty_csr(tmp_path):
    assert build_csr_files(str(tmp_path), "", [(np.array([2]), np.array([2]))], 5, 5, self_loops=False) == 0
    assert np.array_equal(np.load(tmp_path / "indptr.npy"), np.zeros(6, np.int64))
    assert np.load(tmp_path / "indices.npy").shape == (0,)


def test_ids_out_of_range_are_refused_by_side(tmp_path):
    with pytest.raises(ValueError, match=r"edge destination 7 is outside \[0, 5\)"):
        build_csr_files(str(tmp_path), "", [(np.array([1]), np.array([7]))], 5, 5)
    with pytest.raises(ValueError, match="undirected edges need"):
        build_csr_files(str(tmp_path), "", [], 5, 6, undirected=True)


@pytest.mark.parametrize("length", [0, 1, 10**6, 2**31, 2**62])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32])
def test_npy_header_is_the_one_np_save_writes_and_one_size_for_every_length(length, dtype):
    header = npy_header(dtype, length)
    assert len(header) == len(npy_header(dtype, 0))
    if length < 100:
        assert saved_bytes(np.zeros(length, dtype), dtype)[:len(header)] == header


def test_appender_writes_a_loadable_npy(tmp_path):
    out = NpyAppender(str(tmp_path / "a.npy"), np.int32)
    for part in (np.arange(5), np.arange(0), np.arange(7, 10)):
        out.append(part)
    assert out.finish() == 8
    assert read(tmp_path / "a.npy") == saved_bytes(np.r_[np.arange(5), np.arange(7, 10)], np.int32)
