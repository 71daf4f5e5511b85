"""Which steps take intra-step readings (``StepTracker``'s ``Detail``): one in ``DETAIL_EVERY``, at most one
per ``DETAIL_INTERVAL_S``. The rest take one reading, at their boundary (steps.py explains why)."""

from __future__ import annotations

from dataclasses import dataclass

DETAIL_EVERY = 8
"""In steady state at most one step in this many takes intra-step readings (``Detail``)..."""
DETAIL_INTERVAL_S = 1.0
"""...and at most one per this many seconds (the same pace as a tracked model's recorded forwards)."""


@dataclass
class Detail:
    """Which steps take intra-step readings: one in ``every``, at most one per ``interval`` seconds,
    the first always. ``Detail()`` (every step) is for direct users; the exporter paces it."""

    every: int = 1
    interval: float = 0.0
    _since: int = 1 << 30  # steps since the last detailed one
    _at: float = -1e18  # when it started

    def next(self, now: float) -> bool:
        """A boundary at ``now`` (monotonic seconds): whether the step it starts is detailed."""
        self._since += 1
        if self._since >= self.every and now - self._at >= self.interval:
            self._since, self._at = 0, now
            return True
        return False
