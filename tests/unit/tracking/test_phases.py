"""Phases (tracking/phases.py, ``memexporter.phase``): per-phase peak arithmetic, out-of-step phases
kept out of the step peak, nesting and threads, the automatic forward/backward/optimizer phases of a
real tracked model, ``step(count=)`` and the step rhythm. The exposition of a running exporter, with
promtool: tests/integration/test_exposition_promtool.py.

Memory traces are SYNTHETIC (a scripted host whose RSS and high-water mark the test sets); the
automatic-phase tests run a real ``torch.nn`` model and optimizer under a started exporter."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch
from prometheus_client import CollectorRegistry
from torch import nn

import memexporter
from memexporter.backends.base import HostSample
from memexporter.tracking import boundaries, phases
from memexporter.tracking.phases import MAX_PHASES, OTHER, OUT_OF_STEP_PHASES, PhaseStats, PhaseTracker
from memexporter.tracking.steps import Detail, StepTracker
from tests.support.fakes import FakeCuda, GiB, MiB, registry_for, sources
from tests.unit.tracking.test_steps import ScriptedHost


class Clock:
    """A fake clock: returns ``now``, which the test moves."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Host(ScriptedHost):
    """A scripted host whose lifetime high-water mark follows ``used`` upward (as ``ru_maxrss``
    does) and whose ``sample()`` agrees with ``rss()``."""

    def set(self, used: int) -> None:
        self.used = used
        self.hwm = max(self.hwm, used)

    def reset_peak(self) -> None:
        """What ``torch.cuda.reset_peak_memory_stats()`` does to a CUDA mark."""
        self.hwm = self.used

    def sample(self) -> HostSample:
        return HostSample(self.used, 0, 8 * GiB, 16 * GiB)


@dataclass
class Rig:
    host: Host
    cuda: FakeCuda
    steps: StepTracker
    phases: PhaseTracker
    clock: Clock  # monotonic seconds, for both trackers
    wall: Clock  # unix seconds

    def step(self, dt: float = 1.0) -> float:
        """One step boundary ``dt`` seconds after the last; the step's peak (bytes)."""
        self.clock.now += dt
        self.wall.now += dt
        self.steps.step()
        return peak(self.steps)

    def stats(self, name: str) -> PhaseStats:
        return self.phases.snapshot()[0][name]

    def registry(self) -> CollectorRegistry:
        """The full catalogue over these trackers, as a scrape sees them."""
        return registry_for(
            dataclasses.replace(sources(self.cuda, host=self.host, steps=self.steps), phases=self.phases)
        )


def peak(t: StepTracker, device: str = "cpu") -> float:
    last = t.snapshot().devices[device].last_peak
    assert last is not None
    return last


def make_rig(host: Host | None = None) -> Rig:
    host = host or Host()
    cuda, clock, wall = FakeCuda(), Clock(), Clock(1.8e9)
    t = StepTracker(cuda, host, window=64, warmup_steps=0, clock=clock, host_peak=lambda: host.hwm, wall=wall)
    return Rig(host, cuda, t, PhaseTracker(t, clock=clock, wall=wall), clock, wall)


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


# --- 1. Peak arithmetic ----------------------------------------------------------------------------


def test_peak_is_the_new_high_water_mark_when_it_rose_in_the_phase(rig: Rig) -> None:
    rig.host.set(150 * MiB)
    rig.host.set(100 * MiB)  # the lifetime mark is 150 MiB before the phase
    with memexporter.phase("data"):
        rig.host.set(300 * MiB)  # never sampled: only the mark knows
        rig.host.set(120 * MiB)
    assert rig.stats("data").peaks == {"cpu": 300 * MiB}


def test_flat_mark_peak_is_the_highest_sample(rig: Rig) -> None:
    rig.host.hwm = 900 * MiB  # an old mark: it says nothing about the phase
    with memexporter.phase("data"):
        rig.host.set(250 * MiB)
        boundaries.sample()  # e.g. the end of a tracked forward
        rig.host.set(120 * MiB)
    assert rig.stats("data").peaks == {"cpu": 250 * MiB}
    with memexporter.phase("data"):  # no sample inside: the boundaries bound it
        rig.host.set(200 * MiB)
        rig.host.set(130 * MiB)
    assert rig.stats("data").peaks == {"cpu": 130 * MiB}


