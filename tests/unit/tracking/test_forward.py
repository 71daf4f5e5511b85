"""How a forward is recorded (tracking/forward.py): through whichever module the training step calls,
summed over the parts of one pass, at most once per ``RECORD_INTERVAL_S``, with the row hooks on
the model only while forwards are recorded."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from memexporter.tracking import schedule as tracking_schedule
from memexporter.tracking.modules import track
from tests.support.models import Block, Deep, OuterCounter, all_hooks, row, totals


class LitStyle(nn.Module):
    """A LightningModule's shape: the training step calls ``self.net``, never ``self``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = Deep(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # never called by the training step
        raise AssertionError("not called")

    def training_step(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).sum()


def test_activations_are_recorded_when_the_step_calls_a_submodule_not_the_root() -> None:
    lit = LitStyle()
    handle = track(lit, torch.optim.SGD(lit.parameters(), lr=0.1))
    x = torch.randn(2, 5, 16)
    outer = OuterCounter(lit)
    with outer.hooks():
        loss = lit.training_step(x)
    loss.backward()
    assert outer.bytes > 0
    assert totals(handle)["activation"] == outer.bytes
    assert row(handle, "activation", "net.blocks.0") > 0


class EncDec(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc, self.dec = Block(16), Block(16)


def test_parts_of_one_pass_add_up_and_the_next_pass_starts_afresh() -> None:
    model = EncDec()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = track(model, opt)
    x = torch.randn(2, 5, 16)
    for _ in range(3):  # three micro-batches: the figure is one pass's, not three
        model.dec(model.enc(x)).sum().backward()
    one_pass = totals(handle)["activation"]
    assert row(handle, "activation", "enc") > 0 and row(handle, "activation", "dec") > 0
    with track(Block(16), prefix="alone") as alone:
        alone.model(x)
        single = totals(alone)["activation"]
    # Both blocks save the same shapes; enc's output saved by dec's LayerNorm counts once, in dec.
    assert single < one_pass <= 2 * single
    opt.step()
    model.dec(model.enc(x))
    assert totals(handle)["activation"] == one_pass


def test_forwards_are_recorded_at_most_once_per_interval_and_row_hooks_come_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tracking_schedule, "RECORD_INTERVAL_S", 3600.0)
    model = Deep(4)
    handle = track(model)
    entry_hooks = all_hooks(model)
    model(torch.randn(2, 5, 16)).sum().backward()  # the first forward is recorded
    first = totals(handle)["activation"]
    assert first > 0
    model(torch.randn(8, 5, 16)).sum().backward()  # four times the activations, but not recorded
    assert totals(handle)["activation"] == first
    # Between recordings only the root is hooked (pre-hook, hook, and its always-call entry); its
    # children were entries until the root was seen running.
    assert all_hooks(model) == 3 < entry_hooks
    monkeypatch.setattr(tracking_schedule, "RECORD_INTERVAL_S", 0.0)
    model(torch.randn(8, 5, 16)).sum().backward()
    assert totals(handle)["activation"] == pytest.approx(4 * first, rel=0.01)
    assert all_hooks(model) == 3  # the row hooks came off at the end of the recorded forward
    with torch.no_grad():
        model(torch.randn(8, 5, 16))  # an evaluation pays the root's hooks only
    handle.remove()
    assert all_hooks(model) == 0


def test_a_model_called_twice_before_one_backward_holds_both_calls() -> None:
    # Siamese / chosen-rejected: both calls' saves are alive at the backward.
    model = Deep(2)
    handle = track(model)
    a, b = model(torch.randn(4, 5, 16)), model(torch.randn(4, 5, 16))
    both = totals(handle)["activation"]
    (a.sum() + b.sum()).backward()
    model(torch.randn(4, 5, 16)).sum().backward()  # after a backward: a new pass, one call
    assert totals(handle)["activation"] * 2 == both


def test_entries_of_one_pass_share_one_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    # An encoder and a decoder called by the step, never the root: when the pass is recorded, both
    # are; when it is not, neither (the figure is never the decoder's alone).
    monkeypatch.setattr(tracking_schedule, "RECORD_EVERY", 2)
    model = EncDec()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = track(model, opt)
    figures = set()
    for _ in range(7):
        model.dec(model.enc(torch.randn(2, 5, 16))).sum().backward()
        opt.step()
        figures.add(totals(handle)["activation"])
        assert row(handle, "activation", "enc") > 0 and row(handle, "activation", "dec") > 0
    assert len(figures) == 1


