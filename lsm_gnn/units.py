"""Byte sizes: one unit everywhere (bytes), with human strings accepted."""
from __future__ import annotations

import re

_SUFFIXES = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(I?B)?\s*$", re.IGNORECASE)


def parse_bytes(value: int | str) -> int:
    """Returns a byte count from an int or a string such as ``"4G"``, ``"512KiB"`` or ``"1.5 GB"``.

    Suffixes are binary (K = 1024): a cache of "4G" holds 4 * 2**30 bytes.
    """
    if isinstance(value, bool):
        raise TypeError(f"expected a byte size, got a bool ({value!r})")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a byte size cannot be negative, got {value}")
        return value
    if isinstance(value, str):
        match = _PATTERN.match(value)
        if match:
            number, suffix = float(match.group(1)), match.group(2).upper()
            return int(number * _SUFFIXES[suffix])
    raise ValueError(
        f"cannot read {value!r} as a byte size; use an integer number of bytes or a string like '512K', '4G', '1.5GiB'"
    )


def format_bytes(value: float) -> str:
    """Formats a byte count with a binary suffix, e.g. ``4.0 GiB``."""
    for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or suffix == "TiB":
            return f"{value:.0f} {suffix}" if suffix == "B" else f"{value:.1f} {suffix}"
        value /= 1024
    raise AssertionError("unreachable")
