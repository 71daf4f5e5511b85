"""Phases (tracking/phases.py, ``memexporter.phase``): nested out-of-step phases, one phase object on
two threads, the decorator (also recursive), a phase that raises, the no-op without an exporter, the
names (checked, and past the sixteenth counted as ``other``), duration, active and last change. The
peak arithmetic and the rig these tests run on: test_phases.py (made active by conftest.py's ``rig``).

Memory traces are SYNTHETIC (a scripted host whose RSS and high-water mark the test sets)."""

from __future__ import annotations

import threading

import pytest

import memexporter
from memexporter.tracking import boundaries, phases
from memexporter.tracking.phases import MAX_PHASES, OTHER
from tests.support.fakes import GiB, MiB
from tests.unit.tracking.test_phases import Rig, _train_steps


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
