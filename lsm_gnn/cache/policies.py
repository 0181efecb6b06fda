"""The one table of eviction policies and the hybrid policy's levels.

Every implementation (reference model, C++, CUDA) reads policy names and
level orders from here, so a policy is added in one place.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lsm_gnn.defaults import PERIOD, WINDOW

# Dynamic-information classes of a valid cache line at eviction time.
LEVEL_NONE = "none"    # scanned: no reuse within the window
LEVEL_FAR = "far"      # next reuse beyond the threshold
LEVEL_FRESH = "fresh"  # no dynamic information yet: inserted (or its predicted reuse consumed) since the last scan
LEVEL_NEAR = "near"    # next reuse within the threshold
LEVELS = (LEVEL_NONE, LEVEL_FAR, LEVEL_FRESH, LEVEL_NEAR)
LEVEL_CODE = {name: code for code, name in enumerate(LEVELS)}

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
}
POLICY_CODE = {name: code for code, name in enumerate(POLICIES)}

DEFAULT_LEVEL_ORDER = {
    "hybrid": (LEVEL_NONE, LEVEL_FAR, LEVEL_FRESH, LEVEL_NEAR),
    "hybrid_pvp": (LEVEL_FAR, LEVEL_NONE, LEVEL_FRESH, LEVEL_NEAR),
    "hybrid_far": (LEVEL_NONE, LEVEL_FAR, LEVEL_FRESH, LEVEL_NEAR),
    "hybrid_pvp_room": (LEVEL_FAR, LEVEL_NONE, LEVEL_FRESH, LEVEL_NEAR),
}


@dataclass(frozen=True)
class PolicyConfig:
    """A policy name plus the knobs of the window-based policies."""

    name: str = "hybrid"
    window: int = WINDOW         # future mini-batches the window buffer holds
    period: int = PERIOD         # scan the window every `period` iterations
    threshold: int | None = None  # "near" reuse distance; default window // 8
    levels: tuple[str, ...] | None = None  # hybrid eviction order; default per policy

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

    @property
    def near_threshold(self) -> int:
        return self.window // 8 if self.threshold is None else self.threshold

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


#: scores ranked per block by quantize_scores: its working memory is a few blocks, not a few copies of the scores
QUANTIZE_BLOCK = 1 << 20


def distinct_sorted(values: np.ndarray) -> np.ndarray:
    """np.unique(values) for 1-D values (NaNs collapse into one, last), from one sorted copy: numpy 2.4's
    np.unique kept tens of bytes per value of heap after returning, inside a memory cap."""
    ordered = np.sort(values)
    keep = np.empty(ordered.size, dtype=bool)
    keep[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    if ordered.dtype.kind == "f":  # NaN != NaN: keep the first NaN only (they sort last)
        nan = np.isnan(ordered)
        keep[1:] &= ~(nan[1:] & nan[:-1])
    return ordered[keep]


def quantize_scores(scores: np.ndarray, block: int = QUANTIZE_BLOCK) -> np.ndarray:
    """Static scores to uint16 by dense rank (order-preserving, robust to heavy tails):
    the highest score maps to 65535, equal scores to equal values.

    Bounded memory for scores of any length (e.g. memory-mapped from a dataset of 10^8 nodes): besides the
    result it holds one sorted copy of the distinct scores and ``block`` ranks at a time, never an inverse
    index or float64 copy of the whole array (which cost ~50 bytes per node, and pinned freed heap below
    the result). Scores are compared in their own dtype where float64 would not rank them differently.
    """
    scores = np.asarray(scores)
    if scores.dtype.kind not in "fb" and scores.dtype.itemsize > 4:  # e.g. int64: rank as float64, as documented
        scores = scores.astype(np.float64)
    out = np.empty(scores.shape, dtype=np.uint16)  # before the temporaries, so the heap can shrink after them
    uniq = distinct_sorted(scores.reshape(-1))
    if uniq.size <= 1:
        out.fill(0)
        return out
    flat, flat_out = scores.reshape(-1), out.reshape(-1)
    scale = 65535.0 / (uniq.size - 1)
    for start in range(0, flat.size, block):
        rank = np.searchsorted(uniq, flat[start:start + block])  # the dense rank: equal scores, equal rank
        flat_out[start:start + block] = np.round(rank * scale)
    return out
