"""The diagnosis engine on real tensors and a real step tracker (host memory scripted, so the
leak estimate is exact): census scheduling, the leak said once in words, the unexplained leak,
graphs kept across steps, failures kept from training, the pre-mortem and the CUDA OOM dump."""

from __future__ import annotations

import json
import logging
import os
import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from memexporter.diagnose import census
from memexporter.diagnose.dumps import CudaHooks, Premortem, write_atomic
from memexporter.diagnose.engine import Diagnosis, next_census
from memexporter.tracking.steps import StepTracker
from tests.support.fakes import FakeCuda, FakeHost, sources

MiB = 1 << 20


class Clock:
    """Seconds that advance by ``tick`` at every read: each boundary is a watch tick."""

    def __init__(self, tick: float) -> None:
        self.t, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.t += self.tick
        return self.t


class Loop:
    """A training job whose host memory the test scripts, and which may keep a tensor a step."""

    def __init__(self, leak: bool, rss_per_step: int, every: int = 10) -> None:
        self.host = FakeHost()
        self.kept: list[torch.Tensor] = []
        self.leak, self.rss_per_step = leak, rss_per_step
        clock = Clock(3.0)
        self.tracker = StepTracker(
            FakeCuda(), self.host, window=64, warmup_steps=0, clock=clock, host_peak=lambda: self.host.value.rss
        )
        self.diagnosis = Diagnosis(sources(host=self.host, steps=self.tracker), every, budget=1.0, clock=clock)
        self.tracker.add_boundary_callback(self.diagnosis.on_boundary)

    def run(self, steps: int) -> None:
        for _ in range(steps):
            if self.leak:
                self.kept.append(torch.ones(262144))  # 1 MiB
            self.host.value = replace(self.host.value, rss=self.host.value.rss + self.rss_per_step)
            self.tracker.step()


@pytest.mark.parametrize(
    ("cost", "elapsed", "prompt", "expected"),
    [
        (0.02, 5.02, False, 150),  # 0.4 % of 100 ms steps: the ordinary interval
        (0.10, 5.10, False, 300),  # 2 % at every 50: stretched to 200 steps (0.5 %)
        (0.10, 5.10, True, 150),  # right after a leak showed: the ordinary interval regardless
        (100.0, 105.0, False, 5100),  # never more than 100 intervals
    ],
)
def test_next_census_keeps_the_budget(cost: float, elapsed: float, prompt: bool, expected: int) -> None:
    assert next_census(100, 50, 0.005, cost, elapsed, 50, prompt) == expected


def test_censuses_come_every_n_steps_within_budget() -> None:
    loop = Loop(leak=False, rss_per_step=0)
    loop.run(35)
    assert loop.diagnosis.findings is not None
    assert [h[0] for h in loop.diagnosis.findings.history] == [10, 20, 30]
    assert loop.diagnosis.next_step == 40


def test_a_leak_is_said_once_naming_the_group_and_its_holder(caplog: pytest.LogCaptureFixture) -> None:
    loop = Loop(leak=True, rss_per_step=MiB)
    with caplog.at_level(logging.WARNING, logger="memexporter"):
        loop.run(120)
    lines = [r.getMessage() for r in caplog.records if "leaking" in r.getMessage()]
    assert lines == [
        "memexporter: leaking 1.0 MiB/step: float32[262144] on cpu, +1 per step, held by "
        "Loop.kept (list). Details: memexporter inspect"
    ]
    f = loop.diagnosis.findings
    assert f is not None
    top = f.growth[0]
    assert top.growth.key == ("cpu", "float32", (262144,), "other")
    assert top.growth.bytes_per_step == MiB and top.held_by == ("Loop.kept (list)",)


def test_a_healthy_job_shows_no_growth_and_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    loop = Loop(leak=False, rss_per_step=0)
    with caplog.at_level(logging.WARNING, logger="memexporter"):
        loop.run(120)
    f = loop.diagnosis.findings
    assert f is not None and len(f.history) >= 10
    assert f.growth == () and f.graphs == ()
    assert not [r for r in caplog.records if r.name == "memexporter"]


def test_a_leak_outside_tensors_is_said_as_such(caplog: pytest.LogCaptureFixture) -> None:
    loop = Loop(leak=False, rss_per_step=MiB)
    with caplog.at_level(logging.WARNING, logger="memexporter"):
        loop.run(120)
    lines = [r.getMessage() for r in caplog.records if "leaking" in r.getMessage()]
    assert len(lines) == 1 and "no tensor group grows" in lines[0]


