"""The levers of this job now, ranked: gathered from published state, off the training thread.

``gather`` reads what a scrape reads (the OOM view, the step tracker's snapshot, the input capacity:
``collectors/inputs.py``), the tracked models' published ``Snapshot``s (``tracking/snapshots.py``),
the world size, and a census's findings where the diagnosis runs; ``oom/levers.py`` sizes each lever.
Shared by ``/debug/memory`` and the pre-mortem (``diagnose/report.py``), the live page
(``serving/job/live.py``) and the ``on_oom_risk`` judge (``oom/risk.py``), so they all say the same.
Nothing here touches a live tensor or waits on the training loop.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from memexporter.collectors.inputs import capacities
from memexporter.collectors.scrape import Scrape, Sources
from memexporter.oom import levers as lv
from memexporter.oom.advice import advise
from memexporter.oom.capacity import devices
from memexporter.oom.trend import estimate
from memexporter.tracking.snapshots import active_handles
from memexporter.tracking.steps import StepSnapshot

if TYPE_CHECKING:
    from memexporter.diagnose.findings import Findings

__all__ = ["PAGE_INTERVAL_S", "Findings", "findings_of", "for_the_page", "gather"]

PAGE_INTERVAL_S = 5.0
"""The live page's levers are gathered at most this often: a publish is once a second, and a lever's
inputs (module rows, a census) change over many steps; between, the page shows the last list."""

NEED_ROWS = ("checkpointing", "sharding", "precision")
"""The levers sized from the per-module rows: without a tracked model, they say ``levers.TRACK``."""


def _world(sources: Sources) -> int:
    try:
        return max(int(sources.identity.world_size), 1)
    except ValueError:
        return 1


def gather(
    sources: Sources,
    findings: Findings | None = None,
    scrape: Scrape | None = None,
    steps: StepSnapshot | None = None,
) -> tuple[lv.Lever, ...]:
    """Every lever of this process now, largest first (``levers.ranked``)."""
    scrape = scrape if scrape is not None else Scrape(sources)
    tracker = sources.steps
    if tracker is None:
        return ()
    steps = steps if steps is not None else tracker.snapshot()
    views = scrape.views
    device = (devices(list(views)) or ["cpu"])[0]  # the device the job trains on
    out: list[lv.Lever] = []
    for d, points in steps.devices.items():
        view = views.get(d)
        # Stranded segments are a CUDA caching allocator's: the backend is asked only of such a device.
        if view is None or not d.startswith("cuda"):
            continue
        found = advise(d, points, view, scrape.allocator_backend, scrape.expandable_segments)
        if found is not None:
            out.append(lv.stranded(found))
    handles = active_handles()
    for handle in handles:
        snap = handle.snapshot()
        made = (lv.checkpointing(snap, device), lv.sharding(snap, _world(sources), device), lv.precision(snap, device))
        out += [lever for lever in made if lever is not None]
    if not handles:
        out += [lv.Lever(kind, device, "needs the per-module rows", None, lv.TRACK) for kind in NEED_ROWS]
    caps = capacities(scrape, steps)
    out += [lv.input_lever(cap) for cap in caps.values()]
    for named in findings.growth if findings is not None else ():
        g, on = named.growth, named.growth.key[0]
        view, trend = views.get(on), steps.devices.get(on)
        if not named.held_by or view is None or trend is None:
            continue
        est = estimate(trend, view.limit)
        headroom = (view.limit or math.inf) - (est.committed_peak_bytes or est.peak_bytes)
        rates = (est.leak_bytes_per_step, est.leak_bytes_per_second, headroom, est.oom_eta_seconds)
        out.append(lv.leak(on, named.held_by[0], float(g.bytes), g.bytes_per_step, rates))
    return lv.ranked(out, caps.get(device))


class _Diagnosis(Protocol):
    findings: Findings | None


class Diagnosed(Protocol):
    """What ``findings_of`` reads of ``diagnose.wiring.Diagnostics`` (not imported: the diagnosis imports this)."""

    @property
    def diagnosis(self) -> _Diagnosis: ...


def findings_of(diagnostics: Diagnosed | None) -> Callable[[], Findings | None]:
    """The latest census's findings of the exporter's diagnosis (None without one, or before a census)."""
    return (lambda: diagnostics.diagnosis.findings) if diagnostics is not None else (lambda: None)


def for_the_page(
    sources: Sources, findings: Callable[[], Findings | None], clock: Callable[[], float] = time.monotonic
) -> Callable[[], list[dict[str, Any]]]:
    """The levers as the live page shows them (``Lever.to_json``), gathered on the publishing thread at
    most every ``PAGE_INTERVAL_S``; a gathering that fails keeps the last list (the page is still served)."""
    last: list[Any] = [-math.inf, []]
    lock = threading.Lock()  # a flush() and the thread's own publish may overlap

    def levers() -> list[dict[str, Any]]:
        with lock:
            if clock() - last[0] >= PAGE_INTERVAL_S:
                last[0] = clock()
                # A failure leaves the last list: the page says nothing new; /debug/memory says why.
                with contextlib.suppress(Exception):
                    last[1] = [lever.to_json() for lever in gather(sources, findings())]
            return list(last[1])

    return levers
