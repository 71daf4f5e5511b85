"""``memexporter.on_oom_risk`` live: a real training loop that leaks 1 MiB of host memory a step
(10 steps a second) under a soft budget 300 MiB above its starting RSS saves a real checkpoint,
once, before a simulated OOM (RSS crossing the budget); the same loop without the leak never calls.
The judgement is the real one (the watch thread, once a second); the lead time is recorded."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import memexporter
from memexporter.backends.host import HostBackend
from memexporter.oom import risk
from memexporter.oom.risk import OomRisk
from tests.support.heap import settle

pytestmark = [pytest.mark.integration, pytest.mark.slow(seconds=30, waits=True), pytest.mark.usefixtures("no_exporter")]

MiB = 1 << 20
STEP_S = 0.1
HEADROOM = 300 * MiB
HEALTHY_S = 10.0
MAX_S = 60.0  # the leak crosses the budget after ~30 s


@pytest.fixture(autouse=True)
def _own_callbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(risk, "_registered", ())  # none from other tests, none left to them


@dataclass
class Run:
    limit: int
    calls: list[tuple[float, OomRisk, int]] = field(default_factory=list)  # (saved at, risk, thread)
    oom_at: float | None = None  # monotonic time RSS crossed the budget
    weights: dict[str, torch.Tensor] = field(default_factory=dict)  # the model's, when it was saved
    steps: int = 0
    seconds: float = 0.0


def _train(tmp_path: Path, leak: bool, register_before_start: bool) -> Run:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    host = HostBackend()
    settle()  # a budget above what earlier tests in this worker left behind would move (tests/support/heap.py)
    run = Run(limit=host.rss() + HEADROOM)
    checkpoint = tmp_path / "checkpoint.pt"

    def save_checkpoint(r: OomRisk) -> None:
        assert not checkpoint.exists(), "a second checkpoint"
        with memexporter.phase("checkpoint"):
            torch.save(model.state_dict(), checkpoint)
        run.weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        run.calls.append((time.monotonic(), r, threading.get_ident()))

    if register_before_start:
        handle = memexporter.on_oom_risk(save_checkpoint)
    memexporter.start(port=0, addr="127.0.0.1", memory_limit_bytes=run.limit, model=model, optimizer=opt)
    if not register_before_start:
        handle = memexporter.on_oom_risk(save_checkpoint)
    leaked: list[torch.Tensor] = []
    t0 = next_at = time.monotonic()
    try:
        while True:
            x = torch.randn(32, 64)
            (model(x) - x[:, :8]).pow(2).mean().backward()  # a bounded loss: weights stay finite
            opt.step()  # the step boundary, where the callback runs
            opt.zero_grad()
            run.steps += 1
            if leak:
                leaked.append(torch.ones(256 * 1024))  # 1 MiB, written: resident
            now = time.monotonic()
            if host.rss() >= run.limit:
                run.oom_at = now  # the simulated OOM: the job would be dead here
                break
            if (not leak and now - t0 >= HEALTHY_S) or now - t0 >= MAX_S:
                break
            next_at += STEP_S
            time.sleep(max(0.0, next_at - time.monotonic()))
    finally:
        run.seconds = time.monotonic() - t0
        handle.remove()
        memexporter.stop()
        leaked.clear()
    if run.calls:
        saved = torch.load(checkpoint, weights_only=True)  # a real, loadable checkpoint of that moment
        assert set(saved) == set(run.weights)
        assert all(torch.equal(saved[k], v) for k, v in run.weights.items())
    return run


def test_a_healthy_run_never_calls(tmp_path: Path) -> None:
    run = _train(tmp_path, leak=False, register_before_start=False)
    assert run.oom_at is None
    assert run.seconds >= HEALTHY_S and run.steps >= 80
    assert run.calls == []
    assert not (tmp_path / "checkpoint.pt").exists()


def test_a_leak_saves_a_checkpoint_once_before_the_oom(tmp_path: Path, record_property: Any) -> None:
    run = _train(tmp_path, leak=True, register_before_start=True)
    assert run.oom_at is not None, f"RSS never crossed the budget in {run.seconds:.0f} s ({run.steps} steps)"
    assert len(run.calls) == 1, [r for _, r, _ in run.calls]
    saved_at, r, thread = run.calls[0]
    assert thread == threading.get_ident()  # on the training thread, inside opt.step()
    assert (tmp_path / "checkpoint.pt").is_file()
    assert saved_at < run.oom_at
    assert r.device == "cpu" and r.limit_bytes == run.limit
    assert r.reason in {"forecast", "headroom"}
    lead = run.oom_at - saved_at
    record_property("oom_risk_lead_seconds", round(lead, 1))
    record_property("oom_risk_reason", r.reason)
    record_property("oom_risk_eta_seconds", None if r.eta_seconds == float("inf") else round(r.eta_seconds))
    print(
        f"on_oom_risk: {r.reason} at {r.peak_bytes / r.limit_bytes:.0%} of the budget, ETA {r.eta_seconds:.0f} s; "
        f"checkpoint saved {lead:.1f} s before the simulated OOM ({run.steps} steps, {run.seconds:.0f} s)"
    )
    assert lead >= 2.0  # a useful warning, not a photo finish
