"""Large host buffers on transparent huge pages.

A cache hit copies one row from a random line of the cache's data: with
4 KiB rows on 4 KiB pages every row is a TLB miss, which made the gather
about 20% slower than a contiguous copy of the same bytes (docs/benchmarks/lookup.md,
"Cache lookup throughput"). Backing the big tables with 2 MiB pages removes
most of those misses. Linux gives huge pages to anonymous memory only when it
is asked (``madvise`` mode is the common default), so these buffers are
anonymous maps advised ``MADV_HUGEPAGE``; elsewhere they are plain tensors.
"""
from __future__ import annotations

import math
import mmap
import sys

import torch

HUGE_PAGE = 2 << 20  # below this a buffer cannot hold one huge page: plain allocation


def host_zeros(shape, dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled, contiguous CPU tensor, on transparent huge pages where the platform offers them.

    The tensor keeps its map alive and frees it when the last view goes; it
    behaves as ``torch.zeros(shape, dtype=dtype)`` in every other way.
    """
    shape = tuple(int(n) for n in (shape if isinstance(shape, (tuple, list, torch.Size)) else (shape,)))
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    advise = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes < HUGE_PAGE or advise is None or not hasattr(mmap, "MAP_ANONYMOUS"):
        return torch.zeros(shape, dtype=dtype)
    return torch.frombuffer(_huge_map(nbytes), dtype=dtype).view(shape)


def _huge_map(nbytes: int) -> mmap.mmap:
    """An anonymous map of ``nbytes`` (zero-filled by the kernel) advised ``MADV_HUGEPAGE`` where possible."""
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advise = getattr(mmap, "MADV_HUGEPAGE", None)
    if advise is not None:
        try:
            region.madvise(advise)
        except OSError:  # a kernel without THP refuses the advice: the map is still valid memory
            pass
    return region


class HostBufferPool:
    """CPU tensors for results that leave with their caller, made over a few anonymous maps (on transparent
    huge pages where offered) that are handed out again once nothing uses them.

    A fresh buffer of tens of MB costs a page fault per page when first written: 11-17 ms for a batch of
    5,200 4 KiB rows on the 2-core test machine, against 1.6 ms for the copy into memory already touched.
    A map is free again when no tensor, view or array over it is left: each holds a reference to the map
    (``torch.frombuffer`` keeps its buffer object alive until its storage goes), so the pool reads the
    map's reference count. It keeps at most ``keep`` maps; past them, or for small buffers, a call
    allocates as ``torch.empty`` does. Not thread-safe: one owner calls it.
    """

    def __init__(self, keep: int = 6):
        self.keep = keep
        self._maps: list[mmap.mmap] = []

    def _unused(self, index: int) -> bool:
        return sys.getrefcount(self._maps[index]) == 2  # the list's reference and the argument's: no tensor

    def empty(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous CPU tensor (it may hold an earlier result's bytes)."""
        shape = tuple(int(n) for n in shape)
        numel = math.prod(shape)
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if nbytes < HUGE_PAGE or not hasattr(mmap, "MAP_ANONYMOUS"):
            return torch.empty(shape, dtype=dtype)
        free = [i for i in range(len(self._maps)) if self._unused(i)]
        fits = sorted((len(self._maps[i]), i) for i in free if len(self._maps[i]) >= nbytes)
        if fits:
            region = self._maps[fits[0][1]]
        else:
            if free:  # a free map too small for this result: its successor takes its place
                del self._maps[free[0]]
            size = -(-(nbytes + nbytes // 4) // HUGE_PAGE) * HUGE_PAGE  # room for somewhat larger batches
            region = _huge_map(size)
            if len(self._maps) < self.keep:
                self._maps.append(region)
        return torch.frombuffer(region, dtype=dtype, count=numel).view(shape)
