"""Step boundaries, per-step peak and baseline: the training-thread side of the trend.

At each boundary (an optimizer step, or ``memexporter.step()``) the tracker reads ``used`` for
``cpu`` and each CUDA device in use, works out the step's peak, and appends one point to a
bounded ``TrendWindow`` per device. The scrape thread only copies those windows under a short lock.

The per-step peak never resets the user's peak statistics. It uses the lifetime high-water mark
(``allocated_bytes.all.peak`` on CUDA; on the host the process's own, ``VmHWM`` or ``ru_maxrss``:
``backends/highwater.py``): when that rose during the step, the step's peak *is* the new high-water mark (exact, and exactly the case that leads to an OOM).
Otherwise the peak is the highest of the samples taken in the step (boundaries, the optimizer
pre-step hook, the end of a tracked model's forward): a lower bound.

One reading per step. A reading builds the allocator's whole statistics dict (~150 keys on CUDA);
a launch-bound loop holds the GIL between tiny kernels and pays for each one. So in steady state a
step takes one reading, at its boundary (``Detail``): the intra-step samples and the automatic
phases (forward, backward, optimizer) read only on a *detailed* step, one in ``DETAIL_EVERY`` and at
most one per ``DETAIL_INTERVAL_S``, as the tracked model's forward recording does. The step peak
stays exact wherever the high-water mark rose; in between, the samples of a detailed step bound it
from below.

The step's input (``inputs.py``, ``self.inputs``): each boundary closes the input the step was given
and, for each device whose step peak was measured (exact, or a detailed step's highest sample), keeps
the pair for the capacity's fit (``oom/capacity.py``), in bounded bins.
"""

from __future__ import annotations

import itertools
import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from memexporter.backends.base import AllocatorSource, HostSource, Reading
from memexporter.backends.highwater import HighWater
from memexporter.oom.trend import TrendPoints, TrendWindow
from memexporter.tracking.detail import DETAIL_EVERY, DETAIL_INTERVAL_S, Detail
from memexporter.tracking.inputs import InputLog

__all__ = ["DETAIL_EVERY", "DETAIL_INTERVAL_S", "Detail", "Readings", "StepSnapshot", "StepTracker"]

log = logging.getLogger("memexporter")

# The device list is re-read every so many steps, so a model moved to the GPU after start() is
# picked up without a device scan on every step.
_DEVICE_REFRESH_STEPS = 50
# step_interval_seconds is the median of the intervals between the last this-many boundaries.
_RHYTHM_STEPS = 33
Readings: TypeAlias = dict[str, Reading]
"""``{device: Reading(used, lifetime high-water mark, committed)}`` in bytes, read at one instant."""


@dataclass(frozen=True)
class StepSnapshot:
    """An immutable copy for the scrape thread: step count, each device's trend points, the unix
    time of the last boundary and the median seconds between recent boundaries (None before)."""

    steps: int
    devices: dict[str, TrendPoints]
    last_step_time: float | None = None
    step_interval: float | None = None


@dataclass
class _Device:
    window: TrendWindow
    high_water: int  # lifetime high-water mark at the last boundary
    last_used: int  # used at the last boundary
    step_max: int  # highest sample since the last boundary
    excursion: int = 0  # peak minus the higher of the step's start and end, at the last exact measurement
    last_peak: int = 0  # the peak of the last step that ended


def _step_peak(dev: _Device, used: int, high_water: int) -> int:
    """The peak of the step that just ended on ``dev`` (bytes); updates ``dev.excursion``.

    - The high-water mark rose: the step's peak *is* the new mark (exact). Remember how far above
      both the step's start and its end it went: activations and temporaries, the excursion. Not
      what the step allocated and kept (the first step's gradients and optimizer state, a leak's
      share): measured from the start, that was added again to every later start, and once an
      evaluation had raised the lifetime mark above the steps (the cap below), each later step read
      that much above its real peak (28 MiB in the HF ``Trainer`` test of issue 40, on CPU).
    - It fell: the user reset their peak stats during the step. The mark since the reset and the
      samples bound the peak from below.
    - It stayed: the usual steady state. The step went about as far above its start as the last
      exactly measured step did, so estimate ``start + excursion``, capped by the lifetime mark
      (no step can exceed it) and never below a sample.
    """
    samples = max(dev.step_max, dev.last_used, used)
    if high_water > dev.high_water:
        dev.excursion = max(0, high_water - max(dev.last_used, used))
        return high_water
    if high_water < dev.high_water:
        return max(high_water, samples)
    return max(samples, min(high_water, dev.last_used + dev.excursion))


