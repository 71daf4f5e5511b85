"""How a step's peak grows with its input: one fit for the live capacity and for ``memexporter sweep``.

The model is ``peak = constant + linear * elements + quadratic * elements * length`` (bytes), where
``elements`` counts the input tensors' elements and ``length`` is dimension 1 of the largest of them.
The linear term is what grows with the batch (activations, logits); the ``elements * length`` term is
attention without a fused kernel, whose scores grow with batch x length²: at a fixed batch, the
square of the length.

Two ways to weigh the points:

- ``robust=True`` (the live fit, ``oom/capacity.py``): iteratively reweighted least squares, Huber
  first (convex: it cannot settle on a wrong minimum) then Tukey's bisquare, both scaled by the
  residuals' MAD. One evaluation spike or one odd step gets weight 0 and moves nothing.
- ``fit_line`` (``sweep/fit.py``): the ordinary least-squares line in exact sums. A sweep's few runs
  are each measured alone, and its own soundness checks judge the residuals.

A term whose coefficient comes out negative is dropped and the rest refitted: memory never shrinks
as the input grows, and a negative curvature is noise that would bend the extrapolation. Without
spread in ``length`` the ``elements * length`` column is the linear one scaled: it is left out.

Two kinds of point (``exact``): where the high-water mark rose, the step's exact peak; otherwise a
detailed step's highest sample (the forward's end), a lower bound, below the peak by what backward
adds. The exact peaks come only with a new record input, so they sit at the largest inputs, above
the samples at smaller ones, and one curve through both reads that gap as curvature (the H200's
GPT: 65 MiB at 4,096 elements read as 184 B per element x length, where its peaks grow ~180 KB an
element and do not bend: the capacity came out 20 % short, the peak at 16 x the largest input seen
10 x too high). So the ``elements * length`` term is fitted only where one kind alone shows
curvature: the exact peaks span the lengths, or the samples' own curvature stands ``CURVATURE_T``
standard errors out of their noise. Otherwise one line goes through both kinds: the samples below
the exact peaks at smaller inputs steepen it, on the safe side (unless the robust weights reject the
exact peaks, a few among many samples: then the line follows the samples, a lower bound, as one
curve through both kinds did before). Neither an offset nor a slope of the
samples' own would do: a constant gap lets the samples, which miss what backward adds per element,
set the slope (the H200's: 165 KB an element against the peaks' ~180; a capacity of 13,127 elements
there, where 12,544 died); a gap growing with the input takes the place of real curvature, whose
peaks also rise faster at the largest inputs (a square law's curvature read 5 x too low). Pure
numpy: the scrape side, the helper-free CLI and the tests call it alike.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["LENGTH_SPREAD", "Fit", "fit", "fit_cached", "fit_line"]

HUBER_K = 1.345
BISQUARE_C = 4.685
"""The usual tuning constants (95 % efficiency on Gaussian noise), in robust sigmas (1.4826 x MAD)."""
ITERATIONS = 12
LENGTH_SPREAD = 1.2
"""The ``elements * length`` term needs the longest length 20 % beyond the shortest: with less, it
cannot be told from the linear one."""
CURVATURE_T = 3.0
"""The samples alone show curvature when their ``elements * length`` coefficient is this many standard
errors above 0 (the H200's GPT, whose peaks do not bend: 0.7 to 2.4 over its first 5 to 7 samples; the
CPU stand-in's square law: 6 to 10)."""

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Fit:
    """``peak = constant + linear * elements + quadratic * elements * length`` in bytes, over ``points``
    points whose inlier residuals have the robust sigma ``sigma`` (bytes); ``max_residual`` is the
    largest absolute residual (bytes) and ``spread`` the range of the peaks (bytes)."""

    constant: float
    linear: float
    quadratic: float
    points: int
    sigma: float
    max_residual: float
    spread: float

    def predict(self, elements: float, length: float) -> float:
        """The peak (bytes) for an input of ``elements`` elements and dimension-1 ``length``."""
        return self.constant + self.linear * elements + self.quadratic * elements * length

    @property
    def slope(self) -> float:
        """Bytes per unit of the first variable (the sweep's line)."""
        return self.linear

    @property
    def intercept(self) -> float:
        return self.constant

    def solve(self, y: float) -> float:
        """Where the line (no quadratic term) reaches ``y`` bytes: the sweep's answer."""
        return (y - self.constant) / self.linear


def _weights(resid: Array, scale: float, bisquare: bool) -> Array:
    if scale <= 0:
        return np.ones_like(resid)
    u = np.abs(resid) / scale
    if bisquare:
        return np.where(u < BISQUARE_C, (1 - (u / BISQUARE_C) ** 2) ** 2, 0.0)
    return np.minimum(1.0, HUBER_K / np.maximum(u, 1e-12))


def _solve(x: Array, y: Array, w: Array) -> Array:
    sw = np.sqrt(w)
    beta, *_ = np.linalg.lstsq(x * sw[:, None], y * sw, rcond=None)
    return np.asarray(beta, dtype=np.float64)


def _mad_sigma(resid: Array) -> float:
    return float(1.4826 * np.median(np.abs(resid - np.median(resid))))


def _irls(x: Array, y: Array, robust: bool) -> tuple[Array, Array]:
    """Coefficients and final weights of ``y ~ x`` (columns scaled to 1 for conditioning)."""
    norms = np.maximum(np.abs(x).max(axis=0), 1e-300)
    xs = x / norms
    w = np.ones_like(y)
    beta = _solve(xs, y, w)
    if robust:
        for i in range(ITERATIONS):
            resid = y - xs @ beta
            scale = _mad_sigma(resid)
            if scale <= 0:  # the points lie on the fit (up to a few outliers): keep those on it
                w = (np.abs(resid) <= 1e-9 * max(float(np.abs(y).max()), 1.0)).astype(np.float64)
                beta = _solve(xs, y, w) if w.sum() >= x.shape[1] else beta
                break
            w = _weights(resid, scale, bisquare=i >= ITERATIONS // 2)
            if w.sum() < x.shape[1]:
                break
            last, beta = beta, _solve(xs, y, w)
            if i > ITERATIONS // 2 and np.allclose(beta, last, rtol=1e-9, atol=0.0):
                break  # the bisquare weights settled: nothing left to move
    return beta / norms, w


@functools.lru_cache(maxsize=8)
def fit_cached(
    elements: tuple[float, ...], lengths: tuple[float, ...], peaks: tuple[float, ...], exact: tuple[int, ...] = ()
) -> Fit | None:
    """``fit(..., robust=True)``, remembered: a scrape and the ``on_oom_risk`` judge fit the same points
    each second, and the points change only when a step's peak is measured (~3 ms a fit of 1 024
    points, on the publisher's thread; hashing them costs ~1 % of that)."""
    return fit(elements, lengths, peaks, exact=exact or None)


def _spread(lengths: Array) -> bool:
    """The longest length is ``LENGTH_SPREAD`` times the shortest (and that is above 0)."""
    shortest = float(lengths.min()) if len(lengths) >= 2 else 0.0
    return shortest > 0 and float(lengths.max()) >= LENGTH_SPREAD * shortest


def _samples_bend(e: Array, ln: Array, y: Array) -> bool:
    """The samples' own ``elements * length`` coefficient is ``CURVATURE_T`` standard errors above 0."""
    if len(y) < 5 or not _spread(ln):
        return False
    x = np.column_stack([np.ones_like(e), e, e * ln])
    beta, w = _irls(x, y, robust=True)
    inliers = w > 0
    xw = (x * np.sqrt(w)[:, None])[inliers]
    sigma = _mad_sigma((y - x @ beta)[inliers])
    variance = float(np.linalg.pinv(xw.T @ xw)[2, 2]) * sigma**2
    return bool(beta[2] > 0 and beta[2] ** 2 >= CURVATURE_T**2 * variance)


def fit(
    elements: Sequence[float],
    lengths: Sequence[float],
    peaks: Sequence[float],
    *,
    robust: bool = True,
    exact: Sequence[int] | None = None,
) -> Fit | None:
    """The fit of ``peaks`` (bytes) against the inputs (module docstring); None with fewer than 2 points.
    ``exact``: 1 where a peak is exact, 0 where it is a sample (a lower bound); None: all exact."""
    e = np.asarray(elements, dtype=np.float64)
    ln = np.asarray(lengths, dtype=np.float64)
    y = np.asarray(peaks, dtype=np.float64)
    if len(y) < 2:
        return None
    columns = [np.ones_like(e), e if float(e.max()) > float(e.min()) else np.zeros_like(e)]
    kind = np.ones(len(y), dtype=bool) if exact is None else np.asarray(exact) == 1
    if len(y) >= 4 and (_spread(ln[kind]) or _samples_bend(e[~kind], ln[~kind], y[~kind])):
        columns.append(e * ln)
    terms = [t for t in range(len(columns)) if t == 0 or columns[t].any()]
    while True:
        beta, w = _irls(np.column_stack([columns[t] for t in terms]), y, robust)
        negative = [k for k in range(1, len(terms)) if beta[k] < 0]
        if not negative:
            break
        terms.pop(max(negative, key=lambda k: terms[k]))  # the highest term first: curvature before slope
    coef = [0.0, 0.0, 0.0]
    for k, t in enumerate(terms):
        coef[t] = float(beta[k])
    model = Fit(coef[0], coef[1], coef[2], len(y), 0.0, 0.0, float(y.max() - y.min()))
    resid = y - np.array([model.predict(a, b) for a, b in zip(e, ln, strict=True)])
    inliers = resid[w > 0] if robust and (w > 0).sum() >= 2 else resid
    sigma = _mad_sigma(inliers) if robust else float(np.sqrt(np.mean(resid**2)))
    return Fit(coef[0], coef[1], coef[2], len(y), sigma, float(np.abs(resid).max()), model.spread)


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> Fit:
    """The least-squares line of ``ys`` (peak bytes) against ``xs`` (``memexporter sweep``), in plain
    sums (a sweep's answer on the limit must not move by the rounding of a matrix solve): slope 0 when
    every ``x`` is the same, and a slope that may be negative (the sweep says the peak does not grow)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    intercept = my - slope * mx
    residual = max(abs(y - (intercept + slope * x)) for x, y in zip(xs, ys, strict=True))
    return Fit(intercept, slope, 0.0, n, 0.0, residual, max(ys) - min(ys))
