"""The step tracker: per-step peak from the high-water mark, optimizer detection, never raising.
Backends are fakes (SYNTHETIC numbers); the optimizer hooks are torch's real global hooks."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

import memexporter
from memexporter.tracking import boundaries, phases
from memexporter.tracking.modules import track
from memexporter.tracking.steps import StepTracker
from tests.support.fakes import FakeCuda, FakeHost, MiB


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
    return StepTracker(
        FakeCuda(), host, window=64, warmup_steps=0, clock=iter(range(10**6)).__next__, host_peak=lambda: host.hwm
    )


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


def test_failures_are_counted_not_raised_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    host = ScriptedHost(fail=True)
    t = tracker(host)
    with caplog.at_level(logging.ERROR, logger="memexporter"):
        t.step()
        t.sample()
        t.step()
    assert t.errors == 3
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]  # once, with its traceback
    assert "synthetic failure" in str(record.exc_info[1] if record.exc_info else None)


def test_a_failing_host_read_never_stops_step_counting() -> None:
    # Issue 24 (6): psutil's memory_info() raising froze steps_total. The count and the other
    # devices go on; only the failing device misses its points, and it comes back by itself.
    host = ScriptedHost()
    cuda = FakeCuda(stats={0: {"allocated_bytes.all.current": 5 * MiB, "allocated_bytes.all.peak": 9 * MiB}})
    t = StepTracker(
        cuda, host, window=64, warmup_steps=0, clock=iter(range(10**6)).__next__, host_peak=lambda: host.hwm
    )
    t.step()
    host.fail = True
    for _ in range(3):
        t.step()
    assert t.snapshot().steps == 4 and t.errors == 3
    assert len(t.snapshot().devices["cuda:0"].recent_peaks) == 4  # the GPU's points go on
    assert len(t.snapshot().devices["cpu"].recent_peaks) == 1
    host.fail = False
    t.step()
    assert t.snapshot().steps == 5 and t.snapshot().devices["cpu"].last_baseline == host.used


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
    boundaries.activate(t, auto_step=True)
    yield t
    boundaries.activate(None, auto_step=False)


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


class _NestedSGD(torch.optim.SGD):
    """A custom optimizer that delegates to its parent: torch wraps both classes' step(), so the
    global hooks run twice per call (pre, pre, post, post)."""

    def step(self, closure: Any = None) -> Any:
        return super().step(closure)


def test_a_subclass_step_calling_super_counts_once(active: StepTracker) -> None:
    model = torch.nn.Linear(8, 8)
    torch.optim.SGD(model.parameters(), lr=0.1)  # SGD.step is wrapped (and hooked) first
    opt = _NestedSGD(model.parameters(), lr=0.1)
    for _ in range(3):
        _train(opt, model)
    assert active.steps == 3


def test_a_step_that_raised_does_not_stop_the_next_from_counting(active: StepTracker) -> None:
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _train(opt, model)
    with pytest.raises(RuntimeError, match="closure"):
        opt.step(closure=lambda: (_ for _ in ()).throw(RuntimeError("closure")))  # pre hook ran, post never
    _train(opt, model)
    assert active.steps == 2


def test_manual_step_turns_off_detection(active: StepTracker) -> None:
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _train(opt, model)  # detected
    for _ in range(3):  # two optimizer steps per step of the user's
        memexporter.step()
        _train(opt, model)
        _train(opt, model)
    # Detection alone would count 1 + 6, both together 1 + 3 + 6.
    assert active.steps == 1 + 3


def test_a_deactivated_tracker_counts_nothing() -> None:
    t = tracker(ScriptedHost())
    boundaries.activate(t, auto_step=True)
    boundaries.activate(None, auto_step=False)
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


def test_stop_and_start_in_the_middle_of_an_optimizer_step_never_raise_into_it() -> None:
    # The worst moment for a stop() or start() from another thread: while Optimizer.step iterates
    # torch's global hook dicts. Adding or removing a hook then raises "OrderedDict mutated during
    # iteration" into training, so activate() only swaps the tracker. A thread cannot hit that
    # window reliably; a user's own global hooks run exactly inside it.
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    boundaries.activate(tracker(ScriptedHost()), auto_step=True)  # our hooks are installed by now
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stops = register_optimizer_step_pre_hook(lambda *a: boundaries.activate(None, auto_step=False))
    starts = register_optimizer_step_post_hook(lambda *a: boundaries.activate(tracker(ScriptedHost()), auto_step=True))
    try:
        for _ in range(3):
            _train(opt, model)
    finally:
        stops.remove()
        starts.remove()
        boundaries.activate(None, auto_step=False)


@pytest.fixture
def flat_mark() -> Iterator[tuple[StepTracker, ScriptedHost]]:
    """An active tracker whose high-water mark never moves: step peaks come from samples only.
    With its phase tracker, as the exporter wires them (the forward hooks reach it through that)."""
    host = ScriptedHost(hwm=500 * MiB)
    t = tracker(host)
    boundaries.activate(t, auto_step=True)
    phases.activate(phases.PhaseTracker(t))
    yield t, host
    boundaries.activate(None, auto_step=False)
    phases.activate(None)


def test_the_moment_before_an_optimizer_step_is_a_peak_sample(flat_mark: tuple[StepTracker, ScriptedHost]) -> None:
    t, host = flat_mark
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def gradients_freed(*args: object) -> None:  # runs after step(), before the global post-hook
        host.used = 120 * MiB

    opt.register_step_post_hook(gradients_freed)
    for _ in range(2):  # the first boundary only starts the device's window
        model(torch.randn(4, 8)).sum().backward()
        host.used = 150 * MiB  # gradients alive: the pre-step sample sees this
        opt.step()
    assert last(t) == (120 * MiB, 150 * MiB)


def test_the_end_of_a_tracked_forward_is_a_peak_sample(flat_mark: tuple[StepTracker, ScriptedHost]) -> None:
    t, host = flat_mark

    class Spiky(torch.nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            host.used = 200 * MiB  # activations at their largest when the forward ends
            return super().forward(x)

    model = Spiky(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with track(model, opt):
        for _ in range(2):
            model(torch.randn(4, 8)).sum().backward()
            host.used = 120 * MiB  # freed by backward, before the optimizer step
            opt.step()
    assert last(t) == (120 * MiB, 200 * MiB)


@pytest.mark.parametrize("stepped_while_running", [True, False], ids=["step-then-stop", "stop-then-step"])
def test_the_next_start_detects_optimizer_steps_whatever_the_last_run_did(stepped_while_running: bool) -> None:
    # A new start() after stop() detects optimizer steps again: a stopped exporter forgets the manual mode, and
    # memexporter.step() after stop() (a loop that outlives its exporter; in the suite, a test after
    # test_debug_endpoints.py's stop-then-step) once set it for the next start(), which then counted no
    # optimizer step and served no memexporter_last_step_timestamp_seconds.
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    boundaries.activate(tracker(ScriptedHost()), auto_step=True)
    if stepped_while_running:
        memexporter.step()  # manual mode on
    boundaries.activate(None, auto_step=False)
    if not stepped_while_running:
        memexporter.step()
    fresh = tracker(ScriptedHost())
    boundaries.activate(fresh, auto_step=True)
    try:
        _train(opt, model)
        assert fresh.steps == 1
    finally:
        boundaries.activate(None, auto_step=False)


def test_a_second_optimizers_step_end_is_a_peak_sample(flat_mark: tuple[StepTracker, ScriptedHost]) -> None:
    # A GAN: the first optimizer to step marks the boundary; the other's step end is a sample.
    t, host = flat_mark
    g, d = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    opt_g, opt_d = torch.optim.SGD(g.parameters(), lr=0.1), torch.optim.SGD(d.parameters(), lr=0.1)

    def generator_state_peaks(*args: object) -> None:  # after opt_g.step(), before the global post-hook
        host.used = 300 * MiB

    opt_g.register_step_post_hook(generator_state_peaks)
    for _ in range(2):
        host.used = 120 * MiB
        _train(opt_d, d)  # the boundary (first seen stepping)
        _train(opt_g, g)
    host.used = 120 * MiB
    _train(opt_d, d)
    assert t.steps == 3
    assert last(t) == (120 * MiB, 300 * MiB)
