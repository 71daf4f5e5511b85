"""Which census groups grow steadily, and how fast: pure math over the census history (no torch).

A group grows steadily when, since its last fall, it rose in at least half of the census
intervals, and at least ``MIN_RISES`` times; ``MIN_RISES_CONFIRMED`` times suffice on a device
whose in-process leak estimate (trend.py, noise-gated over the leak window) is already positive.
The confirmation is what lets a real leak be named two censuses after it shows, while a healthy
run, whose estimate stays 0, needs four rises in a row from a group that merely fluctuates (a
prefetch queue, a cache that evicts) before it could be reported: a fall starts the count anew.

Rates are Theil-Sen slopes (the median of pairwise slopes) of bytes and counts against the step
number, over the rising run, so one odd census does not skew them.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from memexporter.diagnose.census import GroupKey

MIN_RISES = 4
MIN_RISES_CONFIRMED = 2


@dataclass(frozen=True)
class Point:
    """One census as the growth analysis sees it: step, ``{group: (count, bytes)}``, and whether
    every group was kept (when not, a group missing from it is unknown rather than 0)."""

    step: int
    counts: Mapping[GroupKey, tuple[int, int]]
    complete: bool = True


@dataclass(frozen=True)
class Growth:
    """A steadily growing group: its latest count and bytes, and its rates per training step."""

    key: GroupKey
    count: int
    bytes: int
    count_per_step: float
    bytes_per_step: float
    since_step: int
    censuses: int


def median_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Theil-Sen: the median of ``(y_j - y_i) / (x_j - x_i)`` over pairs with ``x_j > x_i`` (0 if none)."""
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[j] > xs[i]]
    return statistics.median(slopes) if slopes else 0.0


def _series(history: Sequence[Point], key: GroupKey) -> list[tuple[int, int, int]]:
    out = []
    for p in history:
        value = p.counts.get(key)
        if value is None and p.complete:
            value = (0, 0)
        if value is not None:
            out.append((p.step, value[0], value[1]))
    return out


def _rising_run(series: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """The points from just before the first rise after the last fall, to the end."""
    start = 0
    for i in range(1, len(series)):
        if series[i][2] < series[i - 1][2]:
            start = i
    while start + 1 < len(series) and series[start + 1][2] == series[start][2]:
        start += 1
    return series[start:]


def find_growth(history: Sequence[Point], confirmed: frozenset[str] = frozenset()) -> list[Growth]:
    """Steadily growing groups of the latest census, fastest first.

    ``confirmed``: devices (``cpu``, ``cuda:0``) whose in-process leak estimate is positive.
    """
    if len(history) < 2:
        return []
    found = []
    for key, (count, nbytes) in history[-1].counts.items():
        run = _rising_run(_series(history, key))
        rises = sum(run[i][2] > run[i - 1][2] for i in range(1, len(run)))
        needed = MIN_RISES_CONFIRMED if key[0] in confirmed else MIN_RISES
        if rises < needed or 2 * rises < len(run) - 1:
            continue
        steps = [float(s) for s, _, _ in run]
        per_step = median_slope(steps, [float(b) for _, _, b in run])
        if per_step <= 0:
            continue
        found.append(
            Growth(
                key=key,
                count=count,
                bytes=nbytes,
                count_per_step=median_slope(steps, [float(c) for _, c, _ in run]),
                bytes_per_step=per_step,
                since_step=run[0][0],
                censuses=len(run),
            )
        )
    return sorted(found, key=lambda g: (-g.bytes_per_step, g.key))
