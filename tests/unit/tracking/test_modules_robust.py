"""``track()`` never raises into training but for bad arguments, leaves nothing behind when it
fails, and takes the optimizer a framework wraps (accelerate, Lightning) as the optimizer itself."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.optim import Optimizer

from memexporter.tracking import gradients as tracking_optimizer
from memexporter.tracking import ledger
from memexporter.tracking import modules as tracking_modules
from memexporter.tracking.modules import active_handles, hook_errors, inner_optimizer, track
from tests.support.models import Deep, all_hooks, totals, unique_param_bytes


class AcceleratedStyle(Optimizer):
    """accelerate's AcceleratedOptimizer: subclasses Optimizer, never calls its __init__ (so it
    has none of its hook dicts), and steps the optimizer it wraps."""

    def __init__(self, optimizer: Optimizer) -> None:
        self.optimizer = optimizer

    @property
    def param_groups(self) -> Any:  # type: ignore[override]
        return self.optimizer.param_groups

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)


class LightningStyle:
    """Lightning's LightningOptimizer: no Optimizer at all, the real one under ``.optimizer``."""

    def __init__(self, optimizer: Optimizer) -> None:
        self._optimizer = optimizer

    @property
    def optimizer(self) -> Optimizer:
        return self._optimizer

    def step(self) -> None:
        self._optimizer.step()


@pytest.mark.parametrize("wrap", [AcceleratedStyle, LightningStyle, lambda o: [AcceleratedStyle(o)]])
def test_a_wrapped_optimizer_is_unwrapped_and_its_state_counted(monkeypatch: pytest.MonkeyPatch, wrap: Any) -> None:
    monkeypatch.setattr(tracking_optimizer, "STEP_COUNT_INTERVAL_S", 0.0)
    model = Deep(2)
    inner = torch.optim.Adam(model.parameters())
    wrapped = wrap(inner)
    handle = track(model, wrapped)  # accelerate's used to raise AttributeError: _optimizer_step_post_hooks
    errors = hook_errors()
    model(torch.randn(2, 5, 16)).sum().backward()
    (wrapped[0] if isinstance(wrapped, list) else wrapped).step()
    got = totals(handle)
    assert got["optimizer_state"] >= 2 * unique_param_bytes(model)
    assert got["gradient"] == unique_param_bytes(model)
    assert hook_errors() == errors


def test_inner_optimizer_and_bad_arguments() -> None:
    opt = torch.optim.SGD(Deep(1).parameters(), lr=0.1)
    assert inner_optimizer(LightningStyle(AcceleratedStyle(opt))) is opt
    assert inner_optimizer(object()) is None
    with pytest.raises(TypeError, match="optimizer must be"):
        track(Deep(1), "adam")
    with pytest.raises(TypeError, match="optimizer must be"):
        track(Deep(1), [opt, 3])
    assert not active_handles()


def test_a_failure_part_way_is_counted_and_leaves_no_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Deep(2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def boom(*args: object) -> None:
        raise RuntimeError("injected")

    errors = hook_errors()
    monkeypatch.setattr(Optimizer, "register_step_post_hook", boom)  # the last hook track() registers
    handle = track(model, opt)  # used to raise, with the forward hooks left on the model
    monkeypatch.undo()
    assert hook_errors() == errors + 1
    assert all_hooks(model) == 0 and not active_handles()
    handle.remove()  # the handle returned still works
    with track(model, opt) as again:  # and a later track() records as usual
        model(torch.randn(2, 5, 16)).sum().backward()
        assert totals(again)["activation"] > 0
    assert all_hooks(model) == 0


def test_an_unreadable_parameter_is_skipped_counted_and_logged_once(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Deep(2)
    real = ledger.owned
    broken = model.blocks[0].fc1.weight

    def owned(t: torch.Tensor) -> tuple[int, int]:
        if t is broken:
            raise RuntimeError("Attempted to access the data pointer on an invalid python storage.")
        return real(t)

    monkeypatch.setattr(ledger, "owned", owned)
    errors = hook_errors()
    handle = track(model)
    assert hook_errors() == errors + 1
    expected = unique_param_bytes(model) - broken.numel() * broken.element_size()
    assert totals(handle)["parameter"] == expected


def test_bad_arguments_still_raise() -> None:
    with pytest.raises(TypeError, match=r"nn\.Module"):
        track("model")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="prefix"):
        track(nn.Linear(2, 2), prefix=3)  # type: ignore[arg-type]
    assert tracking_modules.active_handles() == ()
