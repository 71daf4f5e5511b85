"""Per-step peak, baseline, leak rate and OOM ETA, from the step tracker's snapshot.

The training thread appends one point per step (tracking/steps.py); this collector copies the
windows and runs the robust estimate (trend.py) against the current limit. ``steps_total`` is 0
until the first step, so alerts can tell "no steps yet" from "no exporter".
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from memexporter.collectors.scrape import Scrape
from memexporter.metrics import families
from memexporter.oom import advice
from memexporter.oom.trend import estimate


class TrendCollector:
    """Per device, from ``StepTracker.snapshot()`` through ``oom.trend.estimate``: step peak, committed
    peak and baseline (bytes), leak rate (bytes per second and per step) and OOM ETA (seconds); and the step count, the
    last step's time (unix seconds) and the step interval (seconds)."""

    name = "trend"

    def collect(self, scrape: Scrape) -> Iterable[Metric]:
        tracker = scrape.sources.steps
        if tracker is None:
            return []
        rank = scrape.sources.rank
        snap = tracker.snapshot()
        views = scrape.views
        rows: dict[str, list[tuple[tuple[str, ...], float]]] = {
            "memexporter_memory_peak_bytes": [],
            "memexporter_memory_baseline_bytes": [],
            "memexporter_memory_committed_peak_bytes": [],
            "memexporter_leak_rate_bytes_per_second": [],
            "memexporter_leak_bytes_per_step": [],
            "memexporter_oom_eta_seconds": [],
            "memexporter_steps_total": [((rank,), float(snap.steps))],
            "memexporter_last_step_timestamp_seconds": []
            if snap.last_step_time is None
            else [((rank,), snap.last_step_time)],
            "memexporter_step_interval_seconds": [] if snap.step_interval is None else [((rank,), snap.step_interval)],
            "memexporter_allocator_recoverable_bytes": [],
        }
        for device, points in snap.devices.items():
            view = views.get(device)
            est = estimate(points, view.limit if view is not None else None)
            labels = (rank, device)
            rows["memexporter_memory_peak_bytes"].append((labels, est.peak_bytes))
            rows["memexporter_memory_baseline_bytes"].append((labels, est.baseline_bytes))
            rows["memexporter_memory_committed_peak_bytes"].append((labels, est.committed_peak_bytes))
            rows["memexporter_leak_rate_bytes_per_second"].append((labels, est.leak_bytes_per_second))
            rows["memexporter_leak_bytes_per_step"].append((labels, est.leak_bytes_per_step))
            rows["memexporter_oom_eta_seconds"].append((labels, est.oom_eta_seconds))
            # cpu first: asking a CPU-only torch for its CUDA allocator backend is a warning.
            if (
                view is not None
                and device != "cpu"
                and advice.applies(device, scrape.allocator_backend, scrape.expandable_segments)
            ):
                found = advice.advise(device, points, view, scrape.allocator_backend, scrape.expandable_segments)
                if found is not None:
                    advice.say_once(found)  # the one side effect: the job's log, once per device
                rows["memexporter_allocator_recoverable_bytes"].append(
                    (labels, found.recoverable_bytes if found else 0.0)
                )
        return families(rows)
