"""A tracked model's ZeRO rows through ``track()`` (memexporter/tracking/partitions.py), over
stand-ins of DeepSpeed's marks and a real torch optimizer stepping the flat partition, as
DeepSpeed's does: the rows are the fragments' bytes, and where the marks are not as expected the
families are absent (not 0), the collector reports a partial failure, and nothing raises."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from memexporter.collectors.modules import ModulesCollector
from memexporter.collectors.scrape import PartialFailure, Scrape
from memexporter.tracking import gradients
from memexporter.tracking.errors import hook_errors
from memexporter.tracking.modules import track
from tests.support.deepspeed_standins import loaded, zero12
from tests.support.fakes import sources


@pytest.fixture(autouse=True)
def _count_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gradients, "STEP_COUNT_INTERVAL_S", 0.0)
    loaded(monkeypatch)


def model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))


def step(flat: torch.Tensor, opt: torch.optim.Optimizer) -> None:
    flat.grad = torch.ones_like(flat)
    opt.step()


@pytest.mark.parametrize("explicit", [True, False], ids=["track_with_optimizer", "global_hook"])
def test_rows_are_the_fragments_of_the_flat_partition(explicit: bool) -> None:
    net = model()
    flat = zero12(net, padding=2)
    opt = torch.optim.AdamW([flat])
    handle = track(net, opt if explicit else None)
    errors = hook_errors()
    step(flat, opt)
    snap = handle.snapshot()
    assert snap.gradient == (8, 120, 0, 56)  # root: the 2 padding elements; rows: 0, ReLU, 2
    assert snap.optimizer_state == (2 * 12 + 4, 360, 0, 168)  # fp32 master + exp_avg + exp_avg_sq; step in the root
    assert snap.parameter == (0, 120, 0, 56) and snap.unsharded is None  # ZeRO 1/2 keep whole parameters
    assert ("gradient", "cpu", (8, 120, 0, 56)) in snap.placement and not snap.absent
    assert hook_errors() == errors


def test_marks_not_as_expected_leave_the_families_out() -> None:
    net = model()
    flat = zero12(net)
    net[0].weight._hp_mapping = object()  # type: ignore[union-attr]
    opt = torch.optim.AdamW([flat])
    handle = track(net, opt)
    errors = hook_errors()
    step(flat, opt)
    step(flat, opt)
    snap = handle.snapshot()
    assert {family for family, _ in snap.absent} == {"gradient", "optimizer_state"}
    assert hook_errors() == errors  # a known difference, not a failure of ours
    with pytest.raises(PartialFailure) as failure:
        list(ModulesCollector(lambda: [handle]).collect(Scrape(sources())))
    names = {f.name for f in failure.value.families}
    assert "memexporter_module_parameter_bytes" in names
    assert not names & {"memexporter_module_gradient_bytes", "memexporter_module_optimizer_state_bytes"}
    assert "hp_fragment" in str(failure.value)
