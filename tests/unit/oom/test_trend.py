"""Unit tests for memexporter.oom.trend on SYNTHETIC per-step traces (generated here, not measured).

Each trace is a list of (step, t seconds, baseline bytes, peak bytes) fed to a ``TrendWindow``;
the tests assert the estimate's real values against the trace's known leak.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
import pytest

from memexporter.oom.trend import MAX_FIT_POINTS, MIN_POINTS, TrendEstimate, TrendWindow, _median, estimate

MIB = float(1 << 20)
GIB = 1024 * MIB
Point = tuple[int, float, float, float]


def feed(points: Iterable[Point], capacity: int = 200, warmup: int = 20) -> TrendWindow:
    w = TrendWindow(capacity, warmup)
    for p in points:
        w.add(*p)
    return w


def synthetic(
    n: int,
    base: Callable[[int], float],
    gap: Callable[[int], float] = lambda s: 512 * MIB,
    dt: float = 0.5,
    first: int = 0,
) -> list[Point]:
    """Steps first..first+n-1, one every ``dt`` s; peak = baseline + gap(step)."""
    return [(s, s * dt, base(s), base(s) + gap(s)) for s in range(first, first + n)]


def leak(per_step: float, level: float = 1 * GIB) -> Callable[[int], float]:
    return lambda s: level + per_step * s


def noisy(sigma: float, seed: int, f: Callable[[int], float]) -> Callable[[int], float]:
    noise = np.random.default_rng(seed).normal(0.0, sigma, 100_000)
    return lambda s: f(s) + float(noise[s])


def assert_flat(est: TrendEstimate) -> None:
    assert est.leak_bytes_per_step == 0.0
    assert est.leak_bytes_per_second == 0.0
    assert est.oom_eta_seconds == math.inf


# --- leaks the estimate must measure: (id, trace, per step, per second, tolerance) ----------------
SAWTOOTH = synthetic(300, lambda s: 2 * GIB + 2 * MIB * s + 4 * MIB * (s % 10), lambda s: (100 + 50 * (s % 7)) * MIB)
SPIKES = {100: 3 * GIB, 101: 3 * GIB, 180: 6 * GIB}  # one-off evaluation spikes, baseline and peak
LEAKS = [
    ("linear 8 MiB/step at 0.5 s/step", synthetic(300, leak(8 * MIB)), 8 * MIB, 16 * MIB, 0.01),
    ("sawtooth peak and baseline plus 2 MiB/step", SAWTOOTH, 2 * MIB, 4 * MIB, 0.02),
    (
        "leak with one-off spikes",
        [(s, t, b + SPIKES.get(s, 0), p + SPIKES.get(s, 0)) for s, t, b, p in synthetic(300, leak(8 * MIB))],
        8 * MIB,
        16 * MIB,
        0.01,
    ),
    (
        "tiny leak 64 KiB/step in 256 KiB noise",
        synthetic(300, noisy(0.25 * MIB, 1, leak(MIB / 16))),
        MIB / 16,
        MIB / 8,
        0.1,
    ),
    ("tiny noiseless leak 16 KiB/step", synthetic(300, leak(MIB / 64)), MIB / 64, MIB / 32, 0.01),
    ("shrinking 4 MiB/step", synthetic(300, leak(-4 * MIB, 4 * GIB)), -4 * MIB, -8 * MIB, 0.01),
]


@pytest.mark.parametrize(("trace", "per_step", "per_second", "tol"), [c[1:] for c in LEAKS], ids=[c[0] for c in LEAKS])
def test_leak_rate_and_eta(trace: list[Point], per_step: float, per_second: float, tol: float) -> None:
    limit = 16 * GIB
    w = feed(trace)
    est = estimate(w.snapshot(), limit)
    assert est.leak_bytes_per_step == pytest.approx(per_step, rel=tol)
    assert est.leak_bytes_per_second == pytest.approx(per_second, rel=tol)
    assert est.samples == 200
    _, _, last_base, last_peak = trace[-1]
    assert (est.baseline_bytes, est.peak_bytes) == (last_base, last_peak)
    peak_level = max(p for *_, p in trace[-8:])
    if per_step > 0:
        assert est.oom_eta_seconds == pytest.approx((limit - peak_level) / per_second, rel=tol)
    else:
        assert est.oom_eta_seconds == math.inf


def test_linear_leak_eta_is_exact() -> None:
    # 300 steps: last peak = 1 GiB + 299 * 8 MiB + 512 MiB; 16 MiB/s to a 16 GiB limit.
    est = estimate(feed(synthetic(300, leak(8 * MIB))).snapshot(), 16 * GIB)
    assert est.oom_eta_seconds == pytest.approx((16 * GIB - (1 * GIB + 299 * 8 * MIB + 512 * MIB)) / (16 * MIB))


# --- traces that must read "not growing": slope 0, ETA +Inf -----------------------------------------
def warmup_then_flat(s: int) -> float:
    return 1 * GIB + 50 * MIB * min(s, 20)  # allocator warm-up: steep for 20 steps, then flat


FLAT = (
    [(f"warm-up then flat, at step {n - 1}", synthetic(n, warmup_then_flat)) for n in (20 + MIN_POINTS, 60, 100, 300)]
    + [
        (f"gaussian noise sigma 2 MiB, seed {seed}", synthetic(400, noisy(2 * MIB, seed, lambda s: 4 * GIB)))
        for seed in range(10)
    ]
    + [
        (
            "flat with one-off spikes",
            [(s, t, b + SPIKES.get(s, 0), p + SPIKES.get(s, 0)) for s, t, b, p in synthetic(300, lambda s: 2 * GIB)],
        ),
        ("noiseless 4 KiB/step: under the 1 MiB floor", synthetic(300, leak(MIB / 256))),
        ("31 post-warm-up points of a steep leak", synthetic(20 + MIN_POINTS - 1, leak(64 * MIB))),
        ("no steps at all", []),
    ]
)


@pytest.mark.parametrize("trace", [c[1] for c in FLAT], ids=[c[0] for c in FLAT])
def test_not_growing(trace: list[Point]) -> None:
    assert_flat(estimate(feed(trace).snapshot(), 64 * GIB))


def test_noise_stays_flat_at_every_window_fill() -> None:
    # Small windows are where a MAD noise scale is least reliable; check each scrape-like point.
    for seed in range(10):
        w = TrendWindow(200, 20)
        for i, p in enumerate(synthetic(400, noisy(2 * MIB, seed, lambda s: 4 * GIB))):
            w.add(*p)
            if i >= 20 + MIN_POINTS - 1 and i % 5 == 0:
                assert estimate(w.snapshot(), 8 * GIB).leak_bytes_per_step == 0.0, (seed, i)


def test_warmup_ramp_is_not_a_leak_by_either_guard() -> None:
    # Two guards keep a warm-up ramp from reading as a leak. Without the warm-up skip, the
    # sustained-growth check still sees the newer half of the window flat...
    trace = synthetic(20 + MIN_POINTS, warmup_then_flat)
    assert estimate(feed(trace, warmup=0).snapshot(), None).leak_bytes_per_step == 0.0
    # ...and with the skip, the ramp never enters the window at all.
    est = estimate(feed(trace, warmup=20).snapshot(), None)
    assert (est.leak_bytes_per_step, est.samples) == (0.0, MIN_POINTS)


def test_ramp_that_continues_into_the_newer_half_is_growth() -> None:
    # The sustained check must not hide a leak that starts part-way through the window.
    trace = synthetic(120, lambda s: 1 * GIB + 4 * MIB * max(0, s - 40))
    est = estimate(feed(trace, warmup=0).snapshot(), None)
    assert est.leak_bytes_per_step > 2 * MIB


def test_decelerating_creep_is_not_a_leak_but_the_same_noise_with_a_leak_is() -> None:
    # SYNTHETIC, shaped like the CPU demo's RSS: +40 MiB creeping in ever more slowly over the
    # first ~150 steps (allocator arenas filling), with 2 MiB of noise. Whole-window slope is
    # positive and beyond noise, but the newer half is flat: no leak, no ETA.
    creep = noisy(2 * MIB, 7, lambda s: 1 * GIB + 40 * MIB * (1 - math.exp(-s / 50)))
    est = estimate(feed(synthetic(220, creep)).snapshot(), 64 * GIB)
    assert est.leak_bytes_per_step == 0.0
    assert est.oom_eta_seconds == math.inf
    steady = noisy(2 * MIB, 7, lambda s: 1 * GIB + 0.5 * MIB * s)
    est = estimate(feed(synthetic(220, steady)).snapshot(), 64 * GIB)
    assert est.leak_bytes_per_step == pytest.approx(0.5 * MIB, rel=0.1)


def test_min_points_boundary() -> None:
    assert_flat(estimate(feed(synthetic(20 + MIN_POINTS - 1, leak(8 * MIB))).snapshot(), 64 * GIB))
    est = estimate(feed(synthetic(20 + MIN_POINTS, leak(8 * MIB))).snapshot(), 64 * GIB)
    assert est.leak_bytes_per_step == pytest.approx(8 * MIB)
    assert math.isfinite(est.oom_eta_seconds)


# --- restarts ---------------------------------------------------------------------------------------
RESTARTS = [
    # Step counter and memory drop: a new run at step 0 leaking 2 MiB/step from 1 GiB.
    ("step and memory drop", synthetic(200, leak(8 * MIB)) + synthetic(100, leak(2 * MIB), first=0, dt=0.5), 2 * MIB),
    # Memory drops by 1.6 GiB while the step counter goes on (model reloaded): then flat.
    ("memory drop only", synthetic(200, leak(8 * MIB)) + synthetic(100, lambda s: 1 * GIB, first=200), 0.0),
]


@pytest.mark.parametrize(("trace", "per_step"), [c[1:] for c in RESTARTS], ids=[c[0] for c in RESTARTS])
def test_restart_resets_the_window(trace: list[Point], per_step: float) -> None:
    # The step-drop trace restarts its clock too (t = step * 0.5), which is also a restart signal;
    # shift it so only the step and memory drop remain.
    trace = [(s, i * 0.5, b, p) for i, (s, _, b, p) in enumerate(trace)]
    snap = feed(trace).snapshot()
    assert snap.restarts == 1
    assert snap.held == 100 - 20  # warm-up applies again after the restart
    assert min(snap.steps) >= trace[200][0] + 20
    est = estimate(snap, 16 * GIB)
    assert est.leak_bytes_per_step == pytest.approx(per_step, rel=0.01)
    assert est.leak_bytes_per_second == pytest.approx(2 * per_step, rel=0.01)
    assert math.isfinite(est.oom_eta_seconds) == (per_step > 0)


@pytest.mark.parametrize(
    ("step", "t", "baseline"),
    [(0, 200.0, 2 * GIB), (100, 50.0, 2 * GIB), (100, 200.0, 1 * GIB), (100, 200.0, 2 * GIB)],
    ids=["step backwards only", "time backwards only", "baseline drop only", "none: no restart"],
)
def test_each_restart_signal_alone(step: int, t: float, baseline: float) -> None:
    # 100 flat steps at 2 GiB (steps 0..99, t 0..99 s), then one point that differs in one way.
    w = feed(synthetic(100, lambda s: 2 * GIB, dt=1.0))
    w.add(step, t, baseline, baseline + GIB)
    restarted = (step, t, baseline) != (100, 200.0, 2 * GIB)
    assert w.snapshot().restarts == int(restarted)
    assert len(w) == (0 if restarted else 81)


def test_right_after_restart_reads_zero_until_warm() -> None:
    trace = synthetic(200, leak(8 * MIB)) + [(s, 100 + t, b, p) for s, t, b, p in synthetic(30, leak(8 * MIB))]
    snap = feed(trace).snapshot()
    assert (snap.restarts, snap.held) == (1, 10)
    assert_flat(estimate(snap, 64 * GIB))


def test_spikes_and_noise_are_not_restarts() -> None:
    spiky = [(s, t, b + SPIKES.get(s, 0), p) for s, t, b, p in synthetic(300, lambda s: 2 * GIB)]
    assert feed(spiky).snapshot().restarts == 0
    assert feed(synthetic(400, noisy(2 * MIB, 0, lambda s: 4 * GIB))).snapshot().restarts == 0
    assert feed(synthetic(300, leak(-4 * MIB, 4 * GIB))).snapshot().restarts == 0  # gradual shrink


# --- ETA edge cases ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("trace", "limit", "eta"),
    [
        (synthetic(300, leak(8 * MIB)), None, math.inf),  # no limit known
        (synthetic(300, lambda s: 3 * GIB, lambda s: 1 * GIB), 4 * GIB, 0.0),  # flat, peak at the limit
        (synthetic(300, leak(8 * MIB)), 2 * GIB, 0.0),  # leaking, peak already past the limit
        (synthetic(10, lambda s: 3 * GIB, lambda s: 2 * GIB), 4 * GIB, 0.0),  # still warming up
        (synthetic(300, lambda s: 3 * GIB, lambda s: 1 * GIB - 1), 4 * GIB, math.inf),  # 1 byte short, flat
    ],
    ids=["limit None", "flat peak at limit", "peak over limit", "peak at limit in warm-up", "flat below limit"],
)
def test_eta_edges(trace: list[Point], limit: float | None, eta: float) -> None:
    assert estimate(feed(trace).snapshot(), limit).oom_eta_seconds == eta


def test_limit_none_still_reports_the_rate() -> None:
    est = estimate(feed(synthetic(300, leak(8 * MIB))).snapshot(), None)
    assert est.leak_bytes_per_step == pytest.approx(8 * MIB)


def test_eta_uses_highest_recent_peak() -> None:
    # One tall peak 3 steps ago sets the level for 8 steps, then ages out.
    base = synthetic(300, leak(8 * MIB))
    tall = [(s, t, b, p + (1 * GIB if s == 296 else 0)) for s, t, b, p in base]
    limit = 16 * GIB
    assert estimate(feed(tall).snapshot(), limit).oom_eta_seconds == pytest.approx((limit - tall[296][3]) / (16 * MIB))
    aged = tall + synthetic(8, leak(8 * MIB), first=300)
    assert estimate(feed(aged).snapshot(), limit).oom_eta_seconds == pytest.approx((limit - aged[-1][3]) / (16 * MIB))


# --- bounds and input hygiene -----------------------------------------------------------------------
@pytest.mark.parametrize("capacity", [50, 200, 1000])
def test_capacity_bound(capacity: int) -> None:
    w = feed(synthetic(10 * capacity, leak(1 * MIB)), capacity=capacity)
    snap = w.snapshot()
    assert len(w) == snap.held == capacity
    assert len(snap.steps) == min(capacity, MAX_FIT_POINTS)  # thinned beyond MAX_FIT_POINTS
    assert (snap.steps[0], snap.steps[-1]) == (9 * capacity, 10 * capacity - 1)  # oldest, newest kept
    assert list(snap.steps) == sorted(set(snap.steps))
    assert estimate(snap, None).leak_bytes_per_step == pytest.approx(1 * MIB)


def test_duplicate_step_keeps_latest_reading() -> None:
    w = feed([(0, 0.0, 1 * GIB, 2 * GIB), (1, 1.0, 1 * GIB, 2 * GIB), (1, 1.5, 1.5 * GIB, 2.5 * GIB)], warmup=0)
    snap = w.snapshot()
    assert (snap.steps, snap.times) == ((0, 1), (0.0, 1.5))
    assert (snap.baselines, snap.peaks) == ((GIB, 1.5 * GIB), (2 * GIB, 2.5 * GIB))
    assert snap.last_baseline == 1.5 * GIB
    assert snap.recent_peaks == (2 * GIB, 2.5 * GIB)


def test_non_finite_readings_are_dropped() -> None:
    w = feed([(0, 0.0, GIB, GIB), (1, 1.0, math.nan, GIB), (2, 2.0, GIB, math.inf)], warmup=0)
    assert w.snapshot().steps == (0,)


@pytest.mark.parametrize(
    ("capacity", "warmup", "error", "named"),
    [
        (1, 0, ValueError, "capacity"),
        (True, 0, TypeError, "capacity"),
        (2.5, 0, TypeError, "capacity"),
        (10, -1, ValueError, "warmup_steps"),
    ],
)
def test_bad_arguments(capacity: int, warmup: int, error: type[Exception], named: str) -> None:
    with pytest.raises(error, match=f"TrendWindow {named} .*got {capacity if named == 'capacity' else warmup}"):
        TrendWindow(capacity, warmup)


def test_snapshot_is_immutable_and_detached() -> None:
    w = feed(synthetic(50, leak(MIB)), warmup=0)
    snap = w.snapshot()
    w.add(50, 25.0, 2 * GIB, 3 * GIB)
    assert isinstance(snap.steps, tuple)
    assert snap.steps[-1] == 49
    with pytest.raises(AttributeError):
        snap.held = 0  # type: ignore[misc]


def test_the_median_by_selection_equals_numpys() -> None:
    # trend._median replaced np.median in the fit: the same value, for odd and even sizes, with ties
    # and with byte counts (1e9) beside slopes (1e-3), where a different averaging would round apart.
    rng = np.random.default_rng(7)
    for size in range(1, 66):
        for scale in (1e-3, 1.0, 1e9):
            values = rng.normal(size=size) * scale
            ties = np.round(values / scale) * scale  # many equal values
            for a in (values, ties):
                assert _median(a) == float(np.median(a)), (size, scale)
