"""Several storages of one row format as one storage: the id space node types share.

The node types of a heterogeneous dataset whose rows have the same dim and
dtype are served by one cache (one set of lines, one budget, one window):
rows ``[0, n_0)`` are the first type's, ``[n_0, n_0 + n_1)`` the second's,
and so on. :class:`ConcatStorage` reads such ids from the types' own files.
"""
from __future__ import annotations

from dataclasses import fields

import numpy as np
import torch

from lsm_gnn.storage.base import FeatureStorage, StorageStats


class ConcatStorage(FeatureStorage):
    """``parts`` (storages with equal dim and dtype, named by ``names``) one after another."""

    def __init__(self, parts: list[FeatureStorage], names: list[str]):
        if not parts or len(parts) != len(names):
            raise ValueError("give at least one storage and one name per storage")
        first = parts[0]
        for part, name in zip(parts, names):
            if (part.dim, part.dtype) != (first.dim, first.dtype):
                raise ValueError(f"'{name}' has rows of {part.dim} x {part.dtype_name}, '{names[0]}' of "
                                 f"{first.dim} x {first.dtype_name}: only rows of one format share an id space")
        devices = {str(part.device) for part in parts}
        if len(devices) > 1:
            raise ValueError(f"the storages of {', '.join(names)} read to different devices "
                             f"({', '.join(sorted(devices))}): one id space reads to one device")
        self._device = first.device  # gds parts read to a GPU: a cache there reads its misses straight in
        self.backend = first.backend
        self.from_disk = all(part.from_disk for part in parts)
        self.parts, self.names = list(parts), list(names)
        sizes = np.array([p.num_rows for p in parts], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(sizes)])  # part k holds ids [offsets[k], offsets[k+1])
        super().__init__(int(self.offsets[-1]), first.dim, first.dtype_name)

    @property
    def device(self) -> torch.device:
        return self._device

    def offset(self, name: str) -> int:
        """The first id of part ``name``."""
        return int(self.offsets[self.names.index(name)])

    def _read(self, ids: torch.Tensor, out: torch.Tensor) -> None:
        for k, where in self._by_part(ids):
            out[where] = self.parts[k].read(ids[where] - int(self.offsets[k]))

    def _read_into(self, ids: torch.Tensor, out: torch.Tensor, slots: torch.Tensor) -> None:
        for k, where in self._by_part(ids):  # each part places its rows itself
            self.parts[k].read_into(ids[where] - int(self.offsets[k]), out, slots[where])

    def _by_part(self, ids: torch.Tensor):
        """(part, positions of ``ids`` in it) for every part that ``ids`` touch; checks the range first."""
        if int(ids.min()) < 0 or int(ids.max()) >= self.num_rows:
            bad = int(torch.nonzero((ids < 0) | (ids >= self.num_rows))[0])
            raise IndexError(f"id {int(ids[bad])} at position {bad} is out of range [0, {self.num_rows}) of "
                             f"{' + '.join(self.names)}")
        part = torch.from_numpy(np.searchsorted(self.offsets[1:], ids.numpy(), side="right"))
        for k in torch.unique(part).tolist():
            yield k, torch.nonzero(part == k).reshape(-1)

    def stats(self) -> StorageStats:
        """The parts' counters summed (latencies: the sum, and the largest of the maxima)."""
        total = StorageStats(backend=self.backend)
        for part in self.parts:
            s = part.stats()
            for f in fields(StorageStats):
                if f.name == "max_batch_seconds":
                    total.max_batch_seconds = max(total.max_batch_seconds, s.max_batch_seconds)
                elif f.name != "backend":
                    setattr(total, f.name, getattr(total, f.name) + getattr(s, f.name))
        return total

    def reset_stats(self) -> None:
        for part in self.parts:
            part.reset_stats()

    def close(self) -> None:
        for part in self.parts:
            part.close()
        super().close()

    def __repr__(self) -> str:
        return f"ConcatStorage({', '.join(f'{n}: {p!r}' for n, p in zip(self.names, self.parts))})"