def test_graphs_kept_across_steps_are_said_once(caplog: pytest.LogCaptureFixture) -> None:
    loop = Loop(leak=False, rss_per_step=0)
    w = torch.ones(3, requires_grad=True)
    loop.losses = []  # type: ignore[attr-defined]
    with caplog.at_level(logging.WARNING, logger="memexporter"):
        for _ in range(40):
            loop.losses.append((w * 2).sum())  # type: ignore[attr-defined]
            loop.run(1)
    lines = [r.getMessage() for r in caplog.records if "grad_fn" in r.getMessage()]
    assert len(lines) == 1 and "held by Loop.losses (list)" in lines[0] and "SumBackward0" in lines[0]


def test_failures_are_counted_and_never_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(step: int, previous: Any) -> Any:
        raise RuntimeError("census exploded")

    monkeypatch.setattr(census, "take", broken)
    loop = Loop(leak=False, rss_per_step=0)
    with caplog.at_level(logging.ERROR, logger="memexporter"):
        loop.run(30)
    assert loop.diagnosis.errors == 3 and loop.tracker.errors == 0
    assert len([r for r in caplog.records if "census failed" in r.getMessage()]) == 1


def test_premortem_is_written_once_when_use_passes_95_percent(tmp_path: Path) -> None:
    loop = Loop(leak=True, rss_per_step=0)
    premortem = Premortem(loop.diagnosis, str(tmp_path))
    loop.diagnosis.watchers.append(premortem)
    loop.run(3)
    assert premortem.path is None
    loop.host.value = replace(loop.host.value, rss=int(0.96 * 1e10), available=int(0.03 * 1e10))
    loop.run(3)
    assert premortem.writer.flush(10)  # written off the training thread
    assert premortem.path is not None and os.path.dirname(premortem.path) == str(tmp_path)
    doc = json.loads(Path(premortem.path).read_text())
    assert doc["reason"].startswith("cpu: 97.0 % of the limit committed")
    assert doc["census"]["step"] == 4 and {"device", "dtype", "shape", "kind"} <= set(doc["census"]["groups"][0])
    mtime = os.stat(premortem.path).st_mtime_ns
    loop.run(5)
    assert os.stat(premortem.path).st_mtime_ns == mtime  # once
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"memexporter-premortem-rank3-pid{os.getpid()}.json"]


def test_write_atomic_leaves_the_old_file_when_the_write_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f.json"
    write_atomic(str(target), b"old")

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        write_atomic(str(target), b"new")
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["f.json"]


class FakeAllocator:
    """SYNTHETIC stand-in for TorchBackend's allocator methods; the snapshot has the real shape
    (``segments`` of blocks, ``device_traces`` per device) with made-up numbers."""

    def __init__(self) -> None:
        self.initialized = False
        self.history: list[int] = []
        self.observers: list[Any] = []

    def is_initialized(self) -> bool:
        return self.initialized

    def memory_snapshot(self) -> dict[str, Any] | None:
        block = {
            "address": 1 << 40,
            "size": 2 * MiB,
            "requested_size": 2 * MiB,
            "state": "active_allocated",
            "frames": [],
        }
        segment = {
            "device": 0,
            "address": 1 << 40,
            "total_size": 2 * MiB,
            "allocated_size": 2 * MiB,
            "active_size": 2 * MiB,
            "requested_size": 2 * MiB,
            "stream": 0,
            "segment_type": "large",
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": [],
            "blocks": [block],
        }
        return {"segments": [segment], "device_traces": [[]]}

    def record_memory_history(self, max_entries: int) -> None:
        self.history.append(max_entries)

    def attach_oom_observer(self, observer: Any) -> None:
        self.observers.append(observer)


def test_cuda_hooks_wait_for_cuda_then_dump_at_most_three_ooms(tmp_path: Path) -> None:
    loop = Loop(leak=False, rss_per_step=0)
    alloc = FakeAllocator()
    hooks = CudaHooks(alloc, loop.diagnosis, str(tmp_path), record_history=True)
    hooks.on_boundary(1)
    assert (alloc.history, alloc.observers) == ([], [])  # CUDA not initialised: nothing to attach to
    alloc.initialized = True
    hooks.on_boundary(2)
    hooks.on_boundary(3)
    assert alloc.history == [100_000] and alloc.observers == [hooks.on_oom]
    for _ in range(5):
        alloc.observers[0](0, 4 * MiB, 80 * 1024 * MiB, MiB)
    assert len(hooks.dumps) == 3 and loop.diagnosis.writer.flush(10)  # written off the training thread
    stem = hooks.dumps[0]
    assert pickle.loads(Path(stem + ".pickle").read_bytes())["segments"][0]["blocks"][0]["size"] == 2 * MiB
    # No CUDA view in this fake job: the reason falls back on the driver's figures, and says so.
    assert json.loads(Path(stem + ".json").read_text())["reason"] == (
        "CUDA OOM: asked 4.0 MiB on cuda:0, 1.0 MiB free on the device (the driver's figure)"
    )
    loop.diagnosis.close()
    alloc.observers[0](0, 1, 1, 1)
    assert len(hooks.dumps) == 3
