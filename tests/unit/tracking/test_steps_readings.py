"""One allocator reading per training step in steady state (issue 35 item 4; ``steps.Detail``).

On an H200 every optimizer step read the allocator at least twice (the sample before it, the boundary
after), and a tracked model's phases read more; on CUDA each reading builds torch's ~150-key dict, and
a launch-bound loop pays for it while it holds the GIL. A stand-in allocator counts the readings of a
real tracked model training under a started exporter (real CPU model, real optimizer hooks).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
import torch
from torch import nn

import memexporter
from memexporter.backends import select
from memexporter.backends.base import Reading
from memexporter.tracking.steps import DETAIL_EVERY, DETAIL_INTERVAL_S, Detail, StepTracker
from tests.support.fakes import SYNTHETIC_STATS, FakeCuda, FakeHost, FakeNvml, MiB

pytestmark = pytest.mark.usefixtures("no_exporter")


@dataclass
class CountingCuda(FakeCuda):
    """``FakeCuda`` that counts the step tracker's readings (``reading()``: one stats dict each)."""

    readings: int = 0

    def reading(self, index: int) -> Reading:
        self.readings += 1
        return super().reading(index)


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
        opt.zero_grad()


def test_a_tracked_model_reads_the_allocator_once_a_step(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = CountingCuda(stats={0: dict(SYNTHETIC_STATS)})
    monkeypatch.setattr(select, "backends", lambda kind=None: (cuda, FakeNvml()))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    exp = memexporter.start(http=False, model=model, optimizer=opt)
    train(model, opt, 3)
    # The first step is detailed: forward end, before the optimizer step, the boundary.
    assert cuda.readings >= 3
    start, t0 = cuda.readings, time.monotonic()
    train(model, opt, 200)
    elapsed = time.monotonic() - t0
    # Steady state: the boundary only, plus two on a detailed step (one in 8, at most once a second).
    detailed = min(200 // DETAIL_EVERY + 1, int(elapsed / DETAIL_INTERVAL_S) + 1)
    assert 200 <= cuda.readings - start <= 200 + 2 * detailed, (cuda.readings - start, elapsed)
    tracker = exp.sources.steps
    assert tracker is not None and tracker.steps == 203 and tracker.errors == 0
    # The automatic phases still have figures, from their detailed steps.
    stats, _ = exp.sources.phases.snapshot()  # type: ignore[union-attr]
    assert stats["forward"].completed >= 1 and stats["optimizer"].peaks["cuda:0"] > 0


def test_every_step_reads_more_without_the_pace() -> None:
    # Detail() (every step, what a direct user of StepTracker gets) reads at every sample: the pace
    # above is what keeps the count down, not a sample that reads nothing.
    cuda = CountingCuda(stats={0: dict(SYNTHETIC_STATS)})
    paced = StepTracker(cuda, FakeHost(), 64, 0, host_peak=lambda: 0, detail=Detail(DETAIL_EVERY, 3600.0))
    for _ in range(10):
        paced.sample()
        paced.step()
    # Ten boundaries, and one sample: of the step after the first boundary (the first that knows
    # the device), which is detailed.
    assert cuda.readings == 10 + 1
    cuda.readings = 0
    every = StepTracker(cuda, FakeHost(), 64, 0, host_peak=lambda: 0)
    for _ in range(10):
        every.sample()
        every.step()
    assert cuda.readings == 10 + 9  # the first sample came before the first boundary found the device


def test_the_step_peak_stays_exact_where_the_high_water_mark_rose() -> None:
    # Undetailed steps take no sample inside the step; a leak raises the lifetime high-water mark at
    # every step, and the step peak is that mark, to the byte.
    stats = dict(SYNTHETIC_STATS)
    cuda = CountingCuda(stats={0: stats})
    tracker = StepTracker(cuda, FakeHost(), 64, 0, host_peak=lambda: 0, detail=Detail(DETAIL_EVERY, 3600.0))
    for step in range(1, 20):
        stats["allocated_bytes.all.current"] = 3 * 1024 * MiB + step * 8 * MiB
        stats["allocated_bytes.all.peak"] = 5 * 1024 * MiB + step * 8 * MiB
        tracker.sample()  # what a hook would do: nothing on an undetailed step
        tracker.step()
        if step > 1:  # the first boundary has no mark before it to compare with
            assert tracker.latest()["cuda:0"] == (
                stats["allocated_bytes.all.current"],
                stats["allocated_bytes.all.peak"],
            )
    assert cuda.readings == 19 + 1  # the boundaries, and the sample of the one detailed step


def test_an_evaluation_between_detailed_steps_sees_what_its_batches_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    # A Lightning validation on an undetailed step read only its two boundaries, where its buffer is
    # not yet or no longer held: its peak was the training step's (CI, torch 2.11, the callback test).
    stats = dict(SYNTHETIC_STATS)
    cuda = CountingCuda(stats={0: stats})
    monkeypatch.setattr(select, "backends", lambda kind=None: (cuda, FakeNvml()))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    exp = memexporter.start(http=False, model=model, optimizer=opt)
    train(model, opt, 3)  # the first step is detailed; the next ones, within a second, are not
    phases = exp.sources.phases
    assert phases is not None and not phases.detailed
    base, before = stats["allocated_bytes.all.current"], cuda.readings
    with memexporter.phase("eval"), torch.no_grad():
        for batch in range(4):
            if batch == 0:
                stats["allocated_bytes.all.current"] = base + 64 * MiB
            model(torch.randn(2, 8))
        stats["allocated_bytes.all.current"] = base
    stats_by_name, _ = phases.snapshot()
    assert stats_by_name["eval"].peaks["cuda:0"] == base + 64 * MiB
    # Paced: its two boundaries and one reading inside (the first forward's end), not one a batch.
    assert cuda.readings - before == 3
