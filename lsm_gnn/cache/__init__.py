"""The software cache: set-associative, policy-driven, with a window buffer and Belady's bound."""
from lsm_gnn.cache.belady import belady_min, belady_reference
from lsm_gnn.cache.policies import POLICIES, PolicyConfig
from lsm_gnn.cache.reference import CacheStats, ReferenceCache, quantize_scores
from lsm_gnn.cache.software_cache import SoftwareCache, cache_geometry
from lsm_gnn.cache.window import WindowBuffer, replay

__all__ = ["POLICIES", "CacheStats", "PolicyConfig", "ReferenceCache", "SoftwareCache", "WindowBuffer",
           "belady_min", "belady_reference", "cache_geometry", "quantize_scores", "replay"]
