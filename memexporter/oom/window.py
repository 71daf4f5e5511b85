"""The training thread's side of the trend: a bounded ring of per-step points per device.

The step tracker adds one point per completed step: step number, monotonic wall time (seconds),
baseline (``used`` bytes at the step boundary), peak (highest ``used`` bytes within the step) and
committed (the bytes the limit is met by at the boundary, ``backends.base.committed``). The step's
committed peak is its peak plus what was committed beyond ``used`` at its boundary (stranded in
partly used segments, say). The scrape thread takes an immutable ``snapshot()`` for
``memexporter.oom.trend.estimate``. Warm-up points and restarts are handled here, so the window only
ever holds the current run's steady steps. Warm-up is counted in steps only: a job of 1 ms steps
gets a leak figure after as many steps as a job of 1 s steps.
"""

from __future__ import annotations

import math
import threading
from array import array
from collections import deque
from dataclasses import dataclass

MIB = 1 << 20

MIN_POINTS = 32
"""Post-warm-up points needed before a slope is reported (the capacity, if smaller). The noise
gate's MAD of a few residuals is itself noisy: on simulated Gaussian noise, 16 points pass the
gate in ~2% of windows, 32 points in <0.1%, 48 or more in none of 4000."""

MAX_FIT_POINTS = 256
"""Larger windows are thinned to this many evenly spaced points (both ends kept), so a snapshot
holds the lock for microseconds and an estimate costs ~1 ms whatever the capacity (<= 100 000)."""

RESTART_DROP_FRACTION = 0.25
RESTART_DROP_FLOOR_BYTES = 64.0 * MIB
RESTART_LOOKBACK = 8
"""A baseline more than 25% and more than 64 MiB below the lowest of the last 8 baselines is a
new level (model reloaded, memory freed), far beyond step-to-step noise. The lowest of several,
not the last one, so the fall back to normal after a one-off upward spike is not a restart."""

SETTLE_SECONDS = 5.0
SETTLE_FLOOR_BYTES = 16.0 * MIB
"""While the fit holds points from the first 5 s after start or restart, a rise must exceed 16 MiB
(not 1 MiB) to count. A CPU job's RSS settles per second of work as much as per step (the C heap
and torch's CPU caches grow while the first tensors of each size come and go): at 25 steps/s the
healthy demo crept ~0.1 MiB a step over its first seconds, a few MiB across the window, and one run
in eight read it as a leak. A real leak clears 16 MiB within 100 steps from 0.16 MiB a step, so
fast steps still get their figure in steps, not seconds (issue 34)."""

PEAK_LOOKBACK = 8
"""The ETA's peak level is the highest of the last 8 step peaks: the job OOMs at its highest
peak, not its typical one, and peaks vary with batch shape. 8 steps keep it recent, so a one-off
evaluation spike ages out quickly. It errs towards an earlier ETA, the safe side for a page."""


@dataclass(frozen=True)
class TrendPoints:
    """Immutable copy of a ``TrendWindow``, safe to hand to the scrape thread.

    ``steps``/``times``/``baselines``/``peaks``/``committed``: post-warm-up points, oldest first
    (step number, monotonic seconds, bytes), thinned evenly to ``MAX_FIT_POINTS`` when ``held``
    (points in the window) is larger. ``recent_peaks``/``recent_committed_peaks``: the last
    ``PEAK_LOOKBACK`` step peaks and committed peaks in bytes, warm-up included.
    ``last_baseline``/``last_peak``/``last_committed``/``last_committed_peak``: the last step's
    bytes, None before one.
    ``min_points``: points needed for a slope; ``capacity``: the most the window holds.
    ``restarts``: how often the window was reset.
    """

    steps: tuple[int, ...]
    times: tuple[float, ...]
    baselines: tuple[float, ...]
    peaks: tuple[float, ...]
    held: int
    recent_peaks: tuple[float, ...]
    last_baseline: float | None
    last_peak: float | None
    min_points: int
    restarts: int
    capacity: int = 0
    committed: tuple[float, ...] = ()
    settling: bool = False  # the fit holds points of the first SETTLE_SECONDS: SETTLE_FLOOR_BYTES applies
    recent_committed_peaks: tuple[float, ...] = ()
    last_committed: float | None = None
    last_committed_peak: float | None = None


