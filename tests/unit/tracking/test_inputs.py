"""The step's input, measured (tracking/inputs.py): from the tracked model's outermost training forward
(tensors among its positional and keyword arguments, one level into tuples, lists and dicts; the length
is dimension 1 of the largest tensor of 2 or more dimensions), from ``memexporter.step_input`` without
a tracked model, and kept beside the measured step peaks in bounded state."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

import memexporter
from memexporter.tracking import errors, inputs
from memexporter.tracking.inputs import BIN_POINTS, MAX_BINS, InputLog, measure
from memexporter.tracking.modules import track
from tests.support.fakes import MiB


@pytest.fixture
def log() -> Iterator[InputLog]:
    got = InputLog()
    inputs.activate(got)
    yield got
    inputs.activate(None)


class HFStyle(nn.Module):
    """Takes what the HF Trainer passes: ``model(**batch)``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(100, 8), nn.Linear(8, 100)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.embed(input_ids) * attention_mask[..., None])
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def test_elements_count_every_tensor_one_level_deep_and_the_length_is_the_largest_tensors_dim_1() -> None:
    ids = torch.zeros(4, 300, dtype=torch.long)
    batch = {"input_ids": ids, "attention_mask": torch.ones(4, 300), "labels": ids, "meta": "text"}
    assert measure((), batch) == (3 * 1200, 300, 4)
    # A tuple and a list one level deep; a 1-D tensor counts its elements but sets no length.
    assert measure(((torch.zeros(2, 7), torch.zeros(2)), [torch.zeros(3, 5, 9)]), {}) == (14 + 2 + 135, 5, 3)
    assert measure(([[torch.zeros(10, 10)]],), None) == (0, 0, 0)  # two levels down: not looked into
    assert measure((torch.zeros(6),), None) == (6, 0, 0)


def test_the_tracked_models_training_forward_reports_its_keyword_input(log: InputLog) -> None:
    model = HFStyle()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with track(model, opt):
        ids = torch.randint(0, 100, (2, 40))
        model(input_ids=ids, attention_mask=torch.ones(2, 40), labels=ids).backward()
        with torch.no_grad():  # an evaluation forward is not the step's input
            big = torch.randint(0, 100, (8, 90))
            model(input_ids=big, attention_mask=torch.ones(8, 90), labels=big)
        assert (log.elements, log.length, log.batch) == (240, 40, 2)
        ids = torch.randint(0, 100, (2, 10))  # a smaller micro-batch: the step keeps its largest
        model(input_ids=ids, attention_mask=torch.ones(2, 10), labels=ids).backward()
    assert log.end_step() is None  # the first steps' points are left out (optimizer state, caches)
    assert (log.last, log.largest) == (240, (240, 40, 2))


def test_step_input_reports_a_batch_or_numbers_without_a_tracked_model(log: InputLog) -> None:
    memexporter.step_input({"x": torch.zeros(16, 128), "y": torch.zeros(16)})
    assert (log.elements, log.length, log.batch) == (16 * 128 + 16, 128, 16)
    log.end_step()
    memexporter.step_input(elements=5000, length=1000)
    assert (log.elements, log.length) == (5000, 1000)
    with pytest.raises(TypeError, match="elements must be an int"):
        memexporter.step_input(elements=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="length must be >= 0"):
        memexporter.step_input(elements=1, length=-1)


def test_step_input_is_a_no_op_without_an_exporter() -> None:
    inputs.activate(None)
    memexporter.step_input(torch.zeros(3, 3))  # nothing to report to, nothing raised


def test_points_are_bounded_and_a_rare_long_input_is_kept_beside_common_short_ones() -> None:
    log = InputLog(skip_steps=0)
    for step in range(20_000):
        size = 1000 + step % 3000 if step != 10 else 90_000  # one long batch early on
        log.note(size, size // 4, 4)
        got = log.end_step()
        assert got is not None
        log.measured("cuda:0", got, step, ends=0, top=size * 1000, exact=False)
    points = log.snapshot().devices["cuda:0"]
    assert len(points.elements) <= MAX_BINS * BIN_POINTS
    assert 90_000.0 in points.elements
    assert (
        log.snapshot().largest_elements == 90_000 and log.snapshot().before_largest == 1009
    )  # the largest before the long one


def test_a_sample_counts_only_above_the_steps_ends() -> None:
    # On the host, memory freed by earlier steps stays resident: a sample at the boundaries' level
    # says nothing of the step's own peak. An exact peak (the high-water mark rose) always counts.
    log = InputLog(skip_steps=0)
    log.measured("cpu", (100, 10), 1, ends=500 * MiB, top=500 * MiB + 4096, exact=False)
    log.measured("cpu", (200, 20), 2, ends=500 * MiB, top=600 * MiB, exact=False)
    log.measured("cpu", (300, 30), 3, ends=500 * MiB, top=500 * MiB, exact=True)
    points = log.snapshot().devices["cpu"]
    assert (points.elements, points.exact) == ((200.0, 300.0), (0, 1))


def test_a_measurement_that_fails_is_counted_and_never_raised(log: InputLog) -> None:
    class Odd(torch.Tensor):
        def numel(self) -> int:
            raise RuntimeError("a tensor subclass that cannot count")

    before = errors.hook_errors()
    inputs.note_call((torch.zeros(2, 3).as_subclass(Odd),), None)  # the hook's call: nothing raised
    memexporter.step_input({"x": torch.zeros(2, 3).as_subclass(Odd)})
    assert errors.hook_errors() == before + 2 and log.elements == 0


def test_a_restart_at_a_lower_level_forgets_the_devices_points() -> None:
    # A model reloaded (memory freed: the trend restarts at a new level): the peaks measured before it
    # would put the capacity too low, and warn of an input that now fits.
    from memexporter.tracking.steps import StepTracker
    from tests.support.fakes import FakeHost, GiB, one_gpu

    cuda, _ = one_gpu()
    tracker = StepTracker(cuda, FakeHost(), 64, 0, host_peak=lambda: 0)  # type: ignore[arg-type]
    tracker.inputs = InputLog(skip_steps=0)
    for level, steps in ((6 * GiB, 5), (2 * GiB, 1)):
        for _ in range(steps):
            peak = cuda.stats[0]["allocated_bytes.all.peak"] + MiB * 64  # each step a new high-water mark
            cuda.stats[0] = {**cuda.stats[0], "allocated_bytes.all.current": level, "allocated_bytes.all.peak": peak}
            tracker.inputs.note(1000, 100, 10)
            tracker.step()
        if level == 6 * GiB:
            assert len(tracker.inputs.snapshot().devices["cuda:0"].elements) == 4  # the first has no mark to compare
    assert "cuda:0" not in tracker.inputs.snapshot().devices
