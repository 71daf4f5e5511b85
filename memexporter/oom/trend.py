"""Leak rate and time until OOM: pure math on per-step memory points (no torch).

The training thread adds one point per step to a bounded ``TrendWindow`` (oom/window.py): step number, monotonic
wall time (seconds), baseline (``used`` bytes at the step boundary), peak (highest ``used`` bytes
within the step) and committed (the bytes the limit is met by, ``backends.base.committed``). The
scrape thread takes an immutable ``snapshot()`` and calls ``estimate()``: a Theil-Sen slope of the
baseline against steps (bytes/step) and against time (bytes/s), gated on the baseline's own noise
(the leak: what the job's tensors hold), and the seconds until the committed step peak reaches the
limit at the faster of the two trends, the baseline's and the committed bytes' (what runs out: under
the native allocator segments strand memory, and the committed bytes grow faster than the leak).

Why per-step points and a robust slope: raw samples follow the in-step sawtooth, and a least
squares fit is dragged by one evaluation spike; the median of pairwise slopes shrugs off up to
~29% of outlying points.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

# The window lives beside: the tracker builds it, this module reads its snapshots. Re-exported so
# that ``memexporter.oom.trend`` stays the one name for the trend's types.
from memexporter.oom.window import (
    MAX_FIT_POINTS,
    MIB,
    MIN_POINTS,
    PEAK_LOOKBACK,
    SETTLE_FLOOR_BYTES,
    SETTLE_SECONDS,
    TrendPoints,
    TrendWindow,
    even_indices,
)

__all__ = [
    "MAX_FIT_POINTS",
    "MIN_POINTS",
    "NOISE_FLOOR_BYTES",
    "NOISE_SIGMAS",
    "PEAK_LOOKBACK",
    "SETTLE_FLOOR_BYTES",
    "SETTLE_SECONDS",
    "SLOWDOWN",
    "TrendEstimate",
    "TrendPoints",
    "TrendWindow",
    "estimate",
    "rates",
]

Vector: TypeAlias = npt.NDArray[np.float64]

NOISE_SIGMAS = 3.0
NOISE_FLOOR_BYTES = 1.0 * MIB
"""Growth counts only if the fitted rise across the window exceeds both 3 robust sigmas of the
residuals (1.4826 * MAD) and 1 MiB. The floor matters when the allocator rounds to blocks and
the residuals are exactly 0: a drift under 1 MiB over the whole window is not worth a page."""

MAX_AUTOCORRELATION = 0.95
"""The noise band widens at most sqrt(1.95 / 0.05), about 6x, for the smoothest noise."""

SLOWDOWN = 0.5
"""Growth is sustained only if the newest quarter of the window still grows at half the window's
rate or more: a leak keeps its pace, start-up creep slows down and stops."""


@dataclass(frozen=True)
class TrendEstimate:
    """Leak rates in bytes/step and bytes/s (0 until ready or within noise), ETA in seconds (may be
    ``math.inf``), the last step's baseline and peak in bytes (0 before one), points used; the last
    step's committed bytes and committed peak, and the committed bytes' growth in bytes/s."""

    leak_bytes_per_step: float
    leak_bytes_per_second: float
    oom_eta_seconds: float
    baseline_bytes: float
    peak_bytes: float
    samples: int
    committed_bytes: float = 0.0
    committed_peak_bytes: float = 0.0
    committed_bytes_per_second: float = 0.0


def _median(a: Vector) -> float:
    """``np.median`` of a non-empty array of finite values, with the same result: the middle value,
    or the mean of the two middle ones. A selection (``np.partition``) and nothing else: np.median's
    NaN checks and generic reduction cost ~20 us a call: a third to a half of an estimate over 40 to
    64 points (0.33 to 0.18 ms at 40, a leaking window), a tenth at 200 (0.76 to 0.69 ms, a flat
    one). Estimates run a few times a second in the exporter's thread, and at every step of a replay."""
    k, odd = divmod(a.size, 2)
    if odd:
        return float(np.partition(a, k)[k])
    low, high = np.partition(a, (k - 1, k))[k - 1 : k + 1]
    return float((low + high) / 2)


def _median_slope(dy: Vector, dx: Vector) -> float:
    """Theil-Sen: the median of the pairwise slopes dy/dx over pairs with dx > 0 (0 if none)."""
    keep = dx > 0  # equal times (a coarse clock) carry no slope
    return _median(dy[keep] / dx[keep]) if keep.any() else 0.0


def _is_significant(x: Vector, y: Vector, slope: float, floor: float = NOISE_FLOOR_BYTES) -> bool:
    """Whether the fitted rise over the window stands out of the residuals' robust noise and ``floor``."""
    resid = y - slope * x
    resid -= _median(resid)
    sigma = 1.4826 * _median(np.abs(resid))  # MAD scaled to a Gaussian sigma
    rise = abs(slope * float(x[-1] - x[0]))
    return rise > max(NOISE_SIGMAS * sigma * _inflation(resid, sigma), floor)


