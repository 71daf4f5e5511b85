"""Bytes and durations as people read them: the one formatting of the log lines, the demo's progress,
``memexporter inspect``, ``memexporter top`` and the live page (whose JavaScript copies ``fmt_bytes``).
No torch, no package imports: a leaf."""

from __future__ import annotations

import math

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
_BINARY = ("B", "KiB", "MiB", "GiB", "TiB")


def fmt_bytes(n: float) -> str:
    """``8.0 MiB``: binary units, one decimal; ``inf`` for an infinite count."""
    if not math.isfinite(n):
        return "inf"
    for unit in _BINARY[:-1]:
        if abs(n) < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def fmt_eta(seconds: float | None) -> str:
    """``12m30s``, ``3h05m``, for a column; ``none`` when not growing (None or +Inf)."""
    if seconds is None or not math.isfinite(seconds):
        return "none"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def fmt_duration(seconds: float) -> str:
    """``2 h 10 m``, ``14 m``, ``40 s``, ``3 d 4 h``: a time as a person says it, in a sentence."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} m"
    return f"{minutes} m" if minutes else f"{secs} s"
