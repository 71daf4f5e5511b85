"""``memexporter.on_oom_risk`` (tracking/risk.py): the judgement on SYNTHETIC traces (a scripted host
under a 1 GiB soft budget, fake clocks), and the episode logic of ``RiskWatch``: callbacks once per
episode, at a step boundary, on the thread that marks it; failures logged and counted."""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator

import pytest

import memexporter
from memexporter.collectors.scrape import Sources
from memexporter.oom import risk
from memexporter.oom.risk import OomRisk, RiskWatch, Thresholds, judge
from memexporter.tracking import errors
from memexporter.tracking.phases import MAX_PHASES
from tests.support.fakes import GiB, MiB, sources
from tests.unit.tracking.test_phases import Host, Rig, make_rig

LIMIT = 1024 * MiB


def _sources(rig: Rig, limit: int = LIMIT) -> Sources:
    return dataclasses.replace(
        sources(rig.cuda, host=rig.host, steps=rig.steps, memory_limit_bytes=limit), phases=rig.phases
    )


def _steps(rig: Rig, n: int, base: int, excursion: int, leak: int = 0, dt: float = 1.0) -> None:
    """``n`` steps from ``base`` MiB (growing by ``leak`` MiB a step), each ``excursion`` MiB above
    its start at its top (sampled there), ``dt`` seconds apart."""
    for _ in range(n):
        rig.host.set((base + excursion) * MiB)
        rig.steps.sample()
        rig.host.set(base * MiB)
        rig.step(dt)
        base += leak


def _judge(rig: Rig) -> OomRisk | None:
    return judge(_sources(rig), Thresholds())


# --- 7. judge() ------------------------------------------------------------------------------------


def test_a_healthy_run_is_no_risk() -> None:
    rig = make_rig()
    _steps(rig, 40, base=400, excursion=100)  # peaks at half the limit, flat
    assert _judge(rig) is None


def test_a_step_peak_above_97_percent_is_headroom() -> None:
    rig = make_rig()
    _steps(rig, 20, base=900, excursion=100)  # 1000 MiB of 1024: 97.7%
    r = _judge(rig)
    assert r is not None
    assert (r.reason, r.phase, r.device) == ("headroom", "step", "cpu")
    assert (r.peak_bytes, r.limit_bytes, r.used_bytes, r.step) == (1000 * MiB, LIMIT, 900 * MiB, 20)
    assert math.isinf(r.eta_seconds)  # flat: not a forecast, the headroom is gone now


def test_above_80_percent_without_growth_is_no_risk() -> None:
    rig = make_rig()
    _steps(rig, 40, base=890, excursion=100)  # 990 MiB: 96.7%, just under the headroom line, flat
    assert _judge(rig) is None


def test_a_steady_leak_above_80_percent_with_a_short_eta_is_a_forecast() -> None:
    rig = make_rig()
    _steps(rig, 60, base=800, excursion=20, leak=1)  # 1 MiB a step, a step a second
    r = _judge(rig)
    assert r is not None
    assert (r.reason, r.phase, r.device, r.step) == ("forecast", "step", "cpu", 60)
    # The last step peaked at 800 + 59 + 20 MiB; 1 MiB/s leaves (1024 - 879) s.
    assert r.peak_bytes == 879 * MiB
    assert r.eta_seconds == pytest.approx(1024 - 879)
    assert r.eta_seconds < Thresholds().horizon_s


def test_a_leak_whose_eta_is_beyond_the_horizon_is_no_risk() -> None:
    rig = make_rig()
    _steps(rig, 60, base=800, excursion=20, leak=1, dt=100.0)  # 1 MiB per 100 s: ETA ~4 h
    assert _judge(rig) is None


def test_a_fast_leak_below_80_percent_is_no_risk() -> None:
    rig = make_rig()
    _steps(rig, 60, base=300, excursion=20, leak=1)  # ETA ~11 min, but 37% full
    assert _judge(rig) is None


def test_a_leak_whose_eta_is_under_a_minute_is_a_forecast_at_any_level() -> None:
    rig = make_rig()
    _steps(rig, 60, base=100, excursion=20, leak=10, dt=1.0)  # 10 MiB/s: 720 MiB at 70 %, the OOM 30 s away
    r = _judge(rig)
    assert r is not None and (r.reason, r.phase) == ("forecast", "step")
    assert r.peak_bytes / r.limit_bytes < 0.8 and r.eta_seconds < risk.ETA_ALONE_S


def test_an_evaluation_above_97_percent_is_headroom_while_the_steps_are_low() -> None:
    rig = make_rig()
    _steps(rig, 20, base=400, excursion=100)
    token = rig.phases.enter("eval")
    rig.host.set(1010 * MiB)  # 98.6% of the limit
    rig.host.set(400 * MiB)
    assert token is not None
    rig.phases.exit(token)
    _steps(rig, 5, base=400, excursion=100)
    assert rig.steps.snapshot().devices["cpu"].last_peak == 500 * MiB  # kept out of the step peak
    r = _judge(rig)
    assert r is not None
    assert (r.reason, r.phase, r.peak_bytes) == ("headroom", "eval", 1010 * MiB)


