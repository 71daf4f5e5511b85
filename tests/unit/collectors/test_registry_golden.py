"""The whole exposition over SYNTHETIC fake backends, against a golden file (the real ``promtool check
metrics`` reads that file in tests/integration/test_exposition_promtool.py). Regenerate with
MEMEXPORTER_UPDATE_GOLDEN=1 after a deliberate change."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from memexporter.collectors.registry import GuardedCatalogue, catalogue
from memexporter.serving.conn import ConnectionStats
from memexporter.tracking.phases import PhaseTracker
from memexporter.tracking.steps import StepTracker
from tests.support import REPO_ROOT
from tests.support.fakes import MiB, one_gpu, sources, with_host

GOLDEN = REPO_ROOT / "tests" / "golden"


@pytest.fixture(autouse=True)
def _no_hook_errors_from_other_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    # The module-hook error counter is process-wide; tests that inject failures raise it.
    monkeypatch.setattr("memexporter.tracking.modules.hook_errors", lambda: 0)


def _registry() -> CollectorRegistry:
    cuda, nvml = one_gpu()
    host = with_host()
    clock = iter(float(t) for t in range(10**6))
    wall = iter(1.8e9 + t for t in range(10**6))
    tracker = StepTracker(
        cuda, host, window=64, warmup_steps=0, clock=lambda: next(clock), host_peak=lambda: 0, wall=lambda: next(wall)
    )
    phase_tracker = PhaseTracker(tracker, clock=lambda: next(clock), wall=lambda: next(wall))
    for i in range(40):  # a synthetic 1 MiB/step leak on cuda:0, flat host
        cuda.stats[0] = {**cuda.stats[0], "allocated_bytes.all.current": 3 * 1024 * MiB + i * MiB}
        tracker.step()
        if i % 20 == 19:  # an evaluation holding 512 MiB more, twice
            evaluation = phase_tracker.enter("eval")
            cuda.stats[0] = {**cuda.stats[0], "allocated_bytes.all.current": 3 * 1024 * MiB + (i + 512) * MiB}
            tracker.sample()
            cuda.stats[0] = {**cuda.stats[0], "allocated_bytes.all.current": 3 * 1024 * MiB + i * MiB}
            assert evaluation is not None
            phase_tracker.exit(evaluation)
    http = ConnectionStats()
    for reason in ("timeout", "timeout", "reset"):  # two clients cut at the deadline, one port scan
        http.count(reason)
    reg = CollectorRegistry(auto_describe=False)
    # A frozen clock makes collector_duration_seconds 0, so the file is stable.
    src = dataclasses.replace(sources(cuda, nvml, host, steps=tracker), http=http, phases=phase_tracker)
    reg.register(GuardedCatalogue(catalogue(), src, clock=lambda: 0.0))
    return reg


def _check(name: str, text: str) -> Path:
    path = GOLDEN / name
    if os.environ.get("MEMEXPORTER_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), (
        f"exposition changed; if deliberate, rerun with MEMEXPORTER_UPDATE_GOLDEN=1 ({path})"
    )
    return path


def test_text_exposition_matches_golden() -> None:
    _check("exposition.txt", generate_latest(_registry()).decode())


def test_openmetrics_exposition_matches_golden() -> None:
    text = generate_openmetrics(_registry()).decode()
    _check("exposition.openmetrics.txt", text)
    assert text.endswith("# EOF\n")
