"""``max_fit``: the largest configuration that fits, as measured and as a line through the peaks predicts.

The prediction is a least-squares line of peak bytes against the first axis, through the runs of
one series (the other axes fixed) that fit, solved for the limit: ``oom/peakfit.py``, the same fit
as the live job's input capacity (``oom/capacity.py``), without its robust weights. It is given only when the fit
is *sound*, that is:

1. the first axis is numeric and a limit is known;
2. at least ``MIN_POINTS`` runs of the series fit (two points always lie on a line: a third checks it);
3. the peak grows along the axis (slope > 0);
4. the peaks lie on the line: no run is further from it than ``MAX_RESIDUAL`` of the spread of the
   peaks (a curve, such as attention's seq², fails this, and a line would overshoot it);
5. the answer is at most twice the largest size that fit, or one measured span past it, whichever
   is further (further out is a guess), and agrees with what was measured: at or above the largest
   size that fit, below the smallest that ran out of memory.

Otherwise ``predicted`` is ``null`` and ``reason`` says which condition failed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from memexporter.oom.peakfit import Fit, fit_line
from memexporter.sweep.grid import Axis
from memexporter.sweep.runner import Run, Sweep
from memexporter.units import MiB

MIN_POINTS = 3
MAX_RESIDUAL = 0.05


@dataclass(frozen=True)
class Prediction:
    """The first axis's largest value that fits, for one series (``others``: the other axes' values)."""

    others: dict[str, str]
    value: int | float | None
    reason: str | None
    line: Fit | None = None


def predict(axis: Axis, runs: Sequence[Run], limit: float | None, others: dict[str, str]) -> Prediction:
    """Where the line through one series' fitting ``runs`` reaches ``limit`` bytes on the first axis, or
    None and the condition that failed (see the module doc); ``others``: the series' other axes."""

    def no(reason: str, line: Fit | None = None) -> Prediction:
        return Prediction(others, None, reason, line)

    if not axis.numeric:
        return no(f"the first axis, {axis.name}, is not numeric")
    if limit is None:
        return no("no limit is known (no run reported memexporter_memory_limit_bytes; give --limit-mib)")
    points = sorted((axis.key(r.params[axis.name]), r.peak_bytes) for r in runs if r.fits and r.peak_bytes)
    if len(points) < MIN_POINTS:
        return no(f"{len(points)} run(s) fit; a fit needs {MIN_POINTS} to check that the peak is linear in {axis.name}")
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    line = fit_line(xs, ys)
    if line.slope <= 0:
        return no(f"the peak does not grow with {axis.name}", line)
    if line.max_residual > MAX_RESIDUAL * line.spread:
        return no(
            f"the peak is not linear in {axis.name}: a run is {line.max_residual / MiB:.1f} MiB off the line, "
            f"over {MAX_RESIDUAL:.0%} of the peaks' spread ({line.spread / MiB:.1f} MiB)",
            line,
        )
    x = line.solve(limit)
    reach = xs[-1] + max(xs[-1] - xs[0], abs(xs[-1]))
    if x > reach:
        return no(
            f"the line reaches the limit at {axis.name}={x:.4g}, beyond {reach:g} (twice the largest size that "
            "fit, or one measured span past it): too far to extrapolate; extend the grid",
            line,
        )
    value: int | float = math.floor(x) if axis.integer else x
    if value < xs[-1]:
        return no(f"the line puts the limit below {axis.name}={xs[-1]:g}, which was measured to fit", line)
    oom = [axis.key(r.params[axis.name]) for r in runs if r.oom]
    if oom and value >= min(oom):
        return no(f"the line says {axis.name}={value:g} fits, but {axis.name}={min(oom):g} ran out of memory", line)
    return Prediction(others, value, None, line)


@dataclass(frozen=True)
class MaxFit:
    """``max_fit``'s answer: the largest run that fits, the prediction for its series, and every series'."""

    measured: dict[str, str] | None  # params of the largest run that fits
    predicted: Prediction  # for the series of the measured run (the first series when none fits)
    series: list[Prediction]


def max_fit(sweep: Sweep) -> MaxFit:
    """The largest run that fits (by the first axis, then the next...) and each series' prediction."""
    axes = sweep.axes
    first, rest = axes[0], [a.name for a in axes[1:]]
    fits = [r for r in sweep.runs if r.fits]
    best = max(fits, key=lambda r: tuple(a.key(r.params[a.name]) for a in axes), default=None)
    groups: dict[tuple[str, ...], list[Run]] = {}
    for r in sweep.runs:
        groups.setdefault(tuple(r.params[n] for n in rest), []).append(r)
    series = [
        predict(first, runs, sweep.limit_bytes, dict(zip(rest, key, strict=True))) for key, runs in groups.items()
    ]
    if not series:
        series = [Prediction({}, None, "nothing was measured")]
    key = tuple(best.params[n] for n in rest) if best is not None else None
    top = next((p for p in series if tuple(p.others.values()) == key), series[0])
    return MaxFit(dict(best.params) if best is not None else None, top, series)
