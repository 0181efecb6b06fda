"""The one table of eviction policies and the hybrid policy's levels.

Every implementation (reference model, C++, CUDA) reads policy names and
level orders from here, so a policy is added in one place.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lsm_gnn.defaults import PERIOD, WINDOW
# The codes the kernels know policies and levels by live with the kernels; the descriptions live here.
from lsm_gnn.kernels.codes import LEVEL_CODE, LEVELS, POLICY_CODE, POLICY_NAMES  # noqa: F401

# Dynamic-information classes of a valid cache line at eviction time:
#   none:  scanned, no reuse within the window
#   far:   next reuse beyond the threshold
#   fresh: no dynamic information yet: inserted (or its predicted reuse consumed) since the last scan
#   near:  next reuse within the threshold
LEVEL_NONE, LEVEL_FAR, LEVEL_FRESH, LEVEL_NEAR = LEVELS

POLICIES = {
    "rr": "round-robin within the set (the M-GIDS baseline)",
    "lru": "least recently used (comparison)",
    "static": "lowest static score (quantized reverse PageRank) first",
    "dynamic": "no reuse in the window first, then lines without information, then farthest next reuse",
    "hybrid": "the paper's four levels, evicted first to last: none, far, fresh, near; ties on lowest static score",
    "hybrid_pvp": "hybrid with the two lowest levels swapped (far before none), for the victim-buffer prefetcher",
    "hybrid_far": "hybrid, but lines in the 'far' level go farthest reuse first, then lowest static score",
    "hybrid_pvp_room": "hybrid_pvp, but a far line goes first only while the victim queue of its next use has room "
                       "(else it keeps hybrid's place); without a victim buffer it is hybrid",
    "farthest": "Belady's order as far as the window shows: no reuse first, then farthest known reuse first, "
                "lines without information ranked as if reused at the threshold (window/4); ties on lowest "
                "static score. Hit and installed lines read their next use at once, and a miss needed after "
                "its victim is not cached (Belady's bypass)",
}
if tuple(POLICIES) != POLICY_NAMES:  # a policy added here must get its code in kernels/codes.py too
    raise ImportError(f"lsm_gnn.cache.policies describes {tuple(POLICIES)} but lsm_gnn.kernels.codes numbers "
                      f"{POLICY_NAMES}: keep the two in the same order")

# Default "near" threshold as a fraction of the window: the paper's 1/8, except for farthest, whose lines
# without information rank as if reused window/4 ahead (the best of 16..128 at window 256 on the policy
# benchmark's trace before farthest read next uses at assign, docs/benchmarks/cache_policies.md; since then only lines
# served without a window are without information).
NEAR_DIVISOR = {"farthest": 4}

# Policies whose hit and installed lines read their next use from the window at once (assign_next_use), and
# that then leave uncached a miss they would evict before its victim (bypass), as Belady's MIN does.
ASSIGN_NEXT_USE = {"farthest": True}
BYPASS = {"farthest": True}

DEFAULT_LEVEL_ORDER = {
    "hybrid": (LEVEL_NONE, LEVEL_FAR, LEVEL_FRESH, LEVEL_NEAR),
    "hybrid_pvp": (LEVEL_FAR, LEVEL_NONE, LEVEL_FRESH, LEVEL_NEAR),
    "hybrid_far": (LEVEL_NONE, LEVEL_FAR, LEVEL_FRESH, LEVEL_NEAR),
    "hybrid_pvp_room": (LEVEL_FAR, LEVEL_NONE, LEVEL_FRESH, LEVEL_NEAR),
    "farthest": (LEVEL_NONE, LEVEL_FAR, LEVEL_FRESH, LEVEL_NEAR),
}


@dataclass(frozen=True)
class PolicyConfig:
    """A policy name plus the knobs of the window-based policies."""

    name: str = "hybrid"
    window: int = WINDOW         # future mini-batches the window buffer holds
    period: int = PERIOD         # scan the window every `period` iterations
    threshold: int | None = None  # "near" reuse distance; default window // 8 (farthest: window // 4)
    levels: tuple[str, ...] | None = None  # hybrid eviction order; default per policy
    # Hit and installed lines take their next use from the window at assign time instead of being "fresh"
    # until the next scan; default per policy (ASSIGN_NEXT_USE: farthest).
    assign_next_use: bool | None = None
    # With assign_next_use: a miss the policy would evict before its victim is served but not cached;
    # default per policy (BYPASS: farthest).
    bypass: bool | None = None

    def __post_init__(self):
        if self.name not in POLICIES:
            raise ValueError(f"unknown cache policy {self.name!r}; valid names are {', '.join(POLICIES)}")
        if not 1 <= self.window <= 65534 - self.period:
            raise ValueError(f"window must be in 1..{65534 - self.period} (next reuse is stored in 16 bits), "
                             f"got {self.window}")
        if not 1 <= self.period <= self.window:
            raise ValueError(f"period must be in 1..window ({self.window}), got {self.period}")
        if self.threshold is not None and not 0 <= self.threshold <= self.window:
            raise ValueError(f"threshold must be in 0..window ({self.window}), got {self.threshold}")
        if self.levels is not None:
            if sorted(self.levels) != sorted(LEVELS):
                raise ValueError(f"levels must order all of {', '.join(LEVELS)} exactly once, got {self.levels}")
            if self.name not in DEFAULT_LEVEL_ORDER:
                raise ValueError(f"levels only apply to the hybrid policies, not {self.name!r}")
        # Frozen: the per-policy defaults are filled in through object.__setattr__.
        if self.assign_next_use is None:
            object.__setattr__(self, "assign_next_use", ASSIGN_NEXT_USE.get(self.name, False))
        if self.bypass is None:
            object.__setattr__(self, "bypass", BYPASS.get(self.name, False) and self.assign_next_use)
        if self.assign_next_use and not self.uses_window:
            raise ValueError(f"assign_next_use needs a window policy (dynamic or a hybrid one), not {self.name!r}")
        if self.bypass and not self.assign_next_use:
            raise ValueError("bypass compares a miss's next use with its victim's: it needs assign_next_use=True")

    @property
    def near_threshold(self) -> int:
        return self.window // NEAR_DIVISOR.get(self.name, 8) if self.threshold is None else self.threshold

    @property
    def level_order(self) -> tuple[str, ...]:
        """Levels from evicted first to evicted last (hybrid policies)."""
        return self.levels or DEFAULT_LEVEL_ORDER.get(self.name, DEFAULT_LEVEL_ORDER["hybrid"])

    @property
    def level_rank(self) -> tuple[int, ...]:
        """level_rank[LEVEL_CODE[level]] = position of that level in the eviction order."""
        order = self.level_order
        return tuple(order.index(level) for level in LEVELS)

    @property
    def uses_window(self) -> bool:
        return self.name in ("dynamic",) + tuple(DEFAULT_LEVEL_ORDER)


def quantize_scores(scores: np.ndarray, chunk: int = 1 << 20) -> np.ndarray:
    """Static scores to uint16 by dense rank (order-preserving, robust to heavy tails):
    the highest score maps to 65535, equal scores to equal values (NaNs to one value, above all others).

    It runs once per cache over one score per node, so its peak matters at 10^8 nodes: about 15 bytes
    per node (a sort order, the dense ranks, the result), float32 scores kept as float32 (a float32
    is exactly a float64, so the ranks are the same). ``chunk`` bounds the float temporaries.
    """
    scores = np.asarray(scores)
    if scores.dtype not in (np.float32, np.float64):
        scores = scores.astype(np.float64)
    flat = scores.reshape(-1)
    n = flat.size
    if n == 0:
        return np.zeros(scores.shape, dtype=np.uint16)
    order = np.argsort(flat)
    ordered = flat[order]
    starts = np.empty(n, dtype=bool)  # starts[k]: ordered[k] is a new distinct value
    starts[0] = False
    np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
    if np.isnan(ordered[-1]):  # NaNs sort last and compare unequal: count them as one value, as np.unique does
        first_nan = int(np.searchsorted(np.isnan(ordered), True))
        starts[first_nan + 1:] = False
    del ordered
    dense = np.cumsum(starts, dtype=np.int32 if n < 2**31 else np.int64)
    del starts
    distinct = int(dense[-1]) + 1
    out = np.zeros(n, dtype=np.uint16)
    if distinct > 1:
        scale = 65535.0 / (distinct - 1)
        for start in range(0, n, chunk):
            out[order[start:start + chunk]] = np.round(dense[start:start + chunk] * scale).astype(np.uint16)
    return out.reshape(scores.shape)


def static_ranks(scores, num_rows: int, device: torch.device) -> torch.Tensor | None:
    """Per-node static ``scores`` (one per row of a storage of ``num_rows``; None: none) as the int16 view of
    uint16 ranks (:func:`quantize_scores`) the cache's assign reads, on ``device``."""
    if scores is None:
        return None
    scores = np.asarray(scores)
    ranks = scores if scores.dtype == np.uint16 else quantize_scores(scores)
    ranks = torch.from_numpy(np.ascontiguousarray(ranks).view(np.int16)).to(device)
    if ranks.numel() != num_rows:
        raise ValueError(f"static_scores has {ranks.numel()} entries; the storage has {num_rows} nodes")
    return ranks
