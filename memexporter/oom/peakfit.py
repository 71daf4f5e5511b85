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
Pure numpy: the scrape side, the helper-free CLI and the tests call it alike.
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
def fit_cached(elements: tuple[float, ...], lengths: tuple[float, ...], peaks: tuple[float, ...]) -> Fit | None:
    """``fit(..., robust=True)``, remembered: a scrape and the ``on_oom_risk`` judge fit the same points
    each second, and the points change only when a step's peak is measured (~3 ms a fit of 1 024
    points, on the publisher's thread; hashing them costs ~1 % of that)."""
    return fit(elements, lengths, peaks)


def fit(
    elements: Sequence[float], lengths: Sequence[float], peaks: Sequence[float], *, robust: bool = True
) -> Fit | None:
    """The fit of ``peaks`` (bytes) against the inputs (module docstring); None with fewer than 2 points."""
    e = np.asarray(elements, dtype=np.float64)
    ln = np.asarray(lengths, dtype=np.float64)
    y = np.asarray(peaks, dtype=np.float64)
    if len(y) < 2:
        return None
    columns = [np.ones_like(e), e if float(e.max()) > float(e.min()) else np.zeros_like(e)]
    if len(y) >= 4 and float(ln.min()) > 0 and float(ln.max()) >= LENGTH_SPREAD * float(ln.min()):
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
