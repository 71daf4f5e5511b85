"""The ``/debug/memory`` document: the latest findings plus the OOM view, as JSON-ready data.

Built on the thread that asks (the HTTP thread, or the training thread for a pre-mortem) from
published state only: the latest ``Findings``, the step tracker's snapshot and its input log (what
the steps were given, and the largest input that fits), never a live tensor, and without waiting on
the training loop.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Protocol

from memexporter.collectors.inputs import capacities
from memexporter.collectors.levers import gather
from memexporter.collectors.scrape import Scrape, Sources
from memexporter.diagnose.findings import Findings, to_json
from memexporter.oom.advice import Advice, advise
from memexporter.oom.trend import TrendEstimate, estimate

DEFAULT_TOP = 50


def _finite(x: float) -> float | None:
    # JSON has no Infinity: +Inf (not growing) becomes null.
    return x if math.isfinite(x) else None


def estimates(sources: Sources, limits: dict[str, float] | None = None) -> dict[str, TrendEstimate]:
    """The in-process leak estimate per device (trend.py), against ``limits`` when given."""
    if sources.steps is None:
        return {}
    snap = sources.steps.snapshot()
    return {d: estimate(points, (limits or {}).get(d)) for d, points in snap.devices.items()}


def advice(sources: Sources) -> list[Advice]:
    """What memory could be got back now, per device (``oom.advice``): from one scrape's reading."""
    if sources.steps is None:
        return []
    scrape = Scrape(sources)
    views, snap = scrape.views, sources.steps.snapshot()
    found = (
        advise(d, points, views[d], scrape.allocator_backend, scrape.expandable_segments)
        for d, points in snap.devices.items()
        if d in views
    )
    return [a for a in found if a is not None]


def oom_view(sources: Sources) -> dict[str, dict[str, Any]]:
    """Per device: used (allocated), committed (what fills the limit) and what of it is stranded, the
    limit (null: unknown) and what sets it, utilisation (committed / limit), leak rates, OOM ETA
    (null: not growing or no limit), peak, committed peak, baseline."""
    views = Scrape(sources).views
    ests = estimates(sources, {d: v.limit for d, v in views.items() if v.limit is not None})
    out: dict[str, dict[str, Any]] = {}
    for device, view in views.items():
        est = ests.get(device)
        out[device] = {
            "used_bytes": view.used,
            "committed_bytes": view.held,
            "stranded_bytes": view.stranded,
            "limit_bytes": view.limit,
            "limit_source": view.source,
            "utilisation": view.fullness,  # committed / limit; None: limit unknown
            "leak_bytes_per_step": est.leak_bytes_per_step if est else 0.0,
            "leak_bytes_per_second": est.leak_bytes_per_second if est else 0.0,
            "oom_eta_seconds": _finite(est.oom_eta_seconds) if est else None,
            "peak_bytes": est.peak_bytes if est else None,
            "committed_peak_bytes": est.committed_peak_bytes if est else None,
            "baseline_bytes": est.baseline_bytes if est else None,
        }
    return out


def inputs(sources: Sources) -> dict[str, Any] | None:
    """The step's input (``tracking/inputs.py``): the open step's (``step_elements``, elements), the largest
    completed before it and that one's length and batch, the largest before that, the declared maximum,
    ``largest_so_far`` (the open step's input is larger than any before) and per device the capacity
    (``oom/capacity.py``: elements, bytes per element, and its line). None before any input."""
    tracker = sources.steps
    if tracker is None:
        return None
    snap = tracker.inputs.snapshot()
    now, largest = tracker.inputs.in_flight()
    if not (now or snap.largest_elements):
        return None
    return {
        "step_elements": now,
        "largest_elements": largest,
        "largest_length": snap.largest_length,
        "largest_batch": snap.largest_batch,
        "before_largest_elements": snap.before_largest,
        "declared_max_elements": sources.config.max_input_elements,
        "largest_so_far": now > largest > 0,
        "capacity": {
            d: {"elements": c.elements, "bytes_per_element": c.bytes_per_element, "text": c.describe()}
            for d, c in capacities(Scrape(sources)).items()
        },
    }


def on_largest_input(sources: Sources) -> str | None:
    """``on the largest input so far: 5,120 elements (the largest before it: 4,096)`` when the open step's
    input is larger than every completed step's (what an OOM now ran out on); at a boundary (the
    pre-mortem's tick), when the step that just ended was given the largest: ``after the largest input so
    far: ...``. Else None. Never raises."""
    try:
        log = sources.steps.inputs if sources.steps is not None else None
        if log is None:
            return None
        now, largest = log.in_flight()
        last, before = log.last, log.before
    except Exception:
        return None
    if now > largest > 0:
        return f"on the largest input so far: {now:,} elements (the largest before it: {largest:,})"
    if not now and last == largest > 0 and before:
        return f"after the largest input so far: {last:,} elements (the largest before it: {before:,})"
    return None


class Published(Protocol):
    """What the document reads of the diagnosis (``engine.Diagnosis``): its published state only."""

    sources: Sources
    every: int  # steps between censuses
    errors: int  # censuses that failed
    findings: Findings | None  # the latest census' findings
    next_step: int  # the step of the next census


def document(diagnosis: Published, top: int = DEFAULT_TOP) -> dict[str, Any]:
    """Everything ``/debug/memory`` answers; ``census`` is null until the first census. ``levers``: what
    would make it fit (``Lever.to_json``), largest first."""
    sources = diagnosis.sources
    tracker = sources.steps
    doc: dict[str, Any] = {
        "rank": sources.rank,
        "pid": os.getpid(),
        "unix_time": time.time(),
        "step": tracker.steps if tracker is not None else 0,
        "census_every": diagnosis.every,
        "errors": diagnosis.errors,
    }
    findings = diagnosis.findings
    if findings is None:
        doc.update(
            {"census": None, "growth": [], "autograd": [], "history": [], "next_census_step": diagnosis.next_step}
        )
    else:
        doc.update(to_json(findings, top))
        doc["census"]["age_seconds"] = max(0.0, time.time() - findings.census.unix_time)
    try:
        doc["oom"] = oom_view(sources)
        doc["advice"] = [
            {"device": a.device, "recoverable_bytes": a.recoverable_bytes, "text": a.describe()}
            for a in advice(sources)
        ]
        doc["input"] = inputs(sources)
        # What would make it fit, largest first: each an estimate with its basis (oom/levers.py).
        doc["levers"] = [lever.to_json() for lever in gather(sources, findings)]
    except Exception as exc:  # the census part is still worth serving
        doc["oom"] = {"error": f"{type(exc).__name__}: {exc}"}
    return doc
