"""The heartbeat's arithmetic of one helper (serving/job/running.py ``Running``): silent past the limit once it
serves, three times that while its interpreter starts, and any message answers every ping before it."""

from __future__ import annotations

from memexporter.serving.job.running import STARTING, Running


def not_started() -> Running:
    """The heartbeat's state alone: no process (``Running.__init__`` spawns one)."""
    helper = Running.__new__(Running)
    helper.reported, helper._asked = False, None
    return helper


def test_silent_past_the_limit_once_it_serves_and_three_times_it_while_it_starts() -> None:
    helper = not_started()
    assert not helper.silent(1000.0, 10.0)  # nothing asked yet
    helper._asked = 100.0  # as ping(100.0) sets it
    assert not helper.silent(100.0 + 10.0 * STARTING - 1, 10.0) and helper.silent(100.0 + 10.0 * STARTING + 1, 10.0)
    helper.reported = True
    assert not helper.silent(109.0, 10.0) and helper.silent(111.0, 10.0)
    helper.heard()
    assert not helper.silent(1000.0, 10.0)
