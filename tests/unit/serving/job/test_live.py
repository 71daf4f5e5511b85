"""The live page's data (serving/job/live.py) and its history (tracking/history.py), from samples and a
step tracker over the fake backends (SYNTHETIC figures)."""

from __future__ import annotations

import math

import pytest

from memexporter.serving.job.live import TOP_MODULES, document, in_words
from memexporter.tracking.history import History
from memexporter.tracking.steps import StepTracker
from memexporter.units import fmt_duration
from tests.support.fakes import FakeHost, GiB, MiB, one_gpu


def tracker() -> StepTracker:
    cuda, _ = one_gpu()
    return StepTracker(cuda, FakeHost(), window=64, warmup_steps=0, host_peak=lambda: 0)  # type: ignore[arg-type]


def test_history_keeps_one_point_per_interval_and_no_more_than_its_bound() -> None:
    now = [1000.0]
    steps = tracker()
    history = History(steps, interval_s=2.0, max_points=5, clock=lambda: now[0])
    steps.add_boundary_callback(history.on_boundary)
    for _ in range(40):  # a step every 0.5 s for 20 s: one point every 2 s, the newest 5 kept
        steps.step()
        now[0] += 0.5
    points = history.points()
    assert [p.step for p in points] == [21, 25, 29, 33, 37]
    baseline, peak = points[-1].devices["cuda:0"]
    assert baseline == 3 * GiB and baseline <= peak <= 5 * GiB and set(points[-1].devices) == {"cpu", "cuda:0"}
    assert [p.step for p in history.points(since=points[2].time)] == [33, 37]


def test_history_never_raises_into_training() -> None:
    class Broken:
        def latest(self) -> dict[str, tuple[int, int]]:
            raise RuntimeError("broken")

    history = History(Broken(), clock=lambda: 0.0)  # type: ignore[arg-type]
    history.on_boundary(1)
    assert history.points() == []


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(40, "40 s"), (14 * 60 + 5, "14 m"), (2 * 3600 + 10 * 60, "2 h 10 m"), (3 * 86400 + 7200, "3 d 2 h")],
)
def test_durations_read_as_said(seconds: float, said: str) -> None:
    assert fmt_duration(seconds) == said


def test_the_eta_in_words() -> None:
    growing = {"leak_rate_bytes_per_second": MiB, "leak_bytes_per_step": 8 * MiB, "oom_eta_seconds": 7800.0}
    assert in_words(growing) == (
        "memory held between steps grows 1.0 MiB/s (8.0 MiB per step); at this rate the peak "
        "reaches the limit in 2 h 10 m"
    )
    assert (
        in_words({"leak_rate_bytes_per_second": 0.0, "oom_eta_seconds": math.inf})
        == "memory held between steps is not growing"
    )
    assert in_words({}) == "not enough steps yet to tell whether memory grows"


def test_document_from_samples() -> None:
    samples = [
        ("memexporter_memory_used_bytes", {"rank": "3", "device": "cpu"}, 2.0 * GiB),
        ("memexporter_memory_used_bytes", {"rank": "3", "device": "cuda:0"}, 3.0 * GiB),
        ("memexporter_memory_limit_bytes", {"rank": "3", "device": "cuda:0"}, 74.0 * GiB),
        ("memexporter_oom_eta_seconds", {"rank": "3", "device": "cuda:0"}, math.inf),
        ("memexporter_leak_rate_bytes_per_second", {"rank": "3", "device": "cuda:0"}, 0.0),
        ("memexporter_steps_total", {"rank": "3"}, 42.0),
        ("memexporter_collector_success", {"rank": "3", "collector": "device"}, 0.0),
        ("memexporter_collector_success", {"rank": "3", "collector": "memory"}, 1.0),
        *[
            (f"memexporter_module_{fam}_bytes", {"rank": "3", "module": f"blocks.{i}"}, float(i * MiB))
            for i in range(TOP_MODULES + 3)
            for fam in ("parameter", "gradient")
        ],
    ]
    doc = document(samples, None)
    assert doc["rank"] == "3" and doc["steps"] == 42
    assert [d["device"] for d in doc["devices"]] == ["cuda:0", "cpu"]  # the accelerator first
    cuda = doc["devices"][0]
    assert cuda["oom_eta_seconds"] is None and cuda["in_words"] == "memory held between steps is not growing"
    assert cuda["memory_limit_bytes"] == 74.0 * GiB and cuda["history"] == []
    assert [m["module"] for m in doc["modules"]][:2] == [f"blocks.{TOP_MODULES + 2}", f"blocks.{TOP_MODULES + 1}"]
    assert len(doc["modules"]) == TOP_MODULES and doc["modules_left_out"] == 3
    assert doc["modules"][0]["gradients"] == (TOP_MODULES + 2) * MiB
    assert doc["health"] == {"device": False, "memory": True}


def test_the_page_names_stranded_memory_and_its_remedy() -> None:
    # What the H200's native job had at its OOM: 1.2 GiB of its 6 GiB limit stranded, growing.
    labels = {"rank": "0", "device": "cuda:0"}
    samples = [
        ("memexporter_memory_used_bytes", labels, 4.8 * GiB),
        ("memexporter_memory_committed_bytes", labels, 6.0 * GiB),
        ("memexporter_memory_limit_bytes", labels, 6.0 * GiB),
        ("memexporter_allocator_recoverable_bytes", labels, 1.2 * GiB),
    ]
    cuda = document(samples, None)["devices"][0]
    assert cuda["memory_committed_bytes"] == 6.0 * GiB
    assert cuda["advice"] == (
        "cuda:0: 1.2 GiB (20% of the 6.0 GiB limit) is stranded in partly used segments of the native caching "
        "allocator, and growing; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True would likely recover it"
    )
    samples[-1] = ("memexporter_allocator_recoverable_bytes", labels, 0.0)
    assert document(samples, None)["devices"][0]["advice"] is None


def test_the_page_says_the_largest_input_that_fits_in_one_line() -> None:
    # Issue 41's example: input_ids of batch 4; 2,668 elements fit, 1,280 (length 320) seen, 4,096 declared.
    rank, dev = {"rank": "0"}, {"rank": "0", "device": "cuda:0"}
    samples = [
        ("memexporter_memory_used_bytes", dev, 4.8 * GiB),
        ("memexporter_input_capacity_elements", dev, 2668.0),
        ("memexporter_step_input_elements_max", rank, 1280.0),
        ("memexporter_step_input_max_length", rank, 320.0),
        ("memexporter_step_input_max_batch", rank, 4.0),
        ("memexporter_input_declared_max_elements", rank, 4096.0),
    ]
    cuda = document(samples, None)["devices"][0]
    assert cuda["input"] == (
        "the largest input that fits: 2,668 elements (667 long at batch 4); seen 1,280; declared 4,096: will not fit"
    )
    assert cuda["input_warn"] is True
    undeclared = document(samples[:-1], None)["devices"][0]
    assert undeclared["input"].endswith("seen 1,280") and undeclared["input_warn"] is False
    assert document(samples[:1], None)["devices"][0]["input"] is None  # no capacity claimed: nothing said


def test_the_page_shows_the_top_three_levers_as_given() -> None:
    levers = [
        {"kind": k, "device": "cpu", "freed_bytes": b, "text": f"{k}: ..."}
        for k, b in [("leak", 9.0), ("precision", 5.0), ("checkpointing", 3.0), ("stranded", 1.0)]
    ]
    doc = document([], None, levers)
    assert [v["kind"] for v in doc["levers"]] == ["leak", "precision", "checkpointing"]
    assert document([], None)["levers"] == []
