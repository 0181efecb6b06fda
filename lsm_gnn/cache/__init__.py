"""The software cache: set-associative, policy-driven, with a window buffer, Belady's bound
and the victim-buffer prefetcher (PVP)."""
from lsm_gnn.cache.belady import (belady_min, belady_reference, belady_set_associative,
                                   belady_set_associative_reference)
from lsm_gnn.cache.geometry import CacheTooSmall, cache_geometry, cache_sets, every_row_sets
from lsm_gnn.cache.policies import POLICIES, PolicyConfig, quantize_scores
from lsm_gnn.cache.pvp import DEFAULT_QUEUE_BYTES, PVPStats, VictimBuffer
from lsm_gnn.cache.reference import ReferenceCache
from lsm_gnn.cache.software_cache import SoftwareCache
from lsm_gnn.cache.stats import CacheStats
from lsm_gnn.cache.window import WindowBuffer, replay

__all__ = ["DEFAULT_QUEUE_BYTES", "POLICIES", "CacheStats", "CacheTooSmall", "PVPStats", "PolicyConfig",
           "ReferenceCache", "SoftwareCache", "VictimBuffer", "WindowBuffer", "belady_min", "belady_reference",
           "belady_set_associative", "belady_set_associative_reference", "cache_geometry", "cache_sets", "every_row_sets",
           "quantize_scores", "replay"]