def test_the_same_memory_in_a_step_phase_is_the_steps() -> None:
    rig = make_rig()
    _steps(rig, 20, base=400, excursion=100)
    token = rig.phases.enter("data")
    rig.host.set(1010 * MiB)
    rig.host.set(400 * MiB)
    assert token is not None
    rig.phases.exit(token)
    _steps(rig, 1, base=400, excursion=100)
    r = _judge(rig)
    assert r is not None
    assert (r.reason, r.phase, r.peak_bytes) == ("headroom", "step", 1010 * MiB)


def test_no_limit_no_risk() -> None:
    rig = make_rig()
    _steps(rig, 20, base=900, excursion=100)
    # No budget: the cpu limit is RSS + available (8 GiB in this host's sample), far away.
    assert (
        judge(dataclasses.replace(sources(rig.cuda, host=rig.host, steps=rig.steps), phases=rig.phases), Thresholds())
        is None
    )


# --- 8. RiskWatch: episodes, the boundary's thread, failures, handles ------------------------------


class Judgements:
    """Wraps ``risk.judge`` (which the watch thread calls) to see each judgement's result."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.results: list[OomRisk | None] = []
        self._cond = threading.Condition()
        real = risk.judge

        def counting(src: Sources, thresholds: Thresholds, *findings: Callable[[], object]) -> OomRisk | None:
            result = real(src, thresholds, *findings)  # type: ignore[arg-type]
            with self._cond:
                self.results.append(result)
                self._cond.notify_all()
            return result

        monkeypatch.setattr(risk, "judge", counting)

    def settle(self, want: Callable[[OomRisk | None], bool], timeout: float = 10.0) -> OomRisk | None:
        """Wait for a judgement from now on that ``want``s its result, and for the next one to
        start (so the watch has acted on it); that result."""
        with self._cond:
            start = len(self.results)
            ok = self._cond.wait_for(lambda: any(want(r) for r in self.results[start:]), timeout)
            assert ok, f"no wanted judgement in {timeout} s: {self.results[start:]}"
            i = next(i for i in range(start, len(self.results)) if want(self.results[i]))
            assert self._cond.wait_for(lambda: len(self.results) > i + 1, timeout)
            return self.results[i]


@pytest.fixture
def watch_env(monkeypatch: pytest.MonkeyPatch, no_exporter: None) -> Judgements:
    """No exporter, no callbacks of other tests, judgements every 2 ms."""
    monkeypatch.setattr(risk, "_registered", ())
    monkeypatch.setattr(risk, "CHECK_INTERVAL_S", 0.002)
    return Judgements(monkeypatch)


@pytest.fixture
def watched(watch_env: Judgements) -> Iterator[tuple[Rig, RiskWatch, Judgements]]:
    # A lifetime mark far above everything: step peaks are the samples, so a risk can clear (with a
    # rising mark, later steps' peaks are estimated from the last exact excursion).
    rig = make_rig(Host(hwm=2 * GiB))
    _steps(rig, 10, base=400, excursion=100)  # healthy
    watch = RiskWatch(_sources(rig), callbacks=risk.registered)
    yield rig, watch, watch_env
    watch.stop()


def test_callbacks_run_once_per_episode_at_a_boundary_on_the_boundarys_thread(
    watched: tuple[Rig, RiskWatch, Judgements], caplog: pytest.LogCaptureFixture
) -> None:
    rig, _, judged = watched
    calls: list[tuple[str, OomRisk, int]] = []

    def first(r: OomRisk) -> None:
        calls.append(("first", r, threading.get_ident()))

    def broken(r: OomRisk) -> None:
        raise RuntimeError("synthetic callback failure")

    def last(r: OomRisk) -> None:
        calls.append(("last", r, threading.get_ident()))

    h_first = memexporter.on_oom_risk(first)
    memexporter.on_oom_risk(broken)
    memexporter.on_oom_risk(last)
    assert judged.settle(lambda r: r is None) is None
    _steps(rig, 3, base=400, excursion=100)
    assert calls == []

    _steps(rig, 2, base=900, excursion=100)  # 1000 MiB of 1024: headroom
    r = judged.settle(lambda r: r is not None)
    assert r is not None and r.reason == "headroom"
    assert calls == []  # judged, but no boundary yet: nothing runs off the training thread
    errors_before = errors.hook_errors()
    with caplog.at_level(logging.ERROR, logger="memexporter"):
        _steps(rig, 1, base=900, excursion=100)
    me = threading.get_ident()
    assert [(name, tid) for name, _, tid in calls] == [("first", me), ("last", me)]  # the broken one in between
    assert calls[0][1].reason == "headroom" and calls[0][1].device == "cpu"
    assert errors.hook_errors() == errors_before + 1
    assert any("on_oom_risk callback" in rec.getMessage() and rec.exc_info for rec in caplog.records)

    for _ in range(3):  # the same episode: no more calls, however many judgements and boundaries
        judged.settle(lambda r: r is not None)
        _steps(rig, 2, base=900, excursion=100)
    assert len(calls) == 2

    _steps(rig, 9, base=400, excursion=100)  # the last 8 step peaks are healthy again: the episode ends
    judged.settle(lambda r: r is None)
    _steps(rig, 2, base=400, excursion=100)
    assert len(calls) == 2

    h_first.remove()
    _steps(rig, 2, base=900, excursion=100)  # a new episode
    judged.settle(lambda r: r is not None)
    _steps(rig, 1, base=900, excursion=100)
    assert [name for name, _, _ in calls] == ["first", "last", "last"]
    assert errors.hook_errors() == errors_before + 2  # the broken one failed again, counted again


def test_callbacks_run_on_the_training_thread_not_the_judges(watched: tuple[Rig, RiskWatch, Judgements]) -> None:
    rig, _, judged = watched
    threads: list[int] = []
    memexporter.on_oom_risk(lambda r: threads.append(threading.get_ident()))
    _steps(rig, 2, base=900, excursion=100)
    judged.settle(lambda r: r is not None)
    trainer = threading.Thread(target=_steps, args=(rig, 1, 900, 100), name="trainer")
    trainer.start()
    trainer.join(10)
    assert threads == [trainer.ident]
    assert trainer.ident != threading.get_ident()


def test_a_removed_handle_is_never_called(watched: tuple[Rig, RiskWatch, Judgements]) -> None:
    rig, _, judged = watched
    calls: list[OomRisk] = []
    with memexporter.on_oom_risk(calls.append):
        pass  # removed on leaving the block
    kept: list[OomRisk] = []
    handle = memexporter.on_oom_risk(kept.append)
    _steps(rig, 2, base=900, excursion=100)
    judged.settle(lambda r: r is not None)
    _steps(rig, 1, base=900, excursion=100)
    assert calls == [] and len(kept) == 1
    handle.remove()
    handle.remove()  # twice: harmless
    assert risk.registered() == ()


def test_a_non_callable_is_refused(watch_env: Judgements) -> None:
    with pytest.raises(TypeError, match="callable"):
        memexporter.on_oom_risk("save_checkpoint")  # type: ignore[arg-type]


def _until_called(calls: list[OomRisk], judged: Judgements) -> None:
    """Real step boundaries of the running exporter until a callback ran (a judgement at risk first)."""
    memexporter.step()  # a first boundary: the window has its first point
    judged.settle(lambda r: r is not None)
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:
        memexporter.step()


def test_registered_before_start_works_on_a_real_exporter(watch_env: Judgements) -> None:
    calls: list[OomRisk] = []
    threads: list[int] = []

    def save(r: OomRisk) -> None:
        calls.append(r)
        threads.append(threading.get_ident())

    handle = memexporter.on_oom_risk(save)
    exp = memexporter.start(port=0, addr="127.0.0.1", memory_limit_bytes=1 * MiB)  # this process's RSS is far above
    assert exp.risk is not None
    _until_called(calls, watch_env)
    assert len(calls) == 1
    assert threads == [threading.get_ident()]
    assert (calls[0].reason, calls[0].device, calls[0].phase, calls[0].limit_bytes) == (
        "headroom",
        "cpu",
        "step",
        1 * MiB,
    )
    for _ in range(5):  # the same episode
        memexporter.step()
    assert len(calls) == 1
    handle.remove()
    memexporter.stop()
    assert exp.risk is None


def test_registered_after_start_works_on_a_real_exporter(watch_env: Judgements) -> None:
    exp = memexporter.start(port=0, addr="127.0.0.1", memory_limit_bytes=1 * MiB)
    assert exp.risk is None  # nothing to call: nothing judges
    calls: list[OomRisk] = []
    with memexporter.on_oom_risk(calls.append):
        assert exp.risk is not None
        _until_called(calls, watch_env)
    assert len(calls) == 1 and calls[0].reason == "headroom"


def test_an_evaluation_after_many_phase_names_is_still_judged() -> None:
    rig = make_rig()
    _steps(rig, 20, base=400, excursion=100)
    for i in range(MAX_PHASES):  # e.g. a phase per data shard, named by the shard
        token = rig.phases.enter(f"shard-{i}")
        assert token is not None
        rig.phases.exit(token)
    token = rig.phases.enter("eval")
    rig.host.set(1010 * MiB)  # 98.6% of the limit
    rig.host.set(400 * MiB)
    assert token is not None
    rig.phases.exit(token)
    _steps(rig, 5, base=400, excursion=100)
    assert rig.steps.snapshot().devices["cpu"].last_peak == 500 * MiB  # held out of the step peak, as it should
    r = _judge(rig)
    assert r is not None and r.reason == "headroom"
