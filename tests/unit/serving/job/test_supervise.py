"""The restart policy (serving/job/supervise.py), on an injected clock: 1 s doubling to 60 s between restarts,
the pace started over after a helper that lived, and giving up after 10 restarts within 10 minutes."""

from __future__ import annotations

import pytest

from memexporter.serving.job.supervise import POLICY, Policy, Restarts


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_wait_doubles_from_one_second_to_a_minute() -> None:
    clock = Clock()
    restarts = Restarts(Policy(burst=100), clock)
    waits = []
    for _ in range(9):
        wait = restarts.exited(uptime=0.5)
        assert wait is not None
        waits.append(wait)
        clock.now += wait
        restarts.restarted()
    assert waits == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert restarts.count == 9


def test_a_helper_that_lived_a_minute_starts_the_pace_over() -> None:
    clock = Clock()
    restarts = Restarts(POLICY, clock)
    assert [restarts.exited(0.5), restarts.exited(0.5), restarts.exited(0.5)] == [1, 2, 4]
    assert restarts.exited(uptime=POLICY.steady) == 1


def test_ten_restarts_within_ten_minutes_then_it_gives_up_and_a_quiet_window_lets_it_go_on() -> None:
    clock = Clock()
    restarts = Restarts(POLICY, clock)
    for _ in range(10):
        wait = restarts.exited(uptime=0.3)
        assert wait is not None
        clock.now += wait + 0.3
        restarts.restarted()
    assert clock.now < POLICY.window
    assert restarts.exited(uptime=0.3) is None  # the eleventh exit within the window
    assert restarts.exited(uptime=0.3) is None
    clock.now = 10 * 60 + 5  # the first restarts left the window
    assert restarts.exited(uptime=0.3) is not None


@pytest.mark.parametrize("lives", [0.0, 0.3, 2.0])
def test_a_helper_killed_six_times_in_a_row_means_at_most_eight_helpers_in_a_minute(lives: float) -> None:
    """The issue's target: each new helper killed ``lives`` seconds after it starts, six times."""
    clock = Clock()
    restarts = Restarts(POLICY, clock)
    started = [0.0]
    for _ in range(6):
        clock.now = started[-1] + lives
        wait = restarts.exited(uptime=lives)
        assert wait is not None
        clock.now += wait
        restarts.restarted()
        started.append(clock.now)
    assert len([t for t in started if t < 60]) <= 8, started
    assert started[1] - started[0] <= 2 + lives  # the first restart comes within ~2 s of the exit
