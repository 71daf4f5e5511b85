"""The step tracker: per-step peak from the high-water mark, optimizer detection, never raising.
Backends are fakes (SYNTHETIC numbers); the optimizer hooks are torch's real global hooks."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import torch

from memexporter.tracking import steps
from memexporter.tracking.steps import StepTracker
from tests.unit.fakes import FakeCuda, FakeHost, MiB


@dataclass
class ScriptedHost(FakeHost):
    """A host whose rss and lifetime high-water mark the test sets step by step."""

    used: int = 100 * MiB
    hwm: int = 100 * MiB
    fail: bool = False
    reads: list[int] = field(default_factory=list)

    def rss(self) -> int:
        if self.fail:
            raise OSError("synthetic failure")
        self.reads.append(self.used)
        return self.used


def tracker(host: ScriptedHost) -> StepTracker:
    return StepTracker(FakeCuda(), host, window=64, warmup_steps=0, clock=iter(range(10**6)).__next__,
                       host_peak=lambda: host.hwm)


def last(t: StepTracker) -> tuple[float, float]:
    pts = t.snapshot().devices["cpu"]
    return pts.last_baseline or 0.0, pts.last_peak or 0.0


def test_peak_is_exact_when_high_water_rises() -> None:
    host = ScriptedHost()
    t = tracker(host)
    t.step()
    host.hwm, host.used = 180 * MiB, 110 * MiB  # the step went up to 180 MiB, ends at 110
    t.step()
    assert last(t) == (110 * MiB, 180 * MiB)


def test_peak_is_highest_sample_when_high_water_flat() -> None:
    host = ScriptedHost(hwm=500 * MiB)
    t = tracker(host)
    t.step()
    host.used = 150 * MiB
    t.sample()  # e.g. the end of the forward
    host.used = 120 * MiB
    t.step()
    assert last(t) == (120 * MiB, 150 * MiB)


def test_peak_never_below_either_boundary() -> None:
    host = ScriptedHost(hwm=500 * MiB, used=130 * MiB)
    t = tracker(host)
    t.step()
    host.used = 90 * MiB
    t.step()
    assert last(t) == (90 * MiB, 130 * MiB)


def test_failures_are_counted_not_raised() -> None:
    host = ScriptedHost(fail=True)
    t = tracker(host)
    t.step()
    t.sample()
    assert t.errors == 2


def test_window_is_bounded() -> None:
    host = ScriptedHost()
    t = tracker(host)
    for _ in range(1000):
        t.step()
    assert t.steps == 1000
    assert len(t.snapshot().devices["cpu"].steps) <= 64


@pytest.fixture
def active() -> Iterator[StepTracker]:
    t = tracker(ScriptedHost())
    steps.activate(t, auto_step=True)
    yield t
    steps.activate(None, auto_step=False)


def _train(opt: torch.optim.Optimizer, model: torch.nn.Module) -> None:
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()


def test_optimizer_steps_are_boundaries(active: StepTracker) -> None:
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        _train(opt, model)
    assert active.steps == 5


def test_several_optimizers_count_one_step_per_iteration(active: StepTracker) -> None:
    g, d = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    opt_g, opt_d = torch.optim.SGD(g.parameters(), lr=0.1), torch.optim.Adam(d.parameters())
    for _ in range(4):
        _train(opt_d, d)
        _train(opt_g, g)
    assert active.steps == 4


def test_manual_step_turns_off_detection(active: StepTracker) -> None:
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _train(opt, model)
    for _ in range(3):  # gradient accumulation: three micro-batches, one step of the user's
        steps.step()
        _train(opt, model)
    assert active.steps == 1 + 3


def test_hooks_removed_on_deactivate() -> None:
    t = tracker(ScriptedHost())
    steps.activate(t, auto_step=True)
    steps.activate(None, auto_step=False)
    model = torch.nn.Linear(8, 8)
    _train(torch.optim.SGD(model.parameters(), lr=0.1), model)
    assert t.steps == 0


def test_user_peak_reset_does_not_collapse_the_peak() -> None:
    # torchtitan and HF trackers call reset_peak_memory_stats(): the mark falls mid-step.
    host = ScriptedHost(hwm=900 * MiB, used=100 * MiB)
    t = tracker(host)
    t.step()
    host.used = 400 * MiB
    t.sample()
    host.hwm, host.used = 700 * MiB, 110 * MiB  # reset, then the step peaked at 700 MiB
    t.step()
    assert last(t) == (110 * MiB, 700 * MiB)


def test_steady_state_peak_estimated_from_the_last_exact_excursion() -> None:
    # Step 2 measured exactly: it went 300 MiB above its start. Later steps do the same but the
    # lifetime mark no longer rises; the boundaries alone would say "100 MiB".
    host = ScriptedHost(hwm=100 * MiB, used=100 * MiB)
    t = tracker(host)
    t.step()
    host.hwm = 400 * MiB
    t.step()
    assert last(t) == (100 * MiB, 400 * MiB)
    for _ in range(3):
        t.step()
        assert last(t) == (100 * MiB, 400 * MiB)
    host.used = 150 * MiB  # the baseline grew by 50 MiB but the mark did not rise: capped by it
    t.step()
    host.used = 150 * MiB
    t.step()
    assert last(t) == (150 * MiB, 400 * MiB)


def test_stop_from_another_thread_while_training_never_raises_into_step() -> None:
    # The global hooks stay registered; activate() only swaps the tracker, so torch's hook dicts
    # are never mutated while Optimizer.step iterates them.
    import threading

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    other = register_optimizer_step_pre_hook(lambda *a: None)  # a user's own global hook
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            steps.activate(tracker(ScriptedHost()), auto_step=True)
            steps.activate(None, auto_step=False)

    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        for _ in range(300):
            _train(opt, model)
    finally:
        stop.set()
        flipper.join()
        other.remove()
        steps.activate(None, auto_step=False)
