"""The cache line layout in Python: the one mirror of ``csrc/cache/line_state.h``.

The 8-byte PVP record of the paper keeps the next reuse in its top 16 bits
(so an atomic min keeps the nearest), the requesting rank in the next 8 and
the index in that rank's mini-batch in the low 40. Records are stored in
int64 tensors; ``NO_REUSE_RECORD`` is the record of a line with no known
reuse, as that signed value.
"""
from __future__ import annotations

INVALID_TAG = -1
NO_ID = (1 << 63) - 1                    # pads a batch's sorted distinct ids: takes no line, counts as a hit
REUSE_SHIFT = 48
RANK_SHIFT = 40
INDEX_MASK = (1 << RANK_SHIFT) - 1       # the mini-batch index (5 bytes)
NO_REUSE = 0xFFFF                        # reuse value meaning "not in the window"
NO_REUSE_RECORD = (NO_REUSE << REUSE_SHIFT) - (1 << 64)  # as a signed int64
FRESH = 1                                # line flag: no dynamic information since the last scan


def pack_record(reuse: int, rank: int, index: int) -> int:
    """The record as an unsigned 64-bit value."""
    return (reuse << REUSE_SHIFT) | ((rank & 0xFF) << RANK_SHIFT) | (index & INDEX_MASK)
