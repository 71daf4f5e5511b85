"""The forecast against real OOMs: the H200's per-step traces replayed through the real exporter parts.

Each trace (tests/fixtures/recorded/traces/, recorded on an NVIDIA H200 with torch 2.11) ends in a
real ``OutOfMemoryError`` under a 6 GiB memory fraction. ``tests/support/replay.py`` plays it back
at its own timestamps through ``backends/cuda.py`` (answering from the recorded answers), the step
tracker, the collectors and ``RiskWatch``. On the GPU, before the forecast followed the committed
bytes, the native allocator's job died at 79 % "used", the ETA was 40-220 % off and ``on_oom_risk``
fired 0.08 s ahead or never; a 32 MiB/step leak never had a finite ETA.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

import pytest

from tests.support.replay import Replay, Trace, load_trace, replay

EIGHT_MIB = ["trace-native-8mib", "trace-expandable-8mib", "trace-async-8mib"]
# The four replays are a module fixture (~8 CPU-s): one worker replays them once.
pytestmark = [pytest.mark.slow(seconds=40), pytest.mark.xdist_group("trend_replay")]


def every_other_step_dropped(trace: Trace) -> Trace:
    """The native 8 MiB trace with every other step dropped, at the same 30 steps/s: 16 MiB a step (issue 41)."""
    rows = [{**r, "t": trace.rows[i]["t"], "step": trace.rows[i]["step"]} for i, r in enumerate(trace.rows[::2])]
    return dataclasses.replace(trace, name="trace-native-16mib-dropped", rows=rows, leak_mib=2 * trace.leak_mib)


@pytest.fixture(scope="module")
def replays() -> dict[str, Replay]:
    out = {}
    traces = [load_trace(name) for name in [*EIGHT_MIB, "trace-native-32mib"]]
    for trace in [*traces, every_other_step_dropped(traces[0])]:
        with pytest.MonkeyPatch.context() as mp:
            out[trace.name] = replay(trace, mp)
    return out


@pytest.mark.parametrize("name", EIGHT_MIB)
def test_the_eta_tracks_the_true_time_left(replays: dict[str, Replay], name: str) -> None:
    r = replays[name]
    errors = r.eta_errors(until_before=2.0)
    assert len(errors) >= 20, f"{name}: {len(errors)} scrapes with a finite ETA before the last 2 s"
    assert statistics.median(errors) <= 0.15, f"{name}: median ETA error {statistics.median(errors):.1%}"
    assert max(errors) <= 0.35, f"{name}: worst ETA error {max(errors):.1%}"


@pytest.mark.parametrize("name", EIGHT_MIB)
def test_on_oom_risk_runs_at_least_2_s_before_the_oom(replays: dict[str, Replay], name: str) -> None:
    r = replays[name]
    assert r.lead is not None and r.lead >= 2.0, f"{name}: on_oom_risk ran {r.lead} s ahead"
    risk = r.fired[0][1]
    assert risk.device == "cuda:0" and risk.reason == "forecast" and math.isfinite(risk.eta_seconds)


@pytest.mark.parametrize("name", EIGHT_MIB)
def test_the_oom_view_reads_full_at_the_last_step(replays: dict[str, Replay], name: str) -> None:
    last = replays[name].moments[-1]
    assert last.limit == replays[name].trace.limit
    assert last.fullness >= 0.97, f"{name}: {last.fullness:.1%} full at the last step"


def test_native_allocator_died_with_a_fifth_of_its_limit_stranded(replays: dict[str, Replay]) -> None:
    # What the view says the limit is met by, against what is allocated: the 8 MiB tensors in 20 MiB
    # segments. Allocated keeps its meaning (memory_used_bytes), and the leak is the true 8 MiB/step.
    last = replays["trace-native-8mib"].moments[-1]
    assert last.used / last.limit == pytest.approx(0.80, abs=0.01)
    assert last.committed - last.used == pytest.approx(1_257_168_896, rel=0.01)
    assert last.leak_per_step == pytest.approx(8 << 20, rel=0.1)


def test_a_fast_32_mib_leak_gets_a_finite_eta_a_second_ahead(replays: dict[str, Replay]) -> None:
    r = replays["trace-native-32mib"]
    first = r.first_finite_eta
    assert first is not None and r.left(first) >= 1.0, "no finite ETA a second before the OOM at 6.4 s"
    assert r.trace.oom_at < 7.0  # the job died 6.4 s in: what fails without the step-counted warm-up


@pytest.mark.parametrize("name", ["trace-async-8mib"])
def test_cuda_malloc_async_compares_allocated_not_its_pool(replays: dict[str, Replay], name: str) -> None:
    # The driver's pool reached 136 % of the fraction with no OOM: reserved is no fill level there.
    r = replays[name]
    trace_reserved = r.trace.rows[-1]["reserved_bytes.all.current"]
    assert trace_reserved > 1.3 * r.trace.limit
    assert r.moments[-1].committed == r.moments[-1].used


def test_stranded_memory_is_named_with_its_remedy_long_before_the_oom(replays: dict[str, Replay]) -> None:
    # The native 8 MiB job: 20 % of its limit stranded by the OOM, growing all along; said ~10 s ahead.
    r = replays["trace-native-8mib"]
    said = next(m for m in r.moments if m.recoverable > 0)
    assert r.left(said) >= 5.0
    last = r.moments[-1]
    assert last.recoverable == pytest.approx(last.committed - last.used)
    assert 0.15 < last.recoverable / last.limit < 0.25
    # 32 MiB tensors fill their segments (0.5 % stranded): nothing to recover, the series reads 0.
    assert max(m.recoverable for m in replays["trace-native-32mib"].moments) == 0.0
    # Expandable segments and cudaMallocAsync: the remedy does not apply, no series at all.
    for name in ("trace-expandable-8mib", "trace-async-8mib"):
        assert all(math.isnan(m.recoverable) for m in replays[name].moments)


def test_a_fast_leak_fires_on_its_eta_alone_at_least_4_s_before_the_oom(replays: dict[str, Replay]) -> None:
    # 16 MiB a step at 30 steps/s: the ETA is finite and right ~8 s ahead, while the committed peak stays
    # under 80 % of the limit until ~1.5 s before the OOM. The ETA alone (under ETA_ALONE_S) fires.
    r = replays["trace-native-16mib-dropped"]
    first = r.first_finite_eta
    assert first is not None and r.left(first) >= 6.0
    assert r.lead is not None and r.lead >= 4.0, f"on_oom_risk ran {r.lead} s ahead"
    risk = r.fired[0][1]
    assert risk.reason == "forecast" and risk.peak_bytes / risk.limit_bytes < 0.5  # the level gate was shut
    assert risk.eta_seconds == pytest.approx(r.trace.oom_at - r.fired[0][0], rel=0.15)
