"""How a byte count is printed: decimal units (1 GB = 1e9 bytes), as in the ZeRO paper.

A display helper of the diagnostics (the memory ledger, the estimates) and the course; the engines count
bytes (`fsdp_mini.memory`) and never print them, so `import fsdp_mini.fsdp` does not load this module.
"""
from __future__ import annotations

__all__ = ["format_bytes", "decimal_scale"]

_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")


def format_bytes(nbytes: int | float) -> str:
    """Human-readable decimal size: `"512 B"`, `"1.9 GB"`, `"31.4 GB"` (1 kB = 1000 B, as in ZeRO)."""
    if not nbytes >= 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
    if nbytes < 1000:
        return f"{nbytes:g} B"
    value, unit = decimal_scale(nbytes)
    return f"{value:.1f} {_UNITS[unit]}"


def decimal_scale(nbytes: int | float, units: int = len(_UNITS)) -> tuple[float, int]:
    """`nbytes` in decimal units: (value, k) with value = nbytes / 1000**k, k the unit ("B", "kB", "MB",
    ...) that shows it, below `units`. A value that would print as 1000.0 moves up a unit (999,960 B is
    "1.0 MB", not "1000.0 kB"). The one rule of `format_bytes` and of the lessons' translated sizes."""
    value, unit = float(nbytes), 0
    while unit < units - 1 and round(value, 1) >= 1000:
        value, unit = value / 1000, unit + 1
    return value, unit