@pytest.mark.parametrize(
    ("start", "inside", "end", "expected"),
    [
        (300, 200, 100, 300),  # the start's boundary
        (100, 200, 350, 350),  # the end's boundary
        (100, 400, 150, 400),  # a sample inside
    ],
)
def test_flat_mark_boundaries_count(rig: Rig, start: int, inside: int, end: int, expected: int) -> None:
    rig.host.hwm = 900 * MiB
    rig.host.set(start * MiB)
    with memexporter.phase("data"):
        rig.host.set(inside * MiB)
        boundaries.sample()
        rig.host.set(end * MiB)
    assert rig.stats("data").peaks["cpu"] == expected * MiB


def test_a_step_boundary_inside_a_phase_is_one_of_its_samples(rig: Rig) -> None:
    rig.host.hwm = 900 * MiB
    with memexporter.phase("train"):
        for used in (120, 180, 140):
            rig.host.set(used * MiB)
            rig.step()
        rig.host.set(110 * MiB)
    assert rig.stats("train").peaks["cpu"] == 180 * MiB


def test_a_peak_reset_inside_the_phase_counts_the_mark_since_the_reset(rig: Rig) -> None:
    rig.host.hwm = 900 * MiB
    rig.host.set(100 * MiB)
    with memexporter.phase("data"):
        rig.host.reset_peak()  # the user's reset: the mark falls to 100 MiB
        rig.host.set(200 * MiB)  # unsampled, but the new mark has it
        rig.host.set(120 * MiB)
    assert rig.host.hwm == 200 * MiB < 900 * MiB
    assert rig.stats("data").peaks["cpu"] == 200 * MiB
    rig.host.hwm = 900 * MiB
    with memexporter.phase("data"):
        rig.host.set(260 * MiB)
        boundaries.sample()  # sampled before the reset: above the mark since the reset
        rig.host.set(100 * MiB)
        rig.host.reset_peak()
        rig.host.set(200 * MiB)
        rig.host.set(120 * MiB)
    assert rig.stats("data").peaks["cpu"] == 260 * MiB


def test_a_device_that_appears_during_the_phase_gets_its_whole_mark(rig: Rig) -> None:
    with memexporter.phase("data"):  # cpu only so far
        rig.cuda.stats[0] = {"allocated_bytes.all.current": 1 * GiB, "allocated_bytes.all.peak": 3 * GiB}
        rig.step()  # a boundary rescans the devices: cuda:0 from now on
    assert set(rig.stats("data").peaks) == {"cpu", "cuda:0"}
    assert rig.stats("data").peaks["cuda:0"] == 3 * GiB


# --- 2. Out-of-step phases stay out of the step peak -----------------------------------------------


def _train_steps(rig: Rig, excursions: list[int], base: int = 100) -> list[float]:
    """Steps that go start -> start + excursion (sampled, as at a forward's end) -> start."""
    peaks = []
    for excursion in excursions:
        rig.host.set((base + excursion) * MiB)
        boundaries.sample()
        rig.host.set(base * MiB)
        peaks.append(rig.step())
    return peaks


@pytest.mark.parametrize("name", sorted(OUT_OF_STEP_PHASES))
def test_an_evaluation_above_everything_leaves_the_step_peaks_alone(rig: Rig, name: str) -> None:
    rig.host.set(100 * MiB)
    rig.step()  # the first boundary starts the window
    before = _train_steps(rig, [30, 40, 50, 50, 50])  # the mark rises on the first three
    assert before == [130 * MiB, 140 * MiB, 150 * MiB, 150 * MiB, 150 * MiB]

    with memexporter.phase(name):  # 64 MiB above every step: a new lifetime mark
        rig.host.set(150 * MiB)
        boundaries.sample()
        rig.host.set((150 + 64) * MiB)
        boundaries.sample()  # sampled too (an evaluation forward's end): still not the step's
        rig.host.set(100 * MiB)
    assert rig.host.hwm == 214 * MiB

    after = _train_steps(rig, [50, 50, 50])
    assert after == before[-3:]  # not 214 MiB: the evaluation's mark is not the steps'
    assert rig.stats(name).peaks == {"cpu": 214 * MiB}  # exact: the mark rose in it
    assert rig.stats(name).completed == 1
    assert (
        rig.registry().get_sample_value("memexporter_phase_peak_bytes", {"rank": "3", "device": "cpu", "phase": name})
        == 214 * MiB
    )


