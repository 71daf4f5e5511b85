"""The record schedule (tracking/schedule.py) as a table: which passes are recorded, and when an
entry starts a new count, against a scripted clock."""

from __future__ import annotations

import pytest

from memexporter.tracking import schedule
from memexporter.tracking.schedule import MAX_REENTRIES, Schedule


@pytest.fixture(autouse=True)
def _shipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schedule, "RECORD_INTERVAL_S", 1.0)
    monkeypatch.setattr(schedule, "RECORD_EVERY", 8)


def run(steps: list[float]) -> list[bool]:
    """One entry (row 0), one backward and one optimizer step per pass, at the given times."""
    now = [0.0]
    s = Schedule(clock=lambda: now[0])
    out = []
    for t in steps:
        now[0] = t
        record, _ = s.enter(0)
        out.append(record)
        s.backward = record
        s.step()
    return out


@pytest.mark.parametrize(
    ("step_s", "recorded"),
    [
        (0.01, [0, 100, 200]),  # fast steps: once a second
        (0.3, [0, 8, 16]),  # slower than 1 s per 4 steps: one in eight
        (5.0, [0, 8, 16]),  # slower than the interval: one in eight
    ],
)
def test_which_passes_are_recorded(step_s: float, recorded: list[int]) -> None:
    marks = run([i * step_s for i in range(24 if step_s >= 0.3 else 201)])
    assert [i for i, r in enumerate(marks) if r][:3] == recorded


def test_entries_of_a_pass_share_the_decision_and_reentry_after_backward_is_a_new_count() -> None:
    s = Schedule(clock=lambda: 0.0)
    assert s.enter(1) == (True, True)  # the first pass is recorded: a new count
    assert s.enter(2) == (True, False)  # the decoder joins it
    assert s.enter(1) == (True, False)  # called again before any backward: the same pass
    s.backward = True
    assert s.enter(1) == (False, False)  # after a backward: a new pass, not due (one in eight, 1 s)
    assert s.enter(2) == (False, False)  # ... and its decoder is not recorded either


def test_calls_without_a_backward_are_bounded() -> None:
    s = Schedule(clock=lambda: 0.0)
    assert s.enter(0)[0]
    assert all(s.enter(0) == (True, False) for _ in range(MAX_REENTRIES))
    assert s.enter(0) == (False, False)  # the 17th call starts a new pass, not due


def test_a_pass_around_which_another_model_records_is_recorded() -> None:
    s = Schedule(clock=lambda: 0.0)
    s.enter(0)
    s.backward = True
    assert s.enter(0, forced=True) == (True, True)
