"""DeepSpeed's own marks read back (memexporter/tracking/storage/deepspeed.py), over stand-ins: a
ZeRO-3 parameter holds ``ds_tensor``; the engine that steps an optimizer is found in the frames
above the step hook, and its ``global_steps`` says which step; the version check logs once."""

from __future__ import annotations

import logging
import sys
from typing import Any

import pytest
import torch
from torch import nn

from memexporter.tracking import boundaries
from memexporter.tracking.storage import deepspeed
from tests.support.deepspeed_standins import loaded


class Engine:
    """Stands in for ``DeepSpeedEngine``: ``_take_model_step`` steps the optimizer, then counts."""

    def __init__(self, optimizer: Any) -> None:
        self.optimizer, self.global_steps = optimizer, 0

    def _take_model_step(self) -> int | None:
        found = self.optimizer.step()
        self.global_steps += 1
        return found


class Optimizer:
    def step(self) -> int | None:
        return deepspeed.engine_step(self)  # where a step hook would ask


def test_a_zero3_parameter_holds_its_partition() -> None:
    p = nn.Parameter(torch.empty(0))
    assert deepspeed.partition(p) is None  # no ds_id: not ZeRO-3's
    p.ds_id, p.ds_tensor, p.ds_numel = 0, torch.zeros(5, dtype=torch.bfloat16), 9  # type: ignore[attr-defined]
    shard, whole = deepspeed.partition(p)  # type: ignore[misc]
    assert shard is p.ds_tensor and whole == 18  # type: ignore[attr-defined]
    del p.ds_tensor  # type: ignore[attr-defined]
    with pytest.raises(deepspeed.Unsupported, match="ds_tensor"):
        deepspeed.partition(p)


def test_the_engine_step_comes_from_the_engine_that_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "deepspeed", raising=False)
    opt = Optimizer()
    assert opt.step() is None  # DeepSpeed not imported: not even looked for (nor remembered)
    loaded(monkeypatch)
    engine = Engine(opt)
    assert [engine._take_model_step() for _ in range(3)] == [1, 2, 3]
    assert deepspeed.engine_of(opt) is engine
    assert Optimizer().step() is None  # stepped outside an engine
    del engine
    assert opt.step() is None  # kept by weak reference only


def test_an_untested_version_is_logged_once(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    loaded(monkeypatch, "0.99.1")
    with caplog.at_level(logging.WARNING, logger="memexporter"):
        assert deepspeed.checked() == "0.99.1"
        assert deepspeed.checked() == "0.99.1"
    assert [r.getMessage() for r in caplog.records if "0.99.1 is not a tested version" in r.getMessage()] != []
    assert len(caplog.records) == 1
    loaded(monkeypatch, "0.19.3")
    with caplog.at_level(logging.WARNING, logger="memexporter"):
        deepspeed.checked()
    assert len(caplog.records) == 1  # a tested minor: nothing to say


def test_the_reason_rows_are_absent_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="memexporter"):
        assert deepspeed.absent("no map in test_deepspeed") == "no map in test_deepspeed"
        deepspeed.absent("no map in test_deepspeed")
    assert len([r for r in caplog.records if "no map in test_deepspeed" in r.getMessage()]) == 1


class ZeroEngine(Engine):
    """Steps a torch optimizer one parameter group at a time, as ZeRO's ``_optimizer_step`` does."""

    def _take_model_step(self) -> int | None:
        groups = self.optimizer.param_groups
        for group in groups:
            self.optimizer.param_groups = [group]
            self.optimizer.step()
        self.optimizer.param_groups = groups
        self.global_steps += 1
        return None


def test_the_step_counter_counts_engine_steps_not_group_steps(monkeypatch: pytest.MonkeyPatch, rig: Any) -> None:
    """memexporter_steps_total follows ``global_steps`` (boundaries.py): two groups, one step each."""
    a, b = torch.zeros(3, requires_grad=True), torch.zeros(2, requires_grad=True)
    opt = torch.optim.SGD([{"params": [a]}, {"params": [b]}], lr=0.1)
    engine = ZeroEngine(opt)
    monkeypatch.delitem(sys.modules, "deepspeed", raising=False)
    opt.step()  # DeepSpeed not imported: every step call is a step
    assert rig.steps.steps == 1
    boundaries.activate(rig.steps, auto_step=True)  # a new run: its first stepping model is the primary
    loaded(monkeypatch)
    for _ in range(3):
        engine._take_model_step()
    # One per engine step: global_steps where it is ahead of the counter (a fresh or resumed engine),
    # else one more (here the plain step came first; an engine built again also counts from 0).
    assert engine.global_steps == 3 and rig.steps.steps == 4
    # The optimizer phase: once for the plain step, then per group in the first engine step (the
    # groups are not known yet), then once per engine step, from its first group to its last.
    assert rig.phases.snapshot()[0]["optimizer"].completed == 1 + 2 + 2
