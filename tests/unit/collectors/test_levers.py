"""collectors/levers.py: the levers gathered from a scrape's sources (fake backends, SYNTHETIC figures),
and the live page's copy of them, gathered at most every ``PAGE_INTERVAL_S`` (issue 44)."""

from __future__ import annotations

from typing import Any

import pytest

from memexporter.collectors import levers
from memexporter.oom.levers import TRACK
from memexporter.tracking.steps import StepTracker
from tests.support.fakes import FakeHost, one_gpu, sources


def steps() -> StepTracker:
    cuda, _ = one_gpu()
    return StepTracker(cuda, FakeHost(), window=64, warmup_steps=0, host_peak=lambda: 0)  # type: ignore[arg-type]


def test_no_step_tracker_no_levers_and_untracked_rows_say_track() -> None:
    assert levers.gather(sources()) == ()
    cuda, nvml = one_gpu()
    got = levers.gather(sources(cuda, nvml, steps=steps()))
    assert {v.kind for v in got} == {"checkpointing", "sharding", "precision"}
    assert all(v.device == "cuda:0" and v.freed_bytes is None and v.basis == TRACK for v in got)


def test_the_page_gathers_at_most_every_interval_and_keeps_the_last_list(monkeypatch: pytest.MonkeyPatch) -> None:
    now, calls = [0.0], [0]
    answer: list[Any] = [()]

    def fake_gather(*args: object) -> Any:
        calls[0] += 1
        if isinstance(answer[0], Exception):
            raise answer[0]
        return answer[0]

    monkeypatch.setattr(levers, "gather", fake_gather)
    page = levers.for_the_page(sources(), lambda: None, clock=lambda: now[0])
    lever = levers.lv.Lever("precision", "cpu", "bf16", 8.0, "b")
    answer[0] = (lever,)
    assert page() == [lever.to_json()] and calls[0] == 1
    now[0] += levers.PAGE_INTERVAL_S / 2
    answer[0] = ()
    assert page() == [lever.to_json()] and calls[0] == 1  # within the interval: the last list
    now[0] += levers.PAGE_INTERVAL_S
    answer[0] = RuntimeError("a reading failed")
    assert page() == [lever.to_json()] and calls[0] == 2  # a failed gathering keeps it
    assert levers.findings_of(None)() is None
