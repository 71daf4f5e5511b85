"""The last half hour of each device's step baseline and peak, for the live page (``serving/job/live.py``).

Fed at step boundaries on the training thread, at most once every ``INTERVAL_S`` seconds, from what
the step tracker has just computed (``StepTracker.latest``: a dict copy, no device read), so a job
with no Prometheus and no browser open still has a history when the page is first opened. Bounded:
``MAX_POINTS`` points, about 30 minutes at one every 2 seconds; older points fall off.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from memexporter.tracking.steps import StepTracker

INTERVAL_S = 2.0
MAX_POINTS = 900  # 30 minutes at INTERVAL_S


@dataclass(frozen=True)
class Point:
    """One step boundary: unix seconds, the step count, and ``{device: (baseline, peak)}`` in bytes."""

    time: float
    step: int
    devices: dict[str, tuple[int, int]]


class History:
    """A bounded record of step boundaries, one every ``interval_s`` seconds at most."""

    def __init__(
        self,
        tracker: StepTracker,
        interval_s: float | None = None,
        max_points: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._tracker, self._clock = tracker, clock
        self._interval = INTERVAL_S if interval_s is None else interval_s
        self._points: deque[Point] = deque(maxlen=MAX_POINTS if max_points is None else max_points)
        self._lock = threading.Lock()
        self._last = float("-inf")

    def on_boundary(self, step: int) -> None:
        """A step boundary (``StepTracker.add_boundary_callback``); never raises."""
        try:
            now = self._clock()
            if now - self._last < self._interval:
                return
            self._last = now
            point = Point(now, step, self._tracker.latest())
            with self._lock:
                self._points.append(point)
        except Exception:  # the page loses a point; training loses nothing
            return

    def points(self, since: float | None = None) -> list[Point]:
        """The recorded points, oldest first; only those after unix time ``since`` when given."""
        with self._lock:
            return [p for p in self._points if since is None or p.time > since]