def test_a_phase_that_is_part_of_the_step_keeps_its_memory_in_the_step_peak(rig: Rig) -> None:
    rig.host.set(100 * MiB)
    rig.step()
    _train_steps(rig, [30, 40, 50, 50, 50])
    with memexporter.phase("data"):
        rig.host.set((150 + 64) * MiB)
        boundaries.sample()
        rig.host.set(100 * MiB)
    after = _train_steps(rig, [50])
    assert after == [214 * MiB]  # the data loading is the step's: its peak is the step's
    assert rig.stats("data").peaks == {"cpu": 214 * MiB}


# --- 3. Nesting, threads, decorator, no-op, names, duration, active, last change -----------------


def test_nested_out_of_step_phases_hold_the_step_peak_until_the_outer_ends(rig: Rig) -> None:
    rig.host.set(100 * MiB)
    rig.step()
    before = _train_steps(rig, [50, 50])
    with memexporter.phase("eval"):
        with memexporter.phase("checkpoint"):
            rig.host.set(180 * MiB)
            rig.host.set(100 * MiB)
        assert rig.phases.out_of_step  # the checkpoint's end does not release the step peak
        rig.host.set(300 * MiB)  # after the checkpoint, still inside the evaluation
        rig.host.set(100 * MiB)
    assert not rig.phases.out_of_step
    assert _train_steps(rig, [50, 50]) == before
    assert rig.stats("checkpoint").completed == rig.stats("eval").completed == 1
    assert rig.stats("checkpoint").peaks["cpu"] == 180 * MiB
    assert rig.stats("eval").peaks["cpu"] == 300 * MiB


def test_the_steps_own_samples_before_a_nested_evaluation_are_kept(rig: Rig) -> None:
    rig.host.hwm = 2 * GiB  # a flat mark: step peaks are the samples
    rig.host.set(100 * MiB)
    rig.step()
    rig.host.set(150 * MiB)
    boundaries.sample()  # this step's forward ended at 150 MiB; then it evaluates, mid-step
    rig.host.set(100 * MiB)
    with memexporter.phase("eval"):
        with memexporter.phase("checkpoint"):
            boundaries.sample()
        rig.host.set(300 * MiB)
        boundaries.sample()  # after the checkpoint, still inside the evaluation
        rig.host.set(100 * MiB)
    assert rig.step() == 150 * MiB  # the step's own 150, not the evaluation's 300 (nor only its boundaries' 100)
    assert rig.stats("eval").peaks["cpu"] == 300 * MiB


def test_one_phase_object_on_two_threads_closes_each_threads_own_occurrence(rig: Rig) -> None:
    evaluation = memexporter.phase("eval")
    a_in, b_in, a_go, b_go = (threading.Event() for _ in range(4))
    errors: list[BaseException] = []

    def a() -> None:
        try:
            with evaluation:
                a_in.set()
                assert a_go.wait(10)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def b() -> None:
        try:
            assert a_in.wait(10)
            rig.clock.now = 10.0
            with evaluation:
                b_in.set()
                assert b_go.wait(10)
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    ta, tb = threading.Thread(target=a), threading.Thread(target=b)
    ta.start()
    tb.start()
    assert b_in.wait(10)
    assert rig.stats("eval").active == 2
    rig.clock.now = 20.0
    a_go.set()  # A leaves first, while B's occurrence (the last one entered) is open
    ta.join(10)
    assert (rig.stats("eval").completed, rig.stats("eval").duration, rig.stats("eval").active) == (1, 20.0, 1)
    assert rig.phases.out_of_step  # B still evaluates: the step peak stays held
    rig.clock.now = 35.0
    b_go.set()
    tb.join(10)
    assert not errors
    assert (rig.stats("eval").completed, rig.stats("eval").duration, rig.stats("eval").active) == (2, 25.0, 0)
    assert not rig.phases.out_of_step


def test_decorator_also_recursive(rig: Rig) -> None:
    depths: list[int] = []

    @memexporter.phase("eval")
    def evaluate(depth: int) -> int:
        depths.append(rig.stats("eval").active)
        return evaluate(depth - 1) + 1 if depth else 0

    assert evaluate.__name__ == "evaluate"
    assert evaluate(3) == 3
    assert depths == [1, 2, 3, 4]
    assert (rig.stats("eval").completed, rig.stats("eval").active) == (4, 0)
    assert not rig.phases.out_of_step
    evaluate(0)
    assert rig.stats("eval").completed == 5


