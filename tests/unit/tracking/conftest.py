"""Every test here (the per-module tracking, the step and phase trackers, discovery) leaves no model
tracked and the process-wide hook-error counter as it found it (some tests inject failures), so
tests stay independent of order and of each other.

Every grad-enabled forward is recorded here (``RECORD_INTERVAL_S`` 0, ``RECORD_EVERY`` 1): these tests check what a
recorded forward counts. The rate limit has its own test, which sets the interval back.

``rig``: the scripted step and phase trackers of test_phases.py (``make_rig``) made active, for the
phase tests and the step rhythm's (test_phases*.py, test_steps_rhythm.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import memexporter
from memexporter.tracking import boundaries, errors, phases, schedule
from memexporter.tracking.modules import TrackHandle, active_handles
from tests.unit.tracking.test_phases import Rig, make_rig


@pytest.fixture(autouse=True)
def _record_every_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schedule, "RECORD_INTERVAL_S", 0.0)
    monkeypatch.setattr(schedule, "RECORD_EVERY", 1)


@pytest.fixture(autouse=True)
def _untrack_all() -> Iterator[None]:
    count = errors._errors  # not monkeypatch: tests call monkeypatch.undo() part-way
    yield
    for h in list(active_handles()):
        assert isinstance(h, TrackHandle)
        h.remove()
    errors._errors = count


@pytest.fixture
def rig() -> Iterator[Rig]:
    """Trackers made active as the exporter does, so ``memexporter.phase``/``step`` reach them."""
    memexporter.stop()
    r = make_rig()
    boundaries.activate(r.steps, auto_step=True)
    phases.activate(r.phases)
    yield r
    boundaries.activate(None, auto_step=False)
    phases.activate(None)
