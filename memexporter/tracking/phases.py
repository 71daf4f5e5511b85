"""Phases: named stretches of a run with their own peaks, on the training thread's side.

``memexporter.phase("eval")`` (api.py) opens and closes phases here; so do the automatic ones of a
tracked model: ``forward`` (its outermost forward), ``backward`` (from the end of a grad-enabled
forward to the next forward or optimizer step: the loss and the backward pass) and ``optimizer``
(the optimizer's step). Each phase boundary takes one reading of every device's ``used`` and
lifetime high-water mark through the step tracker (one RSS read on CPU, one allocator-stats read
per CUDA device), which also serves as a step-peak sample.

A phase's peak never resets the user's peak statistics. When the lifetime high-water mark
(``allocated_bytes.all.peak`` on CUDA, the process's own RSS mark on CPU: ``backends/highwater.py``)
rose during the phase, the phase's peak *is* the new mark: exact. Otherwise it is the highest sample taken at its boundaries and
inside it (step-peak samples, the end of a tracked forward): a lower bound. On CPU the RSS sees
what the C allocator keeps mapped, not what tensors hold.

Out-of-step phases (``OUT_OF_STEP_PHASES``) keep their memory out of the step peak: the step
tracker holds its step peak when the first one opens and takes it back, with the high-water mark
the phase left as the new reference, when the last one closes. So an evaluation's high-water mark
does not become every later training step's "peak".
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memexporter.backends.base import Reading

if TYPE_CHECKING:
    from memexporter.tracking.steps import Readings, StepTracker

# Phases between training steps: their memory is their own, kept out of
# ``memexporter_memory_peak_bytes`` (the step peak the OOM forecast reads); the stalled-run alert
# allows them their own last duration. Any other name is part of the step accounting.
OUT_OF_STEP_PHASES = frozenset({"eval", "validation", "test", "predict", "checkpoint"})
# The phases memexporter marks by itself: parts of a training step.
AUTOMATIC_PHASES = ("forward", "backward", "optimizer")
# The training step's own phases: the automatic ones and the callbacks' "train" (one step).
TRAINING_PHASES = frozenset({"train", *AUTOMATIC_PHASES})
MAX_PHASES = 16
"""Distinct phase names exported per process; later names are counted as ``OTHER`` (except the
out-of-step names, which always keep theirs: at most 21 names)."""
OTHER = "other"
INSIDE_INTERVAL_S = 0.1
"""Seconds between the readings at a tracked forward's end inside an out-of-step phase (``inside``)."""


@dataclass
class _Open:
    """One occurrence of a phase, while it runs."""

    name: str
    started: float  # monotonic seconds
    start: dict[str, Reading]  # device -> its reading at the start
    separate: bool = False  # an out-of-step phase
    top: dict[str, int] = field(default_factory=dict)  # device -> highest used sampled since


@dataclass
class PhaseStats:
    """One phase name's figures: the last completed occurrence's peak per device (bytes) and
    duration (seconds), completed occurrences, and how many are open now."""

    peaks: dict[str, int] = field(default_factory=dict)
    duration: float = 0.0
    completed: int = 0
    active: int = 0


def _peak(start: Reading | None, top: int, used: int, high_water: int) -> int:
    """Peak bytes of one device over one occurrence (the rule in the module docstring)."""
    if start is None:  # the device appeared during the phase: its whole high-water mark is within it
        return high_water
    start_used, start_mark = start.used, start.peak
    if high_water > start_mark:  # a new lifetime high during the phase: it is the phase's peak
        return high_water
    samples = max(top, start_used, used)
    # A mark below the start's: the user reset their peak stats inside the phase, and the mark
    # since the reset is within it. An unchanged mark is older than the phase: no bound.
    return max(samples, high_water) if high_water < start_mark else samples


