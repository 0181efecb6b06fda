"""Node ids as the one tensor type every layer takes: the base of the dependence chain.

Data, storage, cache, communication and loader all accept ids as a tensor,
array or list; they normalize them here so the checks (integers only, no
silent wrap of huge unsigned ids) are the same everywhere.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

_EXACT_ID_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)  # convert to int64 losslessly
_INT64_MAX = np.iinfo(np.int64).max


def read_only_tensor(array: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy`` of an array that may be a read-only memory map, which torch then warns about once
    per process (on stderr, where a command's one error line must stand alone). Its callers only read it; the
    copy torch suggests would double the memory."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def as_id_tensor(ids, device="cpu") -> torch.Tensor:
    """ids as a contiguous 1-D int64 tensor on ``device`` (from a tensor, array or list).

    Every integer dtype and byte order is accepted. Non-integers raise a
    TypeError naming the dtype; unsigned ids too large for int64 (which no
    dataset can hold) raise an IndexError naming the id instead of wrapping.
    """
    if isinstance(ids, torch.Tensor):
        if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
            raise _not_integers(ids.dtype)
        if ids.dtype not in _EXACT_ID_DTYPES:  # uint16/32/64: numpy range-checks them below
            ids = ids.cpu().numpy()
    if not isinstance(ids, torch.Tensor):
        array = np.asarray(ids)
        if array.size == 0:
            array = array.astype(np.int64)  # [] would otherwise be float64
        if array.dtype.kind not in "iu":
            raise _not_integers(array.dtype)
        if array.dtype.kind == "u" and array.dtype.itemsize == 8 and int(array.max()) > _INT64_MAX:
            position = int(np.flatnonzero(array.reshape(-1) > _INT64_MAX)[0])
            raise IndexError(f"node id {int(array.reshape(-1)[position])} at position {position} is out of range: "
                             f"it does not fit int64, and node ids lie in [0, num_nodes)")
        ids = torch.from_numpy(np.ascontiguousarray(array.astype(np.int64, copy=False)))  # also native byte order
    return ids.reshape(-1).to(device=device, dtype=torch.int64).contiguous()


def _not_integers(dtype) -> TypeError:
    hint = "a boolean mask becomes ids with np.flatnonzero(mask)" if str(dtype).endswith("bool") else \
        "convert whole-number ids with ids.astype(np.int64)"
    return TypeError(f"node ids must be integers, got dtype {dtype}; {hint}")


def unique_ids(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted distinct ids, index of each id in them) of a 1-D int64 tensor, on its device."""
    if ids.device.type == "cpu":
        from lsm_gnn import _C

        # A radix sort in linear time (4x faster than np.unique on a batch of 65,536 ids; torch.unique, a
        # parallel sort, took 50x longer on a loaded 2-core machine). Negative ids: np.unique keeps them
        # first, where the callers' range checks find and name them.
        found = _C.unique_inverse(ids.contiguous())
        if found is not None:
            return found
        unique, inverse = np.unique(ids.numpy(), return_inverse=True)
        return torch.from_numpy(unique), torch.from_numpy(inverse.reshape(-1))
    return torch.unique(ids, sorted=True, return_inverse=True)


def first_occurrence_labels(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(distinct ids in order of first occurrence, index of each id in them) of a 1-D int64 tensor, on its
    device: a sampler's relabelling, where a prefix of distinct ids keeps its positions."""
    if ids.device.type != "cpu":
        return _first_occurrence_labels_torch(ids)
    every = ids.numpy()
    if every.size == 0:
        return ids.clone(), ids.clone()
    # One unstable sort (np.unique's return_index needs a stable one, 2-4x slower); the rest is O(n).
    order = np.argsort(every)
    ordered = every[order]
    starts_group = np.empty(every.size, dtype=bool)
    starts_group[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=starts_group[1:])
    first = np.minimum.reduceat(order, np.flatnonzero(starts_group))  # each distinct id's first position
    group = np.empty(every.size, dtype=np.int64)
    group[order] = np.cumsum(starts_group) - 1
    is_first = np.zeros(every.size, dtype=bool)
    is_first[first] = True
    rank = np.cumsum(is_first) - 1  # at a first occurrence: how many distinct ids came before it
    return torch.from_numpy(every[is_first]), torch.from_numpy(rank[first][group])


def _first_occurrence_labels_torch(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """first_occurrence_labels in torch ops, for ids on a GPU.

    One stable sort and one read back (the count): torch.unique's own sort, then a second sort of the first
    positions, cost two sorts' worth of launches. In the stable order each run of equal ids starts at its
    first occurrence, so the runs' ranks come from prefix sums instead."""
    n = ids.numel()
    if n == 0:
        return ids.clone(), ids.clone()
    device = ids.device
    ordered, order = torch.sort(ids, stable=True)
    starts = torch.empty(n, dtype=torch.bool, device=device)  # a run of equal ids begins here (sorted order)
    starts[:1] = True
    torch.ne(ordered[1:], ordered[:-1], out=starts[1:])
    is_first = torch.empty_like(starts).scatter_(0, order, starts)  # the same, at the ids' own positions
    rank = torch.cumsum(is_first, 0)  # at a first occurrence: 1 + how many distinct ids came before it
    run = torch.cumsum(starts, 0)  # each sorted position's run, from 1
    # Each run's rank, stored at its number (the other positions all go to slot 0, never read).
    run_rank = torch.empty(n + 1, dtype=torch.int64, device=device)
    run_rank.scatter_(0, run * starts, rank[order] - 1)
    labels = torch.empty(n, dtype=torch.int64, device=device).scatter_(0, order, run_rank[run])
    count = int(run[-1])
    # Every occurrence of an id writes that same id to its label: duplicates agree.
    nodes = torch.empty(count, dtype=ids.dtype, device=device).scatter_(0, labels, ids)
    return nodes, labels