def test_an_interrupted_forward_is_closed_at_the_next_optimizer_step() -> None:
    class Interrupting(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 16)
            self.stop = True

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.tanh(self.fc(x))
            if self.stop:
                raise KeyboardInterrupt  # torch runs no always_call hook for it
            return y

    model = Interrupting()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = track(model, opt)
    with pytest.raises(KeyboardInterrupt):
        model(torch.randn(2, 16))
    assert torch._C._autograd._top_saved_tensors_default_hooks(True) is not None  # left pushed
    opt.step()
    assert torch._C._autograd._top_saved_tensors_default_hooks(True) is None
    assert handle.forward.idle
    model.stop = False
    model(torch.randn(2, 16)).sum().backward()
    assert totals(handle)["activation"] > 0


def test_an_eval_forward_in_between_is_no_entry_and_changes_nothing() -> None:
    model = Deep(2)
    handle = track(model)
    model(torch.randn(2, 5, 16)).sum().backward()
    rows = handle.snapshot().activation
    with torch.no_grad():
        model.blocks[0](torch.randn(64, 5, 16))
    model.eval()
    with torch.inference_mode():
        model(torch.randn(64, 5, 16))
    assert handle.snapshot().activation == rows
    loss = F.mse_loss(model(torch.randn(2, 5, 16)), torch.zeros(2, 5, 3))
    loss.backward()
    assert handle.snapshot().activation == rows  # the same shapes again


def test_a_slow_step_is_recorded_one_forward_in_record_every(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracking_schedule, "RECORD_EVERY", 3)  # and the interval 0: steps "slower" than it
    model = Deep(2)
    handle = track(model)
    figures = []
    for n in (1, 2, 3, 4, 5, 6, 7):
        model(torch.randn(n, 5, 16)).sum().backward()
        figures.append(totals(handle)["activation"])
    # Recorded: the first forward, then the 4th and the 7th (batch 1, 4, 7).
    assert figures[0] * 4 == figures[3] and figures[0] * 7 == figures[6]
    assert figures[0] == figures[1] == figures[2] and figures[3] == figures[4] == figures[5]


def test_a_checkpoint_recompute_between_recordings_leaves_the_stack_empty() -> None:
    # Every forward recorded (the row hooks stay on between forwards); the blocks are checkpointed,
    # so backward re-runs their forwards (and their row hooks) outside any recorded forward.
    from torch.utils.checkpoint import checkpoint

    class Ckpt(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block(16) for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = checkpoint(b, x, use_reentrant=False)
            return x

    model = Ckpt()
    handle = track(model)
    for _ in range(3):
        model(torch.randn(2, 5, 16)).sum().backward()
        assert handle.forward.idle


def test_a_tracked_model_inside_another_is_counted_in_one_of_them_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # A teacher called inside the student's forward, tracked a few steps before it: their record
    # schedules are out of phase. Before, the student's figure flipped between its own saves and
    # its own plus the teacher's (counted in both), depending on whether the teacher recorded.
    monkeypatch.setattr(tracking_schedule, "RECORD_EVERY", 3)
    teacher = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 16))

    class Student(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 16)
            self.__dict__["teacher"] = teacher  # not a submodule: tracked on its own

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) + self.teacher(x)

    student = Student()
    opt = torch.optim.SGD([*student.parameters(), *teacher.parameters()], lr=0.01)
    t = track(teacher, opt, prefix="teacher")
    for _ in range(2):
        student(torch.randn(8, 16)).sum().backward()
        opt.step()
    s = track(student, opt, prefix="student")
    seen = set()
    for _ in range(9):
        student(torch.randn(8, 16)).sum().backward()
        opt.step()
        seen.add((totals(s)["activation"], totals(t)["activation"]))
    (figures,) = seen
    assert figures[0] == 8 * 16 * 4  # the student's own Linear input; the teacher's saves are the teacher's
