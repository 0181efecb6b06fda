"""Large host buffers on transparent huge pages.

A cache hit copies one row from a random line of the cache's data: with
4 KiB rows on 4 KiB pages every row is a TLB miss, which made the gather
about 20% slower than a contiguous copy of the same bytes (docs/benchmarks.md,
"Cache lookup throughput"). Backing the big tables with 2 MiB pages removes
most of those misses. Linux gives huge pages to anonymous memory only when it
is asked (``madvise`` mode is the common default), so these buffers are
anonymous maps advised ``MADV_HUGEPAGE``; elsewhere they are plain tensors.
"""
from __future__ import annotations

import math
import mmap

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
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # zero-filled by the kernel
    try:
        region.madvise(advise)
    except OSError:  # a kernel without THP refuses the advice: the map is still valid memory
        pass
    return torch.frombuffer(region, dtype=dtype).view(shape)
