"""The server's CPU budget and the request-rate limit, on a fake clock."""

from __future__ import annotations

import time

import pytest

from memexporter.serving.budget import Budget, Meter, RateLimit, retry_after


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_budget_refills_at_its_share_and_pauses_until_the_margin_is_back() -> None:
    clock = Clock()
    budget = Budget(share=0.02, burst=0.1, max_debt=0.05, clock=clock)
    assert budget.wait() == 0.0
    budget.charge(0.11)  # the burst and 10 ms more
    assert budget.wait() == pytest.approx(0.5)  # 10 ms of debt at 20 ms a second
    assert budget.wait(margin=0.001) == pytest.approx(0.55)
    clock.now += 0.5
    assert budget.wait() == 0.0
    clock.now += 100  # never more than the burst in hand
    budget.charge(0.1)
    assert budget.wait() == 0.0 and budget.spent == pytest.approx(0.21)


def test_one_huge_answer_pauses_for_at_most_max_debt_over_share() -> None:
    clock = Clock()
    budget = Budget(share=0.02, burst=0.1, max_debt=0.05, clock=clock)
    budget.charge(10.0)
    assert budget.wait() == pytest.approx(2.5)


def test_busy_while_in_debt_and_for_a_while_after() -> None:
    clock = Clock()
    budget = Budget(share=0.02, burst=0.1, max_debt=0.05, clock=clock)
    assert not budget.busy(0.5)
    budget.charge(0.101)  # 1 ms of debt: repaid in 50 ms
    assert budget.busy(0.5)
    clock.now += 0.1
    assert budget.wait() == 0.0 and budget.busy(0.5)
    clock.now += 0.5
    assert not budget.busy(0.5)


def test_meter_charges_the_threads_cpu_time() -> None:
    budget = Budget(share=0.02, burst=10.0)
    meter = Meter(budget)
    end = time.thread_time() + 0.02
    while time.thread_time() < end:
        pass
    meter.tick()
    assert 0.02 <= budget.spent < 1.0


def test_rate_limit_allows_the_burst_then_the_rate() -> None:
    clock = Clock()
    limit = RateLimit(rate=1.0, burst=3.0, clock=clock)
    assert [limit.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limit.take() == pytest.approx(1.0)
    clock.now += 0.25
    assert limit.take() == pytest.approx(0.75)  # a refusal takes no token
    clock.now += 0.75
    assert limit.take() == 0.0


@pytest.mark.parametrize(("seconds", "header"), [(0.0, "1"), (0.2, "1"), (1.0, "1"), (1.01, "2"), (7.5, "8")])
def test_retry_after_is_whole_seconds_at_least_one(seconds: float, header: str) -> None:
    assert retry_after(seconds) == header