def test_a_phase_that_raises_is_closed(rig: Rig) -> None:
    @memexporter.phase("eval")
    def evaluate() -> None:
        raise RuntimeError("synthetic")

    with pytest.raises(RuntimeError, match="synthetic"):
        evaluate()
    assert (rig.stats("eval").completed, rig.stats("eval").active) == (1, 0)
    assert not rig.phases.out_of_step


def test_no_op_while_no_exporter_runs_and_after_stop(no_exporter: None) -> None:
    with memexporter.phase("eval") as p:  # nothing runs: nothing to record, nothing raised
        assert isinstance(p, memexporter.Phase)
    exp = memexporter.start(port=0, addr="127.0.0.1")
    tracker = exp.sources.phases
    assert tracker is not None
    evaluation = memexporter.phase("eval")
    with evaluation:
        pass
    assert tracker.snapshot()[0]["eval"].completed == 1
    evaluation.__enter__()  # open while running, closed after stop(): no error, nothing left open
    memexporter.stop()
    evaluation.__exit__(None, None, None)
    with memexporter.phase("eval"), memexporter.phase("checkpoint"):
        pass
    stats, _ = tracker.snapshot()
    assert set(stats) == {"eval"}
    assert (stats["eval"].completed, stats["eval"].active) == (2, 0)
    assert phases.active() is None


