"""Per-phase peaks, durations and counts, from the phase tracker's snapshot (tracking/phases.py).

Every phase name seen so far keeps its series (bounded: ``MAX_PHASES`` names, the rest are
``other``); a phase that has not completed yet has only ``active`` and ``completed_total`` (0).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from memexporter.collectors.scrape import Scrape
from memexporter.metrics import families


class PhasesCollector:
    """``memexporter_phase_*`` from ``PhaseTracker.snapshot()``: each completed phase's last peak (bytes) and
    duration (seconds), completions, whether it is active, and the last change (unix seconds)."""

    name = "phases"

    def collect(self, scrape: Scrape) -> Iterable[Metric]:
        tracker = scrape.sources.phases
        if tracker is None:
            return []
        rank = scrape.sources.rank
        stats, last_change = tracker.snapshot()
        done = {name: s for name, s in stats.items() if s.completed}
        return families(
            {
                "memexporter_phase_peak_bytes": [
                    ((rank, device, name), float(peak)) for name, s in done.items() for device, peak in s.peaks.items()
                ],
                "memexporter_phase_duration_seconds": [((rank, name), s.duration) for name, s in done.items()],
                "memexporter_phase_completed_total": [((rank, name), float(s.completed)) for name, s in stats.items()],
                "memexporter_phase_active": [((rank, name), float(s.active > 0)) for name, s in stats.items()],
                "memexporter_phase_last_change_timestamp_seconds": []
                if last_change is None
                else [((rank,), last_change)],
            }
        )