def _inflation(resid: Vector, sigma: float) -> float:
    """How much wider the noise band is because neighbouring residuals move together.

    A CPU job's RSS is a sawtooth: the C heap grows for tens of steps, then returns memory to the
    OS at once. Its residuals are not independent: a window that starts at a drop and ends at a
    tooth's top rises far more than independent noise of the same MAD would. For noise whose
    lag-1 autocorrelation is rho, n points weigh like n (1 - rho) / (1 + rho) independent ones,
    so the band widens by sqrt((1 + rho) / (1 - rho)): 1 for independent noise, 3 at rho = 0.8.
    rho comes from the von Neumann ratio, 1 - var(step-to-step change) / (2 var), both variances
    from MADs, so the sawtooth's rare drops and one-off spikes do not move it. A window that
    spans many teeth averages them out, so the widening stops at sqrt(n / MIN_INDEPENDENT_POINTS).
    """
    if sigma <= 0 or len(resid) < 3:
        return 1.0
    diff_sigma = 1.4826 * _median(np.abs(np.diff(resid)))
    rho = min(max(1.0 - diff_sigma**2 / (2 * sigma**2), 0.0), MAX_AUTOCORRELATION)
    return math.sqrt((1 + rho) / (1 - rho))


@functools.lru_cache(maxsize=8)
def _pairs(n: int) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """All index pairs i < j of ``n`` points (``np.triu_indices``), read-only and cached: a running
    fit has the same few sizes at every scrape (its window, the window's halves and quarters), and
    building them was a fifth of an estimate's time. At most 8 sizes of at most MAX_FIT_POINTS."""
    i, j = np.triu_indices(n, k=1)
    i.flags.writeable = j.flags.writeable = False
    return i, j


def _pair_slope(x: Vector, y: Vector) -> float:
    """Theil-Sen slope of ``y`` against ``x``."""
    i, j = _pairs(len(y))
    return _median_slope(y[j] - y[i], x[j] - x[i])


def _sustained(x: Vector, y: Vector, slope: float) -> bool:
    """Whether the growth keeps its pace: the newer half and the newest quarter of the window
    each move at ``SLOWDOWN`` of the whole window's rate or more, in the same direction.

    A leak keeps growing at its pace; start-up creep (glibc arenas, the caching allocator filling
    its pools) grows fast and then flattens, which a whole-window slope still reads as a small,
    significant rise. On the CPU demo that rise was ~0.1 MiB/step, an ETA of hours on a healthy
    job. Requiring the recent points to keep the pace keeps the current trend, not the start-up,
    in charge; a leak that starts part-way through the window grows faster at the end, and passes.
    """
    half, quarter = len(y) // 2, len(y) - len(y) // 4
    return (
        _pair_slope(x[half:], y[half:]) / slope >= SLOWDOWN
        and _pair_slope(x[quarter:], y[quarter:]) / slope >= SLOWDOWN
    )


def rates(points: TrendPoints, values: tuple[float, ...]) -> tuple[float, float]:
    """Gated Theil-Sen slopes of ``values`` (one per point) in bytes/step and bytes/s: both 0 below
    ``points.min_points`` points, within noise, or when the growth does not keep its pace."""
    n = len(points.steps)
    if points.held < points.min_points or n < 2:
        return 0.0, 0.0
    # Hand-built points may be unthinned; O(n^2) pairs must stay bounded.
    idx = even_indices(n, MAX_FIT_POINTS) if n > MAX_FIT_POINTS else list(range(n))
    x_step = np.asarray(points.steps, dtype=np.float64)[idx]
    x_time = np.asarray(points.times, dtype=np.float64)[idx]
    y = np.asarray(values, dtype=np.float64)[idx]
    i, j = _pairs(len(y))  # all pairs i < j, shared by both axes
    dy = y[j] - y[i]
    per_step = _median_slope(dy, x_step[j] - x_step[i])
    # One gate for both rates, on the step axis: the same series, and steps are the steadier
    # axis (an evaluation pause stretches time, not steps).
    floor = SETTLE_FLOOR_BYTES if points.settling else NOISE_FLOOR_BYTES
    if not (_is_significant(x_step, y, per_step, floor) and _sustained(x_step, y, per_step)):
        return 0.0, 0.0
    return per_step, _median_slope(dy, x_time[j] - x_time[i])


def estimate(points: TrendPoints, limit_bytes: float | None) -> TrendEstimate:
    """Leak rate (bytes/step, bytes/s) and seconds until the committed step peak reaches ``limit_bytes``.

    Rates are 0 below ``points.min_points`` points and when the rise is within noise
    (``NOISE_*``); a shrinking baseline gives a negative rate. The ETA is 0 once the committed peak
    level (the highest of the last ``PEAK_LOOKBACK`` committed step peaks) reaches the limit,
    ``math.inf`` when ``limit_bytes`` is None or memory is not growing, else
    ``(limit_bytes - peak level) / bytes per second``, at the faster of the baseline's growth and
    the committed bytes' (each gated alike).
    """
    leak = per_step, per_second = rates(points, points.baselines)
    same = not points.committed or points.committed == points.baselines  # cpu, cudaMallocAsync
    held = leak if same else rates(points, points.committed)
    growth = max((rate for steps, rate in (leak, held) if steps > 0 and rate > 0), default=0.0)
    peaks = points.recent_committed_peaks or points.recent_peaks
    eta = math.inf
    if limit_bytes is not None and peaks:
        peak_level = max(peaks)
        if peak_level >= limit_bytes:
            eta = 0.0
        elif growth > 0:
            eta = (limit_bytes - peak_level) / growth
    last_peak = points.last_peak if points.last_peak is not None else 0.0
    last_base = points.last_baseline if points.last_baseline is not None else 0.0
    return TrendEstimate(
        leak_bytes_per_step=per_step,
        leak_bytes_per_second=per_second,
        oom_eta_seconds=eta,
        baseline_bytes=last_base,
        peak_bytes=last_peak,
        samples=points.held,
        committed_bytes=points.last_committed if points.last_committed is not None else last_base,
        committed_peak_bytes=points.last_committed_peak if points.last_committed_peak is not None else last_peak,
        committed_bytes_per_second=held[1],
    )
