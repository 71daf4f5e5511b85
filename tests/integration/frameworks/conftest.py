"""Fixtures of the framework tests: an exporter on a loopback port that counts every step and
records every grad-enabled forward, and no tracked model left behind (``clean``: nor any exporter,
for the callback tests)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import memexporter
from memexporter.tracking import gradients as mx_optimizer
from memexporter.tracking import schedule as mx_schedule
from memexporter.tracking.modules import active_handles, hook_errors
from tests.support import heap


@pytest.fixture
def count_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gradient and optimizer-state bytes recounted at every optimizer step (shipped: once a second
    and at the first step), and every grad-enabled forward recorded (shipped: at most one a second,
    one in eight, and the first)."""
    monkeypatch.setattr(mx_optimizer, "STEP_COUNT_INTERVAL_S", 0.0)
    monkeypatch.setattr(mx_schedule, "RECORD_INTERVAL_S", 0.0)
    monkeypatch.setattr(mx_schedule, "RECORD_EVERY", 1)


@pytest.fixture
def untrack_all() -> Iterator[None]:
    """Remove whatever model a test (or a framework callback that failed half-way) left tracked."""
    yield
    for h in list(active_handles()):
        h.remove()  # type: ignore[attr-defined]


@pytest.fixture
def clean(no_exporter: None, untrack_all: None) -> None:
    """No exporter and no tracked model before or after; the callback must leave none behind."""


@pytest.fixture
def worn_heap() -> Iterator[None]:
    """The heap of a worker that ran other tests first (``tests/support/heap.worn``): 320 MiB freed and
    still resident. The 64 MiB that an evaluation holds was once invisible to the RSS there."""
    with heap.worn():
        yield


@pytest.fixture
def start_exporter(no_exporter: None, count_every_step: None, untrack_all: None) -> Callable[..., Any]:
    """``start(**kwargs)``: ``memexporter.start(port=0, addr="127.0.0.1", **kwargs)``; stopped and
    every handle removed after the test (``no_exporter``)."""

    def start(**kwargs: Any) -> Any:
        exp = memexporter.start(port=0, addr="127.0.0.1", **kwargs)
        assert exp.url is not None, "the exporter did not bind a loopback port"
        return exp

    return start


@pytest.fixture
def errors_before() -> int:
    """``memexporter.tracking.modules.hook_errors()`` before the test: process-wide, so a test
    checks that its run added none."""
    return hook_errors()


@pytest.fixture(autouse=True)
def _fresh_accelerate_state() -> Iterator[None]:
    """accelerate keeps its state (``AcceleratorState``, ``GradientState``: accumulation steps, the
    sync flag) process-wide, and the HF ``Trainer`` builds an ``Accelerator`` too: each test starts
    and ends with none (accelerate's own tests reset it the same way)."""
    yield
    state = sys.modules.get("accelerate.state")
    if state is not None:
        state.AcceleratorState._reset_state(reset_partial_state=True)
        state.GradientState._reset_state()
