"""The software cache's counters, shared by the native cache and its reference model."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CacheStats:
    """Counters over distinct ids per batch (duplicates in a batch count once)."""

    iterations: int = 0
    requests: int = 0      # ids asked for, with duplicates
    unique: int = 0        # distinct ids per batch, summed (= hits + pvp_hits + misses)
    hits: int = 0          # served by the cache
    misses: int = 0        # read from storage
    evictions: int = 0     # valid lines replaced
    evicted_in_use: int = 0  # lines evicted by the iteration that used them (cache smaller than a batch)
    bypassed: int = 0        # misses served but not cached: the policy would have evicted them first
    bytes_read: int = 0      # feature bytes fetched from storage (misses x row bytes)
    scans: int = 0
    pvp_hits: int = 0        # served by the victim buffer (PVP), never reaching storage
    written_back: int = 0    # dirty rows written to a writable storage (on eviction and flush)
    bytes_written: int = 0   # their bytes

    @property
    def hit_ratio(self) -> float:
        """The cache's own hits over distinct ids."""
        return self.hits / self.unique if self.unique else 0.0

    @property
    def combined_hit_ratio(self) -> float:
        """Cache and victim-buffer hits over distinct ids: the share not read from storage."""
        return (self.hits + self.pvp_hits) / self.unique if self.unique else 0.0

    def as_dict(self) -> dict:
        d = dict(vars(self))
        d["hit_ratio"] = self.hit_ratio
        d["combined_hit_ratio"] = self.combined_hit_ratio
        return d
