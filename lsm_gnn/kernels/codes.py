"""The numbers the kernels and the C++ core know eviction policies and the hybrid policy's levels by.

:mod:`lsm_gnn.cache.policies` describes each policy and builds its settings on these names; the cache hands the
kernels the codes, and the kernels need nothing from the cache.
"""
from __future__ import annotations

# Dynamic-information classes of a valid cache line at eviction time, in code order.
LEVELS = ("none", "far", "fresh", "near")
LEVEL_CODE = {name: code for code, name in enumerate(LEVELS)}

POLICY_NAMES = ("rr", "lru", "static", "dynamic", "hybrid", "hybrid_pvp", "hybrid_far", "hybrid_pvp_room",
                "farthest")
POLICY_CODE = {name: code for code, name in enumerate(POLICY_NAMES)}