def even_indices(n: int, m: int) -> list[int]:
    """``m`` evenly spaced indices into ``range(n)``, first and last included (``m`` >= 2)."""
    return [(k * (n - 1) + (m - 1) // 2) // (m - 1) for k in range(m)]


class TrendWindow:
    """Bounded ring buffer of per-step points. ``add()`` is O(1) (about 1 us) and thread-safe.

    The points of the first ``warmup_steps`` steps after start or restart are counted but kept out
    of the fit: allocator and cache warm-up raise the baseline at first. A restart (the step number
    or the time going backwards, or a baseline drop past ``RESTART_DROP_*``) clears the window.
    """

    def __init__(self, capacity: int, warmup_steps: int) -> None:
        for name, value, lo in (("capacity", capacity, 2), ("warmup_steps", warmup_steps, 0)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"memexporter: TrendWindow {name} must be an int, got {value!r}")
            if value < lo:
                raise ValueError(f"memexporter: TrendWindow {name} must be >= {lo}, got {value!r}")
        self.capacity, self.warmup_steps = capacity, warmup_steps
        # Preallocated C arrays and a write index: add() overwrites in place and nothing grows;
        # 40 bytes a point (4 MiB at 100 000), where lists of Python floats take ~160.
        self._rings = (
            array("q", bytes(8 * capacity)),
            array("d", bytes(8 * capacity)),
            array("d", bytes(8 * capacity)),
            array("d", bytes(8 * capacity)),
            array("d", bytes(8 * capacity)),
        )
        self._head = 0  # next slot to write
        self._count = 0  # post-warm-up points held, <= capacity
        self._recent_base: deque[float] = deque(maxlen=RESTART_LOOKBACK)
        self._recent_peak: deque[float] = deque(maxlen=PEAK_LOOKBACK)
        self._recent_committed: deque[float] = deque(maxlen=PEAK_LOOKBACK)  # committed, baseline and peak
        self._recent_committed_peak: deque[float] = deque(maxlen=PEAK_LOOKBACK)
        self._seen = 0  # points since start or restart, warm-up included
        self._first_t = 0.0  # the time of the first of them
        self._last_in_ring = False  # whether the last point went into the ring (past warm-up)
        self._last_step, self._last_t = 0, 0.0
        self._restarts = 0
        # The step hook writes while the scrape thread copies: the lock keeps the rings aligned.
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Post-warm-up points held, at most ``capacity``."""
        return self._count

    @property
    def restarts(self) -> int:
        """How often the window was reset (a restart, or a new level: ``RESTART_DROP_*``)."""
        return self._restarts

    def add(self, step: int, t: float, baseline: float, peak: float, committed: float | None = None) -> None:
        """Record one completed step: ``t`` in monotonic seconds, ``baseline``/``peak``/``committed``
        in bytes (``committed`` None: the same as ``baseline``, as on ``cpu``)."""
        committed = baseline if committed is None else committed
        if not math.isfinite(t + baseline + peak + committed):
            return  # one bad reading must not poison every later median
        committed_peak = peak + max(committed - baseline, 0.0)
        with self._lock:
            if self._seen and (step < self._last_step or t < self._last_t or self._dropped(baseline)):
                self._clear()
            elif self._seen and step == self._last_step:
                # The same step reported twice (manual step() plus a hook): keep the latest
                # reading, and never two equal x values in the fit.
                self._recent_base[-1], self._recent_peak[-1], self._last_t = baseline, peak, t
                self._recent_committed[-1], self._recent_committed_peak[-1] = committed, committed_peak
                if self._last_in_ring:  # -1 wraps
                    _, times, bases, peaks, held = self._rings
                    i = self._head - 1
                    times[i], bases[i], peaks[i], held[i] = t, baseline, peak, committed
                return
            if not self._seen:
                self._first_t = t
            self._last_in_ring = self._seen >= self.warmup_steps
            if self._last_in_ring:
                # Ring first: a step the int64 array refuses raises before any state changed.
                i = self._head
                steps, times, bases, peaks, held = self._rings
                steps[i], times[i], bases[i], peaks[i], held[i] = step, t, baseline, peak, committed
                self._head = i + 1 if i + 1 < self.capacity else 0
                if self._count < self.capacity:
                    self._count += 1
            self._seen += 1
            self._last_step, self._last_t = step, t
            self._recent_base.append(baseline)
            self._recent_peak.append(peak)
            self._recent_committed.append(committed)
            self._recent_committed_peak.append(committed_peak)

    def _dropped(self, baseline: float) -> bool:
        level = min(self._recent_base)
        return level - baseline > max(RESTART_DROP_FRACTION * level, RESTART_DROP_FLOOR_BYTES)

    def _clear(self) -> None:
        # Stale slots keep old values; _count says they are outside the window.
        self._head = self._count = self._seen = 0
        self._last_in_ring = False
        for recent in (self._recent_base, self._recent_peak, self._recent_committed, self._recent_committed_peak):
            recent.clear()
        self._restarts += 1

    def snapshot(self) -> TrendPoints:
        """Immutable copy, oldest point first, thinned to ``MAX_FIT_POINTS`` (see ``TrendPoints``)."""
        with self._lock:
            n, cap = self._count, self.capacity
            start = (self._head - n) % cap
            # Gather at most MAX_FIT_POINTS items: copying a 100 000-point window whole would hold
            # the lock, and so stall the training thread, for milliseconds on every scrape.
            order = even_indices(n, MAX_FIT_POINTS) if n > MAX_FIT_POINTS else range(n)
            slots = [(start + k) % cap for k in order]
            steps, times, bases, peaks, held = self._rings
            return TrendPoints(
                steps=tuple([steps[i] for i in slots]),
                times=tuple([times[i] for i in slots]),
                baselines=tuple([bases[i] for i in slots]),
                peaks=tuple([peaks[i] for i in slots]),
                held=n,
                recent_peaks=tuple(self._recent_peak),
                last_baseline=self._recent_base[-1] if self._recent_base else None,
                last_peak=self._recent_peak[-1] if self._recent_peak else None,
                min_points=min(MIN_POINTS, cap),
                restarts=self._restarts,
                capacity=cap,
                committed=tuple([held[i] for i in slots]),
                settling=bool(slots) and times[slots[0]] - self._first_t < SETTLE_SECONDS,
                recent_committed_peaks=tuple(self._recent_committed_peak),
                last_committed=self._recent_committed[-1] if self._recent_committed else None,
                last_committed_peak=self._recent_committed_peak[-1] if self._recent_committed_peak else None,
            )
