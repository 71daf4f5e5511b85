"""The automatic phases (tracking/phases.py): forward, backward and optimizer of a real tracked
``torch.nn`` model and optimizer under a started exporter: once per training step, the first forward
after ``start()``, gradient accumulation, forwards inside an evaluation, a no-grad forward. The phase
arithmetic: test_phases.py; tests/integration/test_exposition_promtool.py reuses ``trained``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import memexporter
from memexporter.tracking import phases
from memexporter.tracking.phases import PhaseTracker
from memexporter.tracking.steps import Detail


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
