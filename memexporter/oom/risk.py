"""``memexporter.on_oom_risk(fn)``: act before the OOM, on the training thread.

It reads the scrape side (the OOM view) and runs on the training side: it sits between them,
beside the OOM view, not under ``tracking/`` (which never imports the scrape side).

The judgement is the critical alert's (``MemexporterOOMImminent``, with its default thresholds from
``rules/params.py``): the recent committed step peak, or the last out-of-step phase's peak (an
evaluation) plus what is stranded now, fills more than ``full_utilisation`` of the limit
("headroom"); or it fills more than ``min_utilisation`` and the in-process ETA is within
``horizon_s`` ("forecast"). Committed, not allocated: under the native allocator the limit is met
by segments, and an H200 job died with 79 % of its limit allocated (``backends.base.committed``).

A fast leak is a forecast on its ETA alone, whatever the level, once the ETA is under ``eta_alone_s``
(``ETA_ALONE_S``) and the trend's own gates hold (a finite ETA: enough steps, growth beyond the noise,
kept up). On the H200's 16 MiB/step trace the level gate opened 1.3 s before the OOM, while the ETA
was finite and right 8.3 s before it. The threshold is sized from what a callback needs: it runs at
the next boundary after a judgement (``CHECK_INTERVAL_S`` plus a step), then saves; ``torch.save`` of
what one GPU trains (weights and optimizer state, 10 to 20 GB for a model filling 80 GiB) takes 10 to
30 s to a local disk at 1 to 2 GB/s. 60 s covers that twice. A slower leak is left to the level gate.

The input ("input"): the declared largest input (``max_input_elements``) exceeds the capacity learned
from the job's steps (``oom/capacity.py``), or the largest input seen is within ``capacity.NEAR`` of
it: the OOM arrives with a batch, and no trend sees it coming.

Who does what: a daemon thread judges once every ``CHECK_INTERVAL_S`` from the same figures a scrape
reads (the step tracker's windows, the limit of each device); the training thread, at its next step
boundary, runs the callbacks once per episode. An episode ends when a judgement finds no risk.
Neither the scrape nor a client can trigger a callback. A callback that raises is logged (first
time with its traceback) and counted in ``memexporter_hook_errors_total``; training goes on.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from memexporter.collectors.inputs import capacities
from memexporter.collectors.levers import gather
from memexporter.collectors.scrape import Scrape, Sources
from memexporter.oom.trend import estimate
from memexporter.rules.params import RulesConfig
from memexporter.tracking.errors import count_failure
from memexporter.tracking.phases import OUT_OF_STEP_PHASES
from memexporter.tracking.steps import StepSnapshot
from memexporter.units import MiB

if TYPE_CHECKING:
    from memexporter.diagnose.findings import Findings
    from memexporter.oom.levers import Lever

log = logging.getLogger("memexporter")

CHECK_INTERVAL_S = 1.0
ETA_ALONE_S = 60.0
"""An ETA under this fires on its own, whatever the level (module docstring: what a callback needs)."""
_DEFAULTS = RulesConfig()


@dataclass(frozen=True)
class OomRisk:
    """Why ``on_oom_risk`` called: bytes of ``device`` (``used``: allocated; ``peak``: the committed
    peak compared with the limit; ``committed``: what fills the limit now), ETA in seconds
    (``math.inf``: not growing), ``reason`` ``"headroom"``, ``"forecast"`` or ``"input"``, ``phase``
    whose peak it was (``"step"``: the training steps'), the step count when judged, ``detail``:
    for ``"input"``, the capacity's line (``Capacity.describe``), and ``levers``: what would make it
    fit, largest first, each an estimate with its basis (``oom/levers.py``; empty when none is known)."""

    device: str
    used_bytes: float
    peak_bytes: float
    limit_bytes: float
    eta_seconds: float
    reason: str
    phase: str
    step: int
    committed_bytes: float = 0.0
    detail: str = ""
    levers: tuple[Lever, ...] = ()

    def describe(self) -> str:
        """One line for the job's log: where, why, how full, how soon, and the largest lever."""
        top = next((v for v in self.levers if v.freed_bytes), None)
        return self._what() + (f"; what would fit first: {top.describe()}" if top is not None else "")

    def _what(self) -> str:
        eta = "none" if math.isinf(self.eta_seconds) else f"{self.eta_seconds:.0f} s"
        if self.reason == "input":
            return f"OOM risk on {self.device} (input: {self.detail})"
        return (
            f"OOM risk on {self.device} ({self.reason}: {self.phase} peak {self.peak_bytes / MiB:.0f} MiB of a "
            f"{self.limit_bytes / MiB:.0f} MiB limit, committed {self.committed_bytes / MiB:.0f} MiB, "
            f"allocated {self.used_bytes / MiB:.0f} MiB, ETA {eta})"
        )


@dataclass(frozen=True)
class Thresholds:
    """When ``judge`` sees a risk: a peak over ``full_utilisation`` of the limit, or over ``min_utilisation``
    with the ETA within ``horizon_s`` seconds. Defaults: ``MemexporterOOMImminent``'s (``rules/params.py``)."""

    horizon_s: float = float(_DEFAULTS.imminent_horizon)
    min_utilisation: float = _DEFAULTS.imminent_min_utilisation
    full_utilisation: float = _DEFAULTS.imminent_full_utilisation
    eta_alone_s: float = ETA_ALONE_S


def judge(
    sources: Sources, thresholds: Thresholds, findings: Callable[[], Findings | None] = lambda: None
) -> OomRisk | None:
    """The first device at risk now, with the levers (``collectors/levers.py``; a census's ``findings``
    name a leak), or None. Reads what one scrape reads."""
    got = _judge(sources, thresholds)
    if got is None:
        return None
    risk, scrape, snap = got
    try:
        return replace(risk, levers=gather(sources, findings(), scrape, snap))
    except Exception:  # the risk is worth a call without its levers
        count_failure("OOM-risk levers")
        return risk


def _judge(sources: Sources, thresholds: Thresholds) -> tuple[OomRisk, Scrape, StepSnapshot] | None:
    tracker = sources.steps
    if tracker is None:
        return None
    snap, scrape = tracker.snapshot(), Scrape(sources)
    phase_peaks: dict[str, tuple[str, float]] = {}  # device -> the highest out-of-step phase peak
    if sources.phases is not None:
        for name, stats in sources.phases.snapshot()[0].items():
            for device, bytes_ in stats.peaks.items():
                if name in OUT_OF_STEP_PHASES and bytes_ > phase_peaks.get(device, ("", 0.0))[1]:
                    phase_peaks[device] = (name, float(bytes_))
    for device, points in snap.devices.items():
        view = scrape.views.get(device)
        if view is None or not view.limit:
            continue
        est = estimate(points, view.limit)
        step_peak = float(max(points.recent_committed_peaks or points.recent_peaks, default=est.committed_peak_bytes))
        name, phase_peak = phase_peaks.get(device, ("", 0.0))
        phase, peak = max([("step", step_peak), (name, phase_peak + view.stranded)], key=lambda p: p[1])
        util = peak / view.limit
        if util > thresholds.full_utilisation:
            reason = "headroom"
        elif est.oom_eta_seconds < thresholds.horizon_s and (
            step_peak / view.limit > thresholds.min_utilisation or est.oom_eta_seconds < thresholds.eta_alone_s
        ):
            reason, phase, peak = "forecast", "step", step_peak
        else:
            continue
        risk = OomRisk(device, view.used, peak, view.limit, est.oom_eta_seconds, reason, phase, snap.steps, view.held)
        return risk, scrape, snap
    for device, cap in capacities(scrape, snap).items():
        if not cap.declared_fits or cap.near:
            view = scrape.views[device]
            peak = float(cap.fit.predict(cap.largest, cap.length))
            risk = OomRisk(
                device, view.used, peak, cap.limit, math.inf, "input", "step", snap.steps, view.held, cap.describe()
            )
            return risk, scrape, snap
    return None


class RiskWatch:
    """The judging thread and the training-thread callback runner of one exporter."""

    def __init__(
        self,
        sources: Sources,
        thresholds: Thresholds = Thresholds(),
        callbacks: Callable[[], tuple[Callable[[OomRisk], None], ...]] = tuple,
        start: bool = True,
    ) -> None:
        """``start``: judge on a daemon thread every ``CHECK_INTERVAL_S``; without it the caller
        calls ``check()`` (the trace replay, on its own clock)."""
        self._sources, self._thresholds, self._callbacks = sources, thresholds, callbacks
        self.findings: Callable[[], Findings | None] = lambda: None  # a census's, where the diagnosis runs
        self._risk: OomRisk | None = None  # set by the judge, read at the next boundary
        self._fired = False  # the callbacks ran in this episode
        self._lock = threading.Lock()  # the judge's verdict against the boundary's firing
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="memexporter-oom-risk", daemon=True)
        if sources.steps is not None:
            sources.steps.add_boundary_callback(self.at_boundary)
        if start:
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(CHECK_INTERVAL_S):
            self.check()

    def check(self) -> None:
        """Judge once; the verdict waits for the next boundary. Never raises."""
        risk = None
        if self._callbacks():  # with none registered, nothing is judged (and no episode runs)
            try:
                risk = judge(self._sources, self._thresholds, self.findings)
            except Exception:
                count_failure("OOM-risk judgement")
                return
        with self._lock:
            self._risk = risk
            if risk is None:
                self._fired = False  # the episode is over: the next risk calls again

    def at_boundary(self, step: int) -> None:
        """On the training thread, after a step boundary: run the callbacks once per episode."""
        if self._risk is None or self._fired:  # the usual case, without the lock
            return
        with self._lock:
            risk, fire = self._risk, self._risk is not None and not self._fired
            self._fired = self._fired or fire
        if not fire or risk is None:
            return
        log.warning("memexporter: %s: running %d on_oom_risk callback(s)", risk.describe(), len(self._callbacks()))
        for fn in self._callbacks():
            try:
                fn(risk)
            except Exception:  # the user's code: say so every time (once an episode), and count it
                log.exception("memexporter: the on_oom_risk callback %r raised; training goes on", fn)
                count_failure("on_oom_risk callback")

    def stop(self) -> None:
        self._stop.set()
        if self._sources.steps is not None:
            self._sources.steps.remove_boundary_callback(self.at_boundary)


# --- The callbacks of this process (registered before or after start()). ------------------------

_registered: tuple[Callable[[OomRisk], None], ...] = ()


def registered() -> tuple[Callable[[OomRisk], None], ...]:
    """This process's ``on_oom_risk`` callbacks, in the order registered."""
    return _registered


class RiskHandle:
    """Returned by ``on_oom_risk``: ``remove()`` it (or use it as a context manager)."""

    def __init__(self, fn: Callable[[OomRisk], None]) -> None:
        self.fn = fn

    def remove(self) -> None:
        global _registered
        items = list(_registered)
        if self.fn in items:
            items.remove(self.fn)
        _registered = tuple(items)

    def __enter__(self) -> RiskHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def register(fn: Callable[[OomRisk], None]) -> RiskHandle:
    """Add ``fn`` to this process's ``on_oom_risk`` callbacks (``TypeError`` when it is not callable); the
    handle removes it."""
    global _registered
    if not callable(fn):
        raise TypeError(f"memexporter.on_oom_risk: expected a callable taking an OomRisk, got {fn!r}")
    _registered += (fn,)
    return RiskHandle(fn)
