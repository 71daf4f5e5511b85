"""The hooks' own safety: they never raise into training, ``remove()`` takes every one off (also
mid-forward, from any thread), and gradient/state recounts are rate-limited."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
import torch
from torch import nn

from memexporter.tracking import errors as tracking_errors
from memexporter.tracking import gradients as tracking_optimizer
from memexporter.tracking import ledger
from memexporter.tracking import saved as tracking_saved
from memexporter.tracking.modules import active_handles, hook_errors, track
from tests.support.models import (
    Deep,
    OuterCounter,
    TiedNet,
    all_hooks,
    batch,
    totals,
    train_step,
    unique_param_bytes,
)


def test_failing_internals_are_counted_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    model = TiedNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = track(model, opt)
    before = hook_errors()

    def boom(*args: object) -> None:
        raise RuntimeError("injected")

    monkeypatch.setattr(ledger, "count_step", boom)
    monkeypatch.setattr(tracking_saved, "_top_hooks", boom)
    loss = train_step(model, opt, batch())
    assert torch.isfinite(torch.tensor(loss))  # the step completed
    assert hook_errors() >= before + 2
    assert sum(handle.snapshot().gradient) == 0  # nothing half-published

    # A pack-hook failure (a storage that cannot be read) is counted, the forward still runs.
    monkeypatch.undo()
    handle.remove()
    model = TiedNet(None)
    track(model)
    monkeypatch.setattr(tracking_saved, "storage", boom)
    monkeypatch.setattr(torch.Tensor, "untyped_storage", boom)
    before = hook_errors()
    out = model(batch()[0])
    monkeypatch.undo()
    out.sum().backward()
    assert hook_errors() > before


def test_the_first_hook_failure_is_logged_with_its_traceback_later_ones_only_counted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(tracking_errors, "_errors", 0)  # as in a fresh process
    monkeypatch.setattr(tracking_optimizer, "STEP_COUNT_INTERVAL_S", 0.0)  # every step counts

    def boom(*args: object) -> None:
        raise RuntimeError("injected")

    monkeypatch.setattr(ledger, "count_step", boom)
    model = Deep(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    track(model, opt)
    with caplog.at_level(logging.ERROR, logger="memexporter"):
        for _ in range(3):
            model(torch.randn(2, 16)).sum().backward()
            opt.step()
    assert hook_errors() == 3
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "optimizer step hook" in record.getMessage() and record.exc_info is not None


def test_saved_tensor_hooks_pushed_and_never_popped_inside_a_forward_do_not_keep_ours() -> None:
    # A user's forward that enters saved_tensors_hooks and never leaves it (a bug, or an early
    # return past a manual push): ours must still come off, or it would count every later save.
    user = OuterCounter(nn.Linear(1, 1))

    class Leaky(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            torch._C._autograd._push_saved_tensors_default_hooks(user.pack, user.unpack)
            return self.fc(x)

    model = Leaky()
    handle = track(model)
    errors = hook_errors()
    model(torch.randn(2, 16))
    top = torch._C._autograd._top_saved_tensors_default_hooks(True)
    try:
        assert top is not None and top[0] == user.pack, "the user's pair must stay on top"
        torch._C._autograd._pop_saved_tensors_default_hooks()
        assert torch._C._autograd._top_saved_tensors_default_hooks(True) is None, "ours was left beneath it"
    finally:
        while torch._C._autograd._top_saved_tensors_default_hooks(True) is not None:
            torch._C._autograd._pop_saved_tensors_default_hooks()
    assert hook_errors() == errors + 1  # counted: this forward's figure is not published
    assert totals(handle)["activation"] == 0


def test_remove_and_context_manager_remove_every_hook() -> None:
    from torch.optim.optimizer import _global_optimizer_post_hooks

    model = TiedNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    global_before = len(_global_optimizer_post_hooks)
    with track(model) as handle:  # no optimizer: the global step hook
        assert all_hooks(model) > 0
        assert len(_global_optimizer_post_hooks) == global_before + 1
        train_step(model, opt, batch())
        assert totals(handle)["gradient"] > 0
    assert all_hooks(model) == 0
    assert len(_global_optimizer_post_hooks) == global_before
    assert handle not in active_handles()
    frozen = handle.snapshot()
    train_step(model, opt, batch())
    assert handle.snapshot() is frozen  # nothing updates any more

    handle = track(model, opt)
    assert len(opt._optimizer_step_post_hooks) == 1
    handle.remove()
    handle.remove()  # idempotent
    assert all_hooks(model) == 0
    assert len(opt._optimizer_step_post_hooks) == 0
    assert torch._C._autograd._top_saved_tensors_default_hooks(True) is None


def test_a_forward_that_raises_leaves_no_hooks_pushed() -> None:
    model = Deep(2)
    handle = track(model)
    with pytest.raises(RuntimeError):
        model(torch.randn(2, 15))  # wrong width: fails inside blocks.0
    assert torch._C._autograd._top_saved_tensors_default_hooks(True) is None
    assert handle.forward.idle
    model(torch.randn(2, 16))
    assert totals(handle)["activation"] > 0


def test_gradients_and_state_are_recounted_at_most_once_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    model = Deep(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = track(model, opt)
    x = torch.randn(2, 16)
    model(x).sum().backward()
    opt.step()
    first = totals(handle)["gradient"]
    assert first == unique_param_bytes(model)
    model.out.weight.grad = None  # fewer gradients at the next step...
    opt.step()
    assert totals(handle)["gradient"] == first  # ...not seen: within the interval
    monkeypatch.setattr(tracking_optimizer, "STEP_COUNT_INTERVAL_S", 0.0)
    opt.step()
    assert totals(handle)["gradient"] == first - model.out.weight.numel() * 4


@pytest.mark.parametrize("from_other_thread", [False, True])
def test_remove_during_a_forward(from_other_thread: bool) -> None:
    model = Deep(2)
    handle = track(model)

    def remove_now(m: nn.Module, args: Any, out: Any) -> None:
        if from_other_thread:  # e.g. exporter.stop() from a signal-handling thread
            t = threading.Thread(target=handle.remove)
            t.start()
            t.join()
        else:
            handle.remove()

    user_hook = model.blocks[0].register_forward_hook(remove_now)
    model(torch.randn(2, 16)).sum().backward()
    user_hook.remove()
    # our saved-tensor hooks are never left pushed, whichever thread removed us
    assert torch._C._autograd._top_saved_tensors_default_hooks(True) is None
    assert handle not in active_handles()
    model(torch.randn(2, 16))  # the next forward takes off whatever was left
    assert all_hooks(model) == 0
    assert totals(handle)["activation"] == 0  # the interrupted forward was not published


def test_remove_from_another_thread_during_the_record_decision_leaves_nothing_pushed() -> None:
    # The other thread's remove() lands while this one decides to record (inside the parameter
    # recount). Before, it took every hook off, the root's post-hook included, and the forward
    # then pushed a saved-tensor pair that nothing popped.
    model = Deep(2)
    handle = track(model)
    recount = handle.counts.refresh_params
    remover = threading.Thread(target=handle.remove)

    def refresh() -> None:
        remover.start()
        remover.join(0.5)  # it waits for the decision to be made (before the fix: it ran now)
        recount()

    handle.counts.refresh_params = refresh  # type: ignore[method-assign]
    model(torch.randn(2, 5, 16)).sum().backward()
    remover.join(10)
    assert torch._C._autograd._top_saved_tensors_default_hooks(True) is None
    model(torch.randn(2, 5, 16))  # the next forward takes the last hooks off
    assert all_hooks(model) == 0
    assert handle not in active_handles()
