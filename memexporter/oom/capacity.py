"""The largest input that fits: learned from the job's own steps, off the training thread.

The training thread keeps, per device, the input size of each step whose peak was measured, that
peak and its step (``tracking/inputs.py``). Here, on the publisher's thread (a scrape, the
``on_oom_risk`` judge), ``oom/peakfit.py`` fits the peaks against the input, robustly, exact peaks
told from samples (``InputPoints.exact``), and the capacity is where the predicted committed step
peak meets the limit:

    fit(E, E / k) + stranded now = limit,   k = elements per unit of length at the largest input

that is, growing the input with the job's own mix of batch and length (at a fixed batch, the length
grows with the elements). Each peak is first carried to now along the leak (the baseline's robust
slope per step, ``oom/trend.py``), so a slow leak does not read as a peak that falls with the input;
what is stranded in partly used segments now (committed minus used) is added to the prediction.
The peaks are absolute, not above each step's start: on the host, memory freed by one step stays
resident into the next, and only the high-water mark says how far a step went.

No claim without spread (``CapacityGates``): at least ``min_points`` measured steps over at least
``min_sizes`` distinct sizes, the largest ``min_spread`` times the smallest, and a rise across them
that stands out of the residuals' noise (3 robust sigmas, and 1 MiB). One shape, a few close sizes,
or a peak that does not follow the input: no capacity (the series is absent), no warning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memexporter.oom.peakfit import Fit, fit_cached
from memexporter.units import MiB

__all__ = ["NEAR", "Capacity", "CapacityGates", "InputPoints", "InputSnapshot", "capacity", "devices", "in_words"]

NEAR = 0.10
"""The largest input seen within 10 % of the capacity is a warning: the next longer batch may not fit."""
NOISE_SIGMAS = 3.0
NOISE_FLOOR_BYTES = 1.0 * MiB


@dataclass(frozen=True)
class InputPoints:
    """One device's points for the fit: the inputs' elements and lengths, each step's measured peak
    (bytes: ``used``'s, not committed), the step it ended at, and ``exact``: 1 where the high-water
    mark rose (the peak is exact), 0 for a detailed step's highest sample (a lower bound)."""

    elements: tuple[float, ...]
    lengths: tuple[float, ...]
    peaks: tuple[float, ...]
    steps: tuple[int, ...]
    exact: tuple[int, ...]


@dataclass(frozen=True)
class InputSnapshot:
    """For the scrape side: the last completed step's input, the largest seen and the largest before
    it (elements; lengths and batch at the largest), and each device's points."""

    last_elements: int
    largest_elements: int
    largest_length: int
    largest_batch: int
    before_largest: int
    devices: dict[str, InputPoints]


@dataclass(frozen=True)
class CapacityGates:
    """When a fit may claim a capacity (module docstring)."""

    min_points: int = 8
    min_sizes: int = 3
    min_spread: float = 1.5


@dataclass(frozen=True)
class Capacity:
    """``device``'s capacity: ``elements`` (the largest input whose predicted committed step peak fits
    ``limit`` bytes), the marginal ``bytes_per_element`` at the largest input seen, the largest seen
    (``largest`` elements, ``length`` and ``batch`` at it), ``declared`` (``max_input_elements``,
    None when not set) and the ``fit`` (peak bytes against the input, carried to now along the leak)."""

    device: str
    elements: float
    bytes_per_element: float
    largest: int
    length: int
    batch: int
    declared: int | None
    limit: float
    fit: Fit

    @property
    def declared_fits(self) -> bool:
        return self.declared is None or self.declared <= self.elements

    @property
    def near(self) -> bool:
        """The largest input seen is within ``NEAR`` of the capacity (or beyond it)."""
        return self.largest >= (1 - NEAR) * self.elements

    def describe(self) -> str:
        """One line for the live page, ``top``, ``inspect`` and the log (``in_words``)."""
        return in_words(self.elements, self.largest, self.length, self.batch, self.declared)

    def after(self, freed: float, scales: bool) -> float:
        """The capacity (elements) once a lever frees ``freed`` bytes at the step peak of the largest
        input seen: bytes that follow the input (``scales``: activations) lower the fit's slope by
        ``freed / largest``; others lower the peak by ``freed`` at every size (``oom/levers.py``)."""
        k = self.largest / self.length if self.length else math.inf
        a = self.fit.quadratic / k if math.isfinite(k) else 0.0
        b = self.fit.linear
        c = -(a * self.elements**2 + b * self.elements)  # the solve's constant: zero at the capacity
        if scales and self.largest:
            return _solve(a, max(b - freed / self.largest, 0.0), c)
        return _solve(a, b, c - freed)


def in_words(capacity: float, largest: float, length: float, batch: float, declared: float | None) -> str:
    """``the largest input that fits: 2,668 elements (667 long at batch 4); seen 1,280; declared 4,096: will
    not fit``: the capacity (elements), with the length that fits at the largest input's batch (the job's
    mix kept: elements per unit of length), the largest seen and the declared maximum (None: not set).
    Shared by the surfaces that read the series (the live page, ``top``, ``inspect``)."""
    fits = int(capacity * length / largest) if largest and length else 0
    shape = f" ({fits:,} long at batch {int(batch):,})" if fits and batch else f" ({fits:,} long)" if fits else ""
    text = f"the largest input that fits: {int(capacity):,} elements{shape}; seen {int(largest):,}"
    if declared is not None:
        return text + f"; declared {int(declared):,}: " + ("fits" if declared <= capacity else "will not fit")
    return text + (f": within {NEAR:.0%} of it" if largest >= (1 - NEAR) * capacity else "")


def _solve(a: float, b: float, c: float) -> float:
    """The positive root of ``a x² + b x + c = 0`` (a, b >= 0); 0 when even x = 0 is over, inf when none."""
    if c >= 0:
        return 0.0
    if a > 0:
        return (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)
    return -c / b if b > 0 else math.inf


def capacity(
    device: str,
    points: InputPoints,
    snap: InputSnapshot,
    now: tuple[int, float, float],
    limit: float,
    declared: int | None = None,
    gates: CapacityGates = CapacityGates(),
) -> Capacity | None:
    """``device``'s capacity against ``limit`` bytes, or None when the gates do not hold (module
    docstring). ``now``: the step count, the leak (bytes per step) and the bytes stranded now."""
    es = points.elements
    if len(es) < gates.min_points or len(set(es)) < gates.min_sizes or not snap.largest_elements:
        return None
    if max(es) < gates.min_spread * min(es):
        return None
    step, leak, stranded = now
    peaks = tuple(p + max(leak, 0.0) * (step - s) for p, s in zip(points.peaks, points.steps, strict=True))
    got = fit_cached(es, points.lengths, peaks, points.exact)
    if got is None or (got.linear <= 0 and got.quadratic <= 0):
        return None
    lo, hi = min(range(len(es)), key=es.__getitem__), max(range(len(es)), key=es.__getitem__)
    rise = got.predict(es[hi], points.lengths[hi]) - got.predict(es[lo], points.lengths[lo])
    if rise <= max(NOISE_SIGMAS * got.sigma, NOISE_FLOOR_BYTES):
        return None
    largest, length = snap.largest_elements, snap.largest_length
    k = largest / length if length else math.inf  # elements per unit of length at the largest input
    a = got.quadratic / k if math.isfinite(k) else 0.0
    elements = _solve(a, got.linear, stranded + got.constant - limit)
    if not math.isfinite(elements):
        return None
    per_element = got.linear + 2 * a * largest
    return Capacity(device, elements, per_element, largest, length, snap.largest_batch, declared, limit, got)


def devices(names: list[str]) -> list[str]:
    """The devices the job trains on, whose capacity counts: the accelerators, else ``cpu`` (a GPU job's
    host memory follows its input too little to bound it, and its warnings would be noise)."""
    accelerators = [n for n in names if n != "cpu"]
    return accelerators or [n for n in names if n == "cpu"]
