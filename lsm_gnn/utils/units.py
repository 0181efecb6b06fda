"""Byte sizes: one unit everywhere (bytes), with human strings accepted."""
from __future__ import annotations

import math
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


def round_up(value: float, digits: int = 2) -> float:
    """``value`` rounded up to ``digits`` significant digits (83.1 -> 84, 0.8306 -> 0.84): a size to suggest."""
    if value <= 0:
        return 0.0
    step = 10.0 ** (math.floor(math.log10(value)) - digits + 1)
    # float(repr) drops the binary noise of the product (0.84000000000000008 -> 0.84)
    return float(f"{math.ceil(value / step - 1e-9) * step:.{digits + 12}g}")


def suggest_bytes(value: float) -> str:
    """A byte count rounded up to two significant digits in the largest unit it reaches, as
    :func:`parse_bytes` reads it: 83,060,000 -> ``"80M"``, 1.37 * 2**30 -> ``"1.4G"``."""
    for suffix in ("T", "G", "M", "K"):
        if value >= _SUFFIXES[suffix]:
            return f"{round_up(value / _SUFFIXES[suffix]):g}{suffix}"
    return f"{math.ceil(value)}"
