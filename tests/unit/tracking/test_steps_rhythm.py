"""The step count and rhythm (tracking/steps.py through ``memexporter.step``): ``step(count=)`` takes a
count ahead and never goes back; the last step's time and the median step interval from the clocks.
They run on the phase tests' rig of scripted trackers (test_phases.py)."""

from __future__ import annotations

import memexporter
from tests.unit.tracking.test_phases import Rig


def test_step_count_takes_a_count_ahead_and_never_goes_back(rig: Rig) -> None:
    memexporter.step(count=10)
    assert rig.steps.steps == 10
    memexporter.step()
    assert rig.steps.steps == 11
    memexporter.step(count=5)  # behind ours: one more, never backwards
    assert rig.steps.steps == 12
    memexporter.step(count=100)
    assert rig.steps.steps == 100
    assert rig.steps.snapshot().steps == 100
    assert rig.registry().get_sample_value("memexporter_steps_total", {"rank": "3"}) == 100


def test_last_step_time_and_step_interval_from_the_clocks(rig: Rig) -> None:
    snap = rig.steps.snapshot()
    assert (snap.last_step_time, snap.step_interval) == (None, None)
    rig.step(dt=1.0)
    snap = rig.steps.snapshot()
    assert snap.last_step_time == rig.wall.now and snap.step_interval is None  # one boundary: no interval
    for _ in range(20):
        rig.step(dt=1.0)
    assert rig.steps.snapshot().step_interval == 1.0
    for _ in range(20):
        rig.step(dt=3.0)
    # The median of the last 32 intervals (12 of 1 s, 20 of 3 s), not of all 40 (which is 2 s).
    assert rig.steps.snapshot().step_interval == 3.0
    assert rig.steps.snapshot().last_step_time == rig.wall.now == 1.8e9 + 81
    reg = rig.registry()
    assert reg.get_sample_value("memexporter_step_interval_seconds", {"rank": "3"}) == 3.0
    assert reg.get_sample_value("memexporter_last_step_timestamp_seconds", {"rank": "3"}) == 1.8e9 + 81