@pytest.mark.parametrize("bad", [None, 3, b"eval", ["eval"]])
def test_a_name_that_is_not_a_str_raises_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match="str"):
        memexporter.phase(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", "   ", "\t\n"])
def test_an_empty_name_raises_value_error(bad: str) -> None:
    with pytest.raises(ValueError, match="empty"):
        memexporter.phase(bad)


def test_names_beyond_the_first_sixteen_count_as_other(rig: Rig) -> None:
    names = [f"p{i}" for i in range(MAX_PHASES)]
    for name in names:
        with memexporter.phase(name):
            pass
    for name in ("p16", "p17", "p3"):
        with memexporter.phase(name):
            pass
    stats, _ = rig.phases.snapshot()
    assert set(stats) == {*names, OTHER}
    assert stats[OTHER].completed == 2
    assert stats["p3"].completed == 2  # a known name keeps its own series
    reg = rig.registry()
    assert reg.get_sample_value("memexporter_phase_completed_total", {"rank": "3", "phase": OTHER}) == 2
    assert reg.get_sample_value("memexporter_phase_completed_total", {"rank": "3", "phase": "p16"}) is None


def test_duration_active_and_last_change(rig: Rig) -> None:
    reg = rig.registry()
    assert rig.phases.last_change is None
    assert reg.get_sample_value("memexporter_phase_last_change_timestamp_seconds", {"rank": "3"}) is None
    rig.clock.now, rig.wall.now = 100.0, 1.8e9 + 100
    with memexporter.phase("eval"):
        assert rig.phases.last_change == 1.8e9 + 100
        assert reg.get_sample_value("memexporter_phase_active", {"rank": "3", "phase": "eval"}) == 1
        assert reg.get_sample_value("memexporter_phase_completed_total", {"rank": "3", "phase": "eval"}) == 0
        # Not completed yet: no peak and no duration.
        assert reg.get_sample_value("memexporter_phase_duration_seconds", {"rank": "3", "phase": "eval"}) is None
        rig.clock.now, rig.wall.now = 103.5, 1.8e9 + 103.5
    assert rig.phases.last_change == 1.8e9 + 103.5
    assert rig.stats("eval").duration == 3.5
    assert reg.get_sample_value("memexporter_phase_active", {"rank": "3", "phase": "eval"}) == 0
    assert reg.get_sample_value("memexporter_phase_duration_seconds", {"rank": "3", "phase": "eval"}) == 3.5
    assert reg.get_sample_value("memexporter_phase_completed_total", {"rank": "3", "phase": "eval"}) == 1
    assert reg.get_sample_value("memexporter_phase_last_change_timestamp_seconds", {"rank": "3"}) == 1.8e9 + 103.5


# --- 4. Automatic phases of a real tracked model ---------------------------------------------------


@pytest.fixture
def trained(no_exporter: None) -> tuple[PhaseTracker, nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    exp = memexporter.start(port=0, addr="127.0.0.1", model=model, optimizer=opt)
    assert exp.sources.phases is not None and exp.sources.steps is not None
    # Every step detailed, so that each one measures its automatic phases: the exporter's own pace
    # (one step in eight, at most once a second) is tested below.
    exp.sources.steps.detail = Detail()
    return exp.sources.phases, model, opt  # no_exporter stops it


def _train(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()


def _counts(tracker: PhaseTracker) -> dict[str, tuple[int, int]]:
    """{phase: (completed, active)} of the automatic phases."""
    stats, _ = tracker.snapshot()
    return {n: (stats[n].completed, stats[n].active) if n in stats else (0, 0) for n in phases.AUTOMATIC_PHASES}


def _delta(tracker: PhaseTracker, base: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """Completed since ``base``, and open now."""
    return {n: (c - base[n][0], a) for n, (c, a) in _counts(tracker).items()}


def test_each_training_step_completes_forward_backward_optimizer_once(
    trained: tuple[PhaseTracker, nn.Module, torch.optim.Optimizer],
) -> None:
    tracker, model, opt = trained
    _train(model, opt)  # the first step after start() (see the test of the very first forward below)
    base = _counts(tracker)
    for i in range(1, 4):
        loss = model(torch.randn(4, 8)).sum()
        assert _delta(tracker, base)["forward"] == (i, 0)
        assert _delta(tracker, base)["backward"] == (i - 1, 1)  # open: the loss and the backward pass
        loss.backward()
        assert _delta(tracker, base)["backward"] == (i - 1, 1)
        opt.step()
        opt.zero_grad()
        assert _delta(tracker, base) == {"forward": (i, 0), "backward": (i, 0), "optimizer": (i, 0)}
    stats, _ = tracker.snapshot()
    assert all(stats[n].peaks["cpu"] > 0 for n in phases.AUTOMATIC_PHASES)


def test_the_first_forward_after_start_is_counted(
    trained: tuple[PhaseTracker, nn.Module, torch.optim.Optimizer],
) -> None:
    tracker, model, opt = trained
    _train(model, opt)
    assert _counts(tracker) == {"forward": (1, 0), "backward": (1, 0), "optimizer": (1, 0)}


def test_gradient_accumulation_counts_each_forward_and_backward(
    trained: tuple[PhaseTracker, nn.Module, torch.optim.Optimizer],
) -> None:
    tracker, model, opt = trained
    _train(model, opt)
    base = _counts(tracker)
    for _ in range(3):
        for _ in range(2):  # two micro-batches per optimizer step
            model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    assert _delta(tracker, base) == {"forward": (6, 0), "backward": (6, 0), "optimizer": (3, 0)}


def test_forwards_inside_an_evaluation_are_the_evaluations(
    trained: tuple[PhaseTracker, nn.Module, torch.optim.Optimizer],
) -> None:
    tracker, model, opt = trained
    _train(model, opt)
    base = _counts(tracker)
    with memexporter.phase("eval"), torch.no_grad():
        for _ in range(3):
            model(torch.randn(4, 8))
    with memexporter.phase("validation"):  # grad-enabled evaluation forwards: not a training forward either
        model(torch.randn(4, 8))
    assert _delta(tracker, base) == {"forward": (0, 0), "backward": (0, 0), "optimizer": (0, 0)}
    stats, _ = tracker.snapshot()
    assert stats["eval"].completed == stats["validation"].completed == 1
    _train(model, opt)  # training after the evaluation counts again
    assert _delta(tracker, base) == {"forward": (1, 0), "backward": (1, 0), "optimizer": (1, 0)}


def test_a_no_grad_forward_outside_any_phase_opens_no_backward(
    trained: tuple[PhaseTracker, nn.Module, torch.optim.Optimizer],
) -> None:
    tracker, model, opt = trained
    _train(model, opt)
    base = _counts(tracker)
    with torch.no_grad():
        model(torch.randn(4, 8))
    assert _delta(tracker, base) == {"forward": (1, 0), "backward": (0, 0), "optimizer": (0, 0)}
    _train(model, opt)
    assert _delta(tracker, base) == {"forward": (2, 0), "backward": (1, 0), "optimizer": (1, 0)}


# --- 5. step(count=), the last step's time and the step rhythm -------------------------------------


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
