"""The window buffer: the node lists of the next W mini-batches.

Whatever samples mini-batches (our sampler, another library, a recorded
trace) pushes them here ahead of time; the cache reads ``window[0]`` as the
batch of the next iteration, ``window[1]`` the one after, and so on.
"""
from __future__ import annotations

from collections import deque
from typing import Iterable, Iterator

import torch

from lsm_gnn.defaults import WINDOW
from lsm_gnn.ids import as_id_tensor


class WindowBuffer:
    """A FIFO of at most ``size`` future mini-batches (node id tensors).

    With ``num_nodes`` it also keeps a native index of each node's first
    occurrence, updated per push/pop, so the cache's window scan costs
    O(cache lines) rather than O(ids in the window).
    """

    def __init__(self, size: int = WINDOW, num_nodes: int | None = None):
        if not 1 <= size <= 65534:
            raise ValueError(f"window size must be in 1..65534, got {size}")
        self.size = size
        self._batches: deque[torch.Tensor] = deque()
        self.index = None
        if num_nodes is not None:
            from lsm_gnn import _C

            self.index = _C.WindowIndex(int(num_nodes))

    def push(self, ids, rank: int = 0) -> None:
        if len(self._batches) >= self.size:
            raise RuntimeError(f"window buffer is full ({self.size} batches); pop() the current batch first")
        ids = as_id_tensor(ids)
        if self.index is not None:
            self.index.push(ids, rank)
        self._batches.append(ids)

    def pop(self) -> torch.Tensor:
        """Removes and returns the oldest batch (the one to serve now)."""
        if not self._batches:
            raise IndexError("window buffer is empty")
        if self.index is not None:
            self.index.pop()
        return self._batches.popleft()

    def __len__(self) -> int:
        return len(self._batches)

    def __getitem__(self, k: int) -> torch.Tensor:
        return self._batches[k]

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self._batches)

    @property
    def full(self) -> bool:
        return len(self._batches) >= self.size


def replay(trace: Iterable, window_size: int, num_nodes: int | None = None
           ) -> Iterator[tuple[torch.Tensor, WindowBuffer]]:
    """Yields (current batch, window of the following batches) over a trace:
    the loop a loader runs, with sampling replaced by a recorded list.
    ``num_nodes`` enables the window's native index (for the native cache)."""
    source = iter(trace)
    window = WindowBuffer(window_size + 1, num_nodes)
    for ids in source:
        window.push(ids)
        if window.full:
            break
    while len(window):
        current = window.pop()
        yield current, window
        nxt = next(source, None)
        if nxt is not None:
            window.push(nxt)
