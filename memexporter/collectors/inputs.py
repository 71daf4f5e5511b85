"""The step's input and the largest input that fits, from the step tracker's input log.

The training thread measures each step's input and keeps the measured peaks beside it
(tracking/inputs.py); here, on the publisher's thread, ``oom/capacity.py`` fits them and solves for
the limit of each device the job trains on. ``capacities`` is shared with the ``on_oom_risk`` judge
(oom/risk.py), so the series and the callback always say the same.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from memexporter.collectors.scrape import Scrape
from memexporter.metrics import families
from memexporter.oom.capacity import Capacity, capacity, devices
from memexporter.oom.trend import estimate
from memexporter.tracking.steps import StepSnapshot


def capacities(scrape: Scrape, steps: StepSnapshot | None = None) -> dict[str, Capacity]:
    """``{device: Capacity}`` for the devices the job trains on that have a limit and a sound fit."""
    tracker = scrape.sources.steps
    if tracker is None:
        return {}
    snap = tracker.inputs.snapshot()
    if not snap.devices:
        return {}
    steps = steps if steps is not None else tracker.snapshot()
    declared = scrape.sources.config.max_input_elements
    out: dict[str, Capacity] = {}
    for device in devices(list(snap.devices)):
        view, trend = scrape.views.get(device), steps.devices.get(device)
        if view is None or not view.limit or trend is None:
            continue
        # What is stranded in partly used segments now: committed minus used at the last boundary.
        stranded = max((trend.last_committed or 0.0) - (trend.last_baseline or 0.0), 0.0)
        leak = estimate(trend, view.limit).leak_bytes_per_step
        got = capacity(device, snap.devices[device], snap, (steps.steps, leak, stranded), view.limit, declared)
        if got is not None:
            out[device] = got
    return out


class InputsCollector:
    """Per rank: the last step's input and the largest (elements), the declared maximum; per device: the
    capacity (elements) and the marginal bytes per element at the largest input seen."""

    name = "inputs"

    def collect(self, scrape: Scrape) -> Iterable[Metric]:
        tracker = scrape.sources.steps
        if tracker is None:
            return []
        rank = scrape.sources.rank
        snap = tracker.inputs.snapshot()
        declared = scrape.sources.config.max_input_elements
        seen = snap.largest_elements > 0
        rows: dict[str, list[tuple[tuple[str, ...], float]]] = {
            "memexporter_step_input_elements": [((rank,), float(snap.last_elements))] if seen else [],
            "memexporter_step_input_elements_max": [((rank,), float(snap.largest_elements))] if seen else [],
            "memexporter_step_input_max_length": [((rank,), float(snap.largest_length))] if seen else [],
            "memexporter_step_input_max_batch": [((rank,), float(snap.largest_batch))] if seen else [],
            "memexporter_input_capacity_elements": [],
            "memexporter_input_bytes_per_element": [],
            "memexporter_input_declared_max_elements": [] if declared is None else [((rank,), float(declared))],
        }
        for device, cap in capacities(scrape).items():
            rows["memexporter_input_capacity_elements"].append(((rank, device), cap.elements))
            rows["memexporter_input_bytes_per_element"].append(((rank, device), cap.bytes_per_element))
        return families(rows)