class PhaseTracker:
    """Open occurrences and per-name figures. ``enter``/``exit`` run on any thread; never raise."""

    def __init__(
        self, steps: StepTracker, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time
    ) -> None:
        self._steps, self._clock, self._wall = steps, clock, wall
        self._lock = threading.Lock()
        self._open: list[_Open] = []
        self._stats: dict[str, PhaseStats] = {}
        self._out_of_step = 0  # out-of-step occurrences open now
        self._inside_at = -1e18  # when a forward's end inside one was last read (monotonic s)
        self.last_change: float | None = None  # unix time a phase began or ended
        steps.add_observer(self._observe)

    @property
    def out_of_step(self) -> bool:
        return self._out_of_step > 0

    def sample(self) -> Readings | None:
        """One reading, also a step-peak sample (the step tracker's), on any step: a phase of the
        user's (an evaluation, a checkpoint) is rare and always measured."""
        return self._steps.sample(force=True)

    def inside(self) -> None:
        """A tracked forward ended inside a user's out-of-step phase (an evaluation) on a step
        that takes no intra-step readings: read at the first such end of the occurrence, then at
        most every ``INSIDE_INTERVAL_S``. What the evaluation's batches hold (a buffer from its
        first batch to its end) lies between its boundaries; without this, its peak would be
        exact only where the high-water mark rose."""
        now = self._clock()
        if now - self._inside_at >= INSIDE_INTERVAL_S:
            self._inside_at = now
            self.sample()

    @property
    def detailed(self) -> bool:
        """Whether this training step takes intra-step readings (``steps.Detail``): the automatic
        phases are measured on those steps only."""
        return self._steps.detailed

    def latest(self) -> Readings | None:
        """The step tracker's latest reading, without a new one (None before the first)."""
        return self._steps.last

    def _label(self, name: str) -> str:
        # The out-of-step names are never folded: the step peak leaves them out, so the OOM
        # judgement (rules, on_oom_risk) must find them by name.
        if name not in self._stats and len(self._stats) >= MAX_PHASES and name not in OUT_OF_STEP_PHASES:
            name = OTHER
        self._stats.setdefault(name, PhaseStats())
        return name

    def enter(self, name: str, readings: Readings | None = None) -> _Open | None:
        """Open an occurrence of ``name`` (``readings``: taken now, else read here)."""
        separate = name in OUT_OF_STEP_PHASES
        if separate:
            # Hold the step peak before the entering reading: memory still alive from a phase
            # that just ended (an evaluation right before a checkpoint) is not the step's.
            with self._lock:
                self._out_of_step += 1
                first = self._out_of_step == 1
            if first:
                self._steps.hold()
                self._inside_at = -1e18  # the occurrence's first forward end reads
        readings = self.sample() if readings is None else readings
        with self._lock:
            if readings is None:  # no reading at all: nothing opens, and nothing stays held
                self._out_of_step -= separate
                last = separate and self._out_of_step == 0
            else:
                token = _Open(self._label(name), self._clock(), dict(readings), separate)
                self._open.append(token)
                self._stats[token.name].active += 1
                self.last_change = self._wall()
        if readings is None:
            if last:
                self._steps.release(self._steps.last or {})
            return None
        return token

    def exit(self, token: _Open, readings: Readings | None = None) -> None:
        """Close ``token``: its peak per device and duration become the phase's last figures."""
        readings = self.sample() if readings is None else readings
        with self._lock:
            if token not in self._open:
                return
            self._open.remove(token)
            stats = self._stats[token.name]
            stats.active -= 1
            self.last_change = self._wall()
            if readings is not None:
                stats.peaks = {
                    d: _peak(token.start.get(d), token.top.get(d, 0), r.used, r.peak) for d, r in readings.items()
                }
                stats.duration = self._clock() - token.started
                stats.completed += 1
            self._out_of_step -= token.separate
            last = token.separate and self._out_of_step == 0
        if last and readings is not None:
            self._steps.release(readings)

    def _observe(self, readings: Readings) -> None:
        with self._lock:
            for token in self._open:
                for device, r in readings.items():
                    if r.used > token.top.get(device, 0):
                        token.top[device] = r.used

    def snapshot(self) -> tuple[dict[str, PhaseStats], float | None]:
        """A copy for the scrape thread: ``({name: stats}, last change)``."""
        with self._lock:
            return (
                {n: PhaseStats(dict(s.peaks), s.duration, s.completed, s.active) for n, s in self._stats.items()},
                self.last_change,
            )


# --- Process-wide wiring: the running tracker and the automatic phases. ---------------------------

_active: PhaseTracker | None = None
_owner_pid = os.getpid()
# The automatic phases' open occurrences (the training thread's; one of each at a time).
_auto: dict[str, _Open | None] = dict.fromkeys(AUTOMATIC_PHASES)


def activate(tracker: PhaseTracker | None) -> None:
    """Make ``tracker`` the process's running one (``None``: none), owned by this process."""
    global _active, _owner_pid
    _active, _owner_pid = tracker, os.getpid()
    for name in AUTOMATIC_PHASES:
        _auto[name] = None


def active() -> PhaseTracker | None:
    """The running tracker, or None (also in a forked child: the parent's does nothing there)."""
    return _active if os.getpid() == _owner_pid else None


def _switch(close: tuple[str, ...], open_: str | None, readings: Readings | None) -> None:
    """Close the automatic phases in ``close`` and open ``open_``, all with one reading."""
    tracker = active()
    if tracker is None or readings is None:
        return
    for name in close:
        token, _auto[name] = _auto[name], None
        if token is not None:
            tracker.exit(token, readings)
    if open_ is not None and _auto[open_] is None and not tracker.out_of_step:
        # Inside an evaluation its forwards are the evaluation's: no automatic phases there.
        _auto[open_] = tracker.enter(open_, readings)


def forward_begin() -> None:
    """The outermost forward of a tracked model starts. It takes no reading of its own: the
    latest one (the last step boundary, or the previous forward's end) starts the phase. A
    reading costs syscalls (RSS, high-water mark) or an allocator-stats read per CUDA device,
    which a cache-cold training loop pays 10-20 us for on CPU: the automatic phases add none."""
    tracker = active()
    if tracker is not None and tracker.detailed:
        _switch(("backward",), "forward", tracker.latest() or tracker.sample())  # none yet: the first forward


def forward_end(grad: bool) -> None:
    """It ended (also a step-peak sample): ``backward`` runs next if it kept a graph (``grad``)."""
    tracker = active()
    if tracker is None:
        return
    if tracker.detailed:
        _switch(("forward",), "backward" if grad else None, tracker.sample())
    elif tracker.out_of_step:
        tracker.inside()


def optimizer_begin(readings: Readings | None) -> None:
    """An optimizer step starts: the forward and backward phases end, ``optimizer`` opens."""
    _switch(("forward", "backward"), "optimizer", readings)


def optimizer_end(readings: Readings | None) -> None:
    """The optimizer step ended: the ``optimizer`` phase closes."""
    _switch(("optimizer",), None, readings)
