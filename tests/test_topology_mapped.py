"""Samplers read a topology too large to preload where it is mapped: no copy, so a topology larger than memory
still samples (the page cache holds what is touched, and may drop it). One that fits is copied in once, on huge
pages, and samples the same hops."""
import re
import sys

import numpy as np
import pytest

from lsm_gnn.data import open_dataset
from lsm_gnn.loader import NodeLoader
from lsm_gnn.sampling import CSRGraph, NeighborSampler, OneTypeSampler
from lsm_gnn.storage import open_storage
from lsm_gnn.testing import write_tiny_dataset, write_tiny_hetero_dataset


def is_the_mapping(tensor, mapped: np.ndarray) -> bool:
    """The tensor's bytes are the memory map's own (same address, same length)."""
    assert isinstance(mapped, np.memmap)
    return tensor.data_ptr() == mapped.ctypes.data and tensor.numel() == mapped.size


def test_the_sampler_wraps_the_mapped_csr_without_copying(tmp_path):
    write_tiny_dataset(tmp_path / "ds", num_nodes=500)
    ds = open_dataset(tmp_path / "ds", check="fast")
    assert ds.indices.dtype == np.int32  # 32-bit neighbor ids while the node count allows
    sampler = NeighborSampler(ds, [3, 2], topology_access="random")  # what auto picks for one too large
    assert is_the_mapping(sampler.indptr, ds.indptr) and is_the_mapping(sampler.indices, ds.indices)
    loader = NodeLoader(ds, open_storage(ds, "memory"), [3, 2], batch_size=32, topology_access="random")
    assert is_the_mapping(loader.sampler.indptr, ds.indptr) and is_the_mapping(loader.sampler.indices, ds.indices)
    assert next(iter(loader)).x.shape[0] > 0


def test_the_hetero_sampler_wraps_every_relation_without_copying(tmp_path):
    ds = write_tiny_hetero_dataset(tmp_path / "h")
    sampler = NeighborSampler(ds, [3, 2], topology_access="random")
    for relation, csr in sampler._csr.items():
        indptr, indices = ds.csr(relation)
        assert is_the_mapping(csr.indptr, indptr) and is_the_mapping(csr.indices, indices), relation


@pytest.mark.parametrize("hetero", [False, True])
def test_a_preloaded_topology_is_a_copy_that_samples_the_same_hops(tmp_path, hetero):
    import torch

    if hetero:
        write_tiny_hetero_dataset(tmp_path / "ds")
    else:
        write_tiny_dataset(tmp_path / "ds", num_nodes=500)
    ds = open_dataset(tmp_path / "ds")
    mapped = NeighborSampler(ds, [3, 2], topology_access="random")
    loaded = NeighborSampler(ds, [3, 2], topology_access="preload")
    for relation, csr in loaded._csr.items():
        indptr, indices = ds.csr(relation)
        assert not is_the_mapping(csr.indptr, indptr) and not is_the_mapping(csr.indices, indices)
        assert np.array_equal(csr.indptr.numpy(), indptr) and np.array_equal(csr.indices.numpy(), indices)
        assert csr.indices.dtype == mapped._csr[relation].indices.dtype
    seeds = {ds.target: torch.arange(0, 40, 3)}
    for a, b in zip(mapped.sample(seeds, 5), loaded.sample(seeds, 5), strict=True):
        assert_same(a, b)


def assert_same(a, b):
    """Equal hops: every field equal, tensors (also inside dicts) exactly."""
    import dataclasses

    import torch

    for field in dataclasses.fields(a):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, dict):
            assert x.keys() == y.keys()
            pairs = [(x[k], y[k]) for k in x]
        else:
            pairs = [(x, y)]
        for u, v in pairs:
            assert torch.equal(u, v) if isinstance(u, torch.Tensor) else u == v, field.name


def auto_access_with_memory(tmp_path, monkeypatch):
    """``(access, size)``: ``access(available)`` is the topology access ``auto`` picks for a tiny dataset of
    ``size`` bytes of topology while the host reports ``available`` bytes of memory left (None: unknown);
    ``access(available, asked)`` what ``asked`` resolves to."""
    import lsm_gnn.defaults as defaults
    import lsm_gnn.utils.memcap as memcap
    from lsm_gnn.sampling.neighbor import topology_access_for

    monkeypatch.setattr(defaults, "AUTO_MIN_ROOM", 0)  # the floor of a tight cap has a test of its own
    write_tiny_dataset(tmp_path / "ds", num_nodes=300)
    ds = open_dataset(tmp_path / "ds")
    relations = [tuple(r) for r in ds.relations]
    size = sum(a.nbytes for a in ds.csr(relations[0]))

    def access(available: int | None, asked: str = "auto") -> str:
        monkeypatch.setattr(memcap, "available_memory", lambda: available)
        return topology_access_for(ds, relations, asked)

    return access, size