class StepTracker:
    """Bounded per-device step history. ``step()`` and ``sample()`` run on the training thread."""

    def __init__(
        self,
        cuda: AllocatorSource,
        host: HostSource,
        window: int,
        warmup_steps: int,
        clock: Callable[[], float] = time.monotonic,
        host_peak: Callable[[], int] | None = None,
        wall: Callable[[], float] = time.time,
        detail: Detail | None = None,
    ) -> None:
        self._cuda, self._host, self._clock, self._wall = cuda, host, clock, wall
        # The host's mark: the process's own (backends/highwater.py), not one inherited from its launcher.
        self._host_peak = host_peak if host_peak is not None else HighWater()
        self.detail = detail or Detail()  # which steps take intra-step readings
        self.detailed = True  # the current step takes intra-step readings (the first always does)
        self._sampled = False  # a sample was taken in the current step
        self.inputs = InputLog()  # the step's input and the capacity's points (inputs.py)
        self.readings = 0  # readings taken, for the benchmark and the tests
        self._window, self._warmup = window, warmup_steps
        self._lock = threading.Lock()
        self._devices: dict[str, _Device] = {}
        self._cuda_indices: list[int] = []
        self.steps = 0
        self.errors = 0
        self._times: deque[float] = deque(maxlen=_RHYTHM_STEPS)  # monotonic times of recent boundaries
        self._last_wall: float | None = None
        # While an out-of-step phase (evaluation, checkpoint) runs: each device's step_max at its
        # start, restored when it ends, so its memory stays out of the step peak.
        self._held: dict[str, int] | None = None
        # Called as fn(step) after each boundary, on the training thread (the tensor census).
        self._boundary_callbacks: tuple[Callable[[int], None], ...] = ()
        # Called as fn(readings) after each sample and boundary (the open phases' peaks).
        self._observers: tuple[Callable[[Readings], None], ...] = ()
        self.last: Readings | None = None  # the latest readings, from any sample or boundary

    def _read(self, refresh: bool = False) -> Readings:
        """``{device: Reading}`` for cpu and each CUDA device in use.

        Only a step boundary may rescan the devices (a scan reads every visible device's stats);
        intra-step samples reuse the last list. A device whose read fails is left out of this
        reading (and counted): the others, and the step count, never depend on it.
        """
        out: Readings = {}
        self.readings += 1
        try:
            if refresh and self.steps % _DEVICE_REFRESH_STEPS == 0:
                self._cuda_indices = self._cuda.devices_in_use()
        except Exception:
            self._failed()
        try:
            rss = self._host.rss()
            out["cpu"] = Reading(rss, self._host_peak(), rss)
        except Exception:
            self._failed()
        for i in self._cuda_indices:
            try:
                out[self._cuda.label(i)] = self._cuda.reading(i)
            except Exception:
                self._failed()
        return out

    def sample(self, force: bool = False) -> Readings | None:
        """Record an intra-step sample of ``used``, for the step peak; the readings, or None if they
        failed or this step is not detailed (``force``: read anyway, as a user's phase does)."""
        if not (self.detailed or force):
            return None
        try:
            readings = self.last = self._read()
            with self._lock:
                self._sampled = True
                for name, r in readings.items():
                    dev = self._devices.get(name)
                    if dev is not None and r.used > dev.step_max:
                        dev.step_max = r.used
            for observer in self._observers:
                observer(readings)
            return readings
        except Exception:
            self._failed()
            return None

    def step(self, count: int | None = None) -> Readings | None:
        """Mark a step boundary: append ``(step, t, baseline, peak)`` per device. ``count``: the
        step number to take (a trainer's global step) unless it is behind ours; else one more."""
        try:
            now = self._clock()
            readings = self.last = self._read(refresh=True)
            with self._lock:
                self.steps = count if count is not None and count >= self.steps else self.steps + 1
                self._times.append(now)
                self._last_wall = self._wall()
                if self._held is not None:  # a boundary inside an out-of-step phase starts a new step
                    self._held = {name: r.used for name, r in readings.items()}
                size, sampled = self.inputs.end_step(), self.detailed and self._sampled
                for name, (used, high_water, committed) in readings.items():
                    dev = self._devices.get(name)
                    if dev is None:
                        # First boundary for this device: nothing to compare the high-water mark with.
                        dev = self._devices[name] = _Device(
                            TrendWindow(self._window, self._warmup), high_water, used, used
                        )
                    if size is not None:
                        rose = high_water > dev.high_water
                        top = high_water if rose else dev.step_max if sampled else 0
                        self.inputs.measured(name, size, self.steps, max(dev.last_used, used), top, rose)
                    peak, restarts = _step_peak(dev, used, high_water), dev.window.restarts
                    dev.window.add(self.steps, now, float(used), float(peak), float(committed))
                    if dev.window.restarts != restarts:  # a new level (memory freed): old peaks no longer hold
                        self.inputs.forget(name)
                    dev.high_water, dev.last_used, dev.step_max, dev.last_peak = high_water, used, used, peak
                steps = self.steps
                self.detailed, self._sampled = self.detail.next(now), False
            for observer in self._observers:
                observer(readings)
            for callback in self._boundary_callbacks:
                callback(steps)
            return readings
        except Exception:
            self._failed()
            return None

    def hold(self) -> None:
        """An out-of-step phase starts: remember each device's step peak so far."""
        with self._lock:
            self._held = {name: d.step_max for name, d in self._devices.items()}

    def release(self, readings: Readings) -> None:
        """It ended (``readings`` taken at its end): put the step peak back as it was, and take
        the high-water mark it left as the new reference, so a rise inside it is not the step's."""
        with self._lock:
            held, self._held = self._held or {}, None
            for name, r in readings.items():
                dev = self._devices.get(name)
                if dev is not None:
                    dev.high_water = r.peak
                    dev.step_max = held.get(name, dev.last_used)

    def close(self) -> None:
        """Close what the host's mark holds open (the exporter's ``stop()``); later readings open nothing
        that stays open (a phase the user closes after ``stop()`` still reads)."""
        close = getattr(self._host_peak, "close", None)
        if close is not None:
            close()

    def add_observer(self, observer: Callable[[Readings], None]) -> None:
        """Call ``observer(readings)`` after every sample and boundary. It must not raise."""
        self._observers += (observer,)

    def add_boundary_callback(self, callback: Callable[[int], None]) -> None:
        """Call ``callback(step)`` after every boundary, on the training thread. It must not raise."""
        self._boundary_callbacks += (callback,)

    def remove_boundary_callback(self, callback: Callable[[int], None]) -> None:
        self._boundary_callbacks = tuple(c for c in self._boundary_callbacks if c != callback)

    def latest(self) -> dict[str, tuple[int, int]]:
        """``{device: (baseline, peak)}`` of the last step that ended, in bytes (O(1) a device)."""
        with self._lock:
            return {name: (d.last_used, d.last_peak) for name, d in self._devices.items()}

    def snapshot(self) -> StepSnapshot:
        with self._lock:
            devices = {name: d.window.snapshot() for name, d in self._devices.items()}
            times = list(self._times)
            steps, last = self.steps, self._last_wall
        gaps = [b - a for a, b in itertools.pairwise(times)]
        return StepSnapshot(steps, devices, last, statistics.median(gaps) if gaps else None)

    def _failed(self) -> None:
        # Never raise into training: count, and log the first traceback only.
        self.errors += 1
        if self.errors == 1:
            log.exception("memexporter: step tracking failed; counting further failures silently")
