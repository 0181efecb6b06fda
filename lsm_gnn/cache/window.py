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
from lsm_gnn.utils.ids import as_id_tensor


class WindowBuffer:
    """A FIFO of at most ``size`` future mini-batches (node id tensors).

    With ``num_nodes`` it also keeps a native index of each node's first
    occurrence, updated per push/pop, so the cache's window scan costs
    O(cache lines) rather than O(ids in the window). A cache on another
    device reads a mirror of that index on its device
    (:meth:`first_occurrence`), updated in O(batch) per push/pop.
    """

    def __init__(self, size: int = WINDOW, num_nodes: int | None = None, *, start_iteration: int = 0,
                 rebase_after: int | None = None):
        """``start_iteration``: the iteration of the first batch pushed (the index's ``front_iteration``).
        ``rebase_after``: the largest iteration the index stores counted from its base before the base
        moves (default 2^31 - 1; tests lower it to exercise the move)."""
        if not 1 <= size <= 65534:
            raise ValueError(f"window size must be in 1..65534, got {size}")
        self.size = size
        self._batches: deque[torch.Tensor] = deque()
        self.index = None
        self._mirrors: dict[torch.device, FirstOccurrenceMirror] = {}
        if num_nodes is not None:
            from lsm_gnn import _C

            limit = {} if rebase_after is None else {"rebase_after": int(rebase_after)}
            self.index = _C.WindowIndex(int(num_nodes), int(start_iteration), **limit)

    def push(self, ids, rank: int = 0) -> None:
        if len(self._batches) >= self.size:
            raise RuntimeError(f"window buffer is full ({self.size} batches); pop() the current batch first")
        ids = as_id_tensor(ids)
        if self.index is not None:
            self.index.push(ids, rank)
            for mirror in self._mirrors.values():
                mirror.refresh(ids)
        self._batches.append(ids)

    def pop(self) -> torch.Tensor:
        """Removes and returns the oldest batch (the one to serve now)."""
        if not self._batches:
            raise IndexError("window buffer is empty")
        batch = self._batches.popleft()
        if self.index is not None:
            self.index.pop()
            for mirror in self._mirrors.values():
                mirror.refresh(batch)
        return batch

    def first_occurrence(self, device: str | torch.device = "cpu", mirror: bool | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """The index's per-node first occurrences, what the window scan reads:
        ``(first_iteration, first_position, first_rank, front)`` on ``device``.

        ``first_iteration`` (int32, -1: none) and ``front`` count iterations from the index's
        ``iteration_base``: ``front`` is its ``front_offset`` and ``first_iteration[v] - front + 1``
        is node ``v``'s reuse distance. ``first_position`` is int32, ``first_rank`` uint8.

        On the CPU these are views of the native index. Elsewhere (``mirror=True`` forces it on
        the CPU too) a copy on the device is made once, O(num_nodes), and from then on kept
        current by every push and pop, O(batch) (O(num_nodes) once when the base moves, every
        2^31 iterations): 9 bytes per node of device memory.
        """
        if self.index is None:
            raise ValueError("this window buffer has no index: build it with num_nodes")
        device = torch.device(device)
        if mirror is None:
            mirror = device.type != "cpu"
        if not mirror:
            index = self.index
            return index.first_iteration, index.first_position, index.first_rank, index.front_offset
        if device not in self._mirrors:
            self._mirrors[device] = FirstOccurrenceMirror(self.index, device)
        return (*self._mirrors[device].arrays, self.index.front_offset)

    def __len__(self) -> int:
        return len(self._batches)

    def __getitem__(self, k: int) -> torch.Tensor:
        return self._batches[k]

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self._batches)

    @property
    def full(self) -> bool:
        return len(self._batches) >= self.size


def first_occurrences(future, window: int, num_rows: int, device: torch.device) -> tuple:
    """The per-node first occurrences of ``future`` (a :class:`WindowBuffer` with an index, or a plain list of
    batches, indexed here over its first ``window`` batches: O(ids in the window)) on ``device``
    (:meth:`WindowBuffer.first_occurrence`)."""
    indexed = future if isinstance(future, WindowBuffer) and future.index is not None else None
    if indexed is None:
        indexed = WindowBuffer(window, num_rows)
        for k, batch in enumerate(future):
            if k >= window:
                break
            indexed.push(batch)
    return indexed.first_occurrence(device)


class FirstOccurrenceMirror:
    """A copy of a window index's per-node arrays on another device, refreshed per batch."""

    def __init__(self, index, device: torch.device):
        self._index = index
        self._host = (index.first_iteration, index.first_position, index.first_rank)
        self.device = device
        self.arrays = tuple(a.to(device, copy=True) for a in self._host)  # one copy, no host temporary
        self._base = index.iteration_base

    def refresh(self, ids: torch.Tensor) -> None:
        """Copies the entries of ``ids`` (a pushed or popped batch: the only nodes whose first
        occurrence it can change) from the index; all of them after the index's base moved."""
        if self._index.iteration_base != self._base:
            self._base = self._index.iteration_base
            for host, copy in zip(self._host, self.arrays):
                copy.copy_(host)
            return
        if ids.numel() == 0:
            return
        ids = ids.cpu()
        on_device = ids.to(self.device)
        for host, copy in zip(self._host, self.arrays):
            copy[on_device] = host[ids].to(self.device)


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
