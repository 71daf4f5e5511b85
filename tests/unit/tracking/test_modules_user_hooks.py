"""The user's own saved-tensor hooks keep working under tracking: ``save_on_cpu``, a counting pair,
and a tracked model nested in another tracked model."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.graph import save_on_cpu

from memexporter.tracking.modules import track
from tests.support.models import (
    Block,
    D,
    OuterCounter,
    TiedNet,
    batch,
    grads_of,
    totals,
)


def test_save_on_cpu_keeps_working_under_tracking() -> None:
    torch.manual_seed(0)
    model = TiedNet()
    ref = copy.deepcopy(model)
    x, y = batch()
    with save_on_cpu(pin_memory=False):
        F.cross_entropy(ref(x).flatten(0, 1), y.flatten()).backward()
    handle = track(model)
    with save_on_cpu(pin_memory=False):
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    assert totals(handle)["activation"] > 0
    for a, b in zip(grads_of(model), grads_of(ref), strict=True):
        torch.testing.assert_close(a, b)


def test_a_user_counting_hook_pair_still_sees_every_save() -> None:
    torch.manual_seed(0)
    model = TiedNet()
    ref = copy.deepcopy(model)
    x, y = batch()
    plain = OuterCounter(ref)
    with plain.hooks():
        F.cross_entropy(ref(x).flatten(0, 1), y.flatten()).backward()
    track(model)
    user = OuterCounter(model)
    with user.hooks():
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    assert (user.packs, user.unpacks, user.bytes) == (plain.packs, plain.unpacks, plain.bytes)
    for a, b in zip(grads_of(model), grads_of(ref), strict=True):
        torch.testing.assert_close(a, b)


def test_a_tracked_model_inside_another_counts_its_saves_once() -> None:
    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pre = nn.Linear(D, D)
            self.teacher = Block()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.teacher(self.pre(x) * 2)  # no storage saved on both sides of the boundary

    model = Outer()
    outer_h = track(model, prefix="student")
    inner_h = track(model.teacher, prefix="teacher")
    counter = OuterCounter(model)
    with counter.hooks():
        model(torch.randn(4, 8, D))
    both = totals(outer_h)["activation"] + totals(inner_h)["activation"]
    assert totals(inner_h)["activation"] > 0
    assert both == counter.bytes