def test_auto_counts_one_preloaded_copy_per_rank_on_the_host(tmp_path, monkeypatch):
    access, size = auto_access_with_memory(tmp_path, monkeypatch)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert access(4 * size) == "random"  # two copies would take half the room
    assert access(8 * size) == "preload"


def test_inspect_summarizes_degrees_chunk_by_chunk(tmp_path):
    from lsm_gnn.cli import _degrees

    write_tiny_dataset(tmp_path / "ds", num_nodes=777, avg_degree=2)
    indptr = open_dataset(tmp_path / "ds").indptr
    degrees = np.diff(np.asarray(indptr))
    for chunk in (1, 10, 776, 1 << 22):
        summary = _degrees(indptr, chunk)
        assert summary["max"] == degrees.max() and summary["zero"] == (degrees == 0).sum() > 0
        assert abs(summary["mean"] - degrees.mean()) < 1e-12


def vm_flags(path) -> set[str]:
    """The VmFlags of this process's mappings of ``path`` (``rr``: the kernel's read-around is off)."""
    flags, inside = set(), False
    with open("/proc/self/smaps") as f:
        for line in f:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                inside = line.rstrip().endswith(str(path))
            elif inside and line.startswith("VmFlags:"):
                flags |= set(line.split()[1:])
    return flags


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_the_sampler_turns_read_around_off_on_the_mapped_csr_unless_asked(tmp_path):
    write_tiny_dataset(tmp_path / "ds", num_nodes=300)
    ds = open_dataset(tmp_path / "ds")
    files = [ds.file_path(ds.meta["graph"][k]) for k in ("indptr", "indices")]
    NeighborSampler(ds, [2], topology_access="normal")
    assert all("rr" not in vm_flags(f) for f in files)
    NeighborSampler(ds, [2], topology_access="random")
    assert all("rr" in vm_flags(f) for f in files)
    NeighborSampler(ds, [2])  # auto: a topology this small is preloaded, read-around on
    assert all("rr" not in vm_flags(f) for f in files)
    with pytest.raises(ValueError, match="topology_access must be one of auto, random, normal, preload"):
        NeighborSampler(ds, [2], topology_access="sequential")


def test_auto_preloads_only_a_topology_that_fits_a_quarter_of_the_memory_left(tmp_path, monkeypatch):
    access, size = auto_access_with_memory(tmp_path, monkeypatch)
    assert access(4 * size) == "preload"
    assert access(4 * size - 1) == "random"
    assert access(None) == "random"  # unknown: never preload
    assert access(None, "normal") == "normal"


def test_auto_preloads_nothing_under_a_tight_memory_cap(tmp_path, monkeypatch):
    """Below AUTO_MIN_ROOM of memory left the copy, which cannot be reclaimed as the mapped file's pages can, is
    not made however small it is (under a 400 MiB cap a 26 MiB copy left a run 15 MiB from an OOM kill)."""
    import lsm_gnn.defaults as defaults

    access, size = auto_access_with_memory(tmp_path, monkeypatch)
    monkeypatch.setattr(defaults, "AUTO_MIN_ROOM", 10 * size)
    assert access(10 * size - 1) == "random"
    assert access(10 * size) == "preload"


def test_row_lengths_read_in_parallel_still_name_the_first_bad_row():
    """Frontiers above 2,048 rows read their row lengths on several threads (parallel page faults on a
    mapped CSR); a corrupt row must still be reported, and the first one in frontier order."""
    from lsm_gnn.data.format import DatasetError

    n = 5000
    indptr = np.arange(n + 1, dtype=np.int64) * 2
    indptr[3001] = indptr[3000] - 1  # rows 3000 and 4000 end before they start
    indptr[4001] = indptr[4000] - 1
    raw = CSRGraph(indptr, np.zeros(2 * n, dtype=np.int32))
    for threads in (1, 2, 4):
        with pytest.raises(DatasetError, match=r"the row of node 3000 is .* not an ordered range"):
            OneTypeSampler(raw, [2], num_threads=threads).sample(np.arange(n))
