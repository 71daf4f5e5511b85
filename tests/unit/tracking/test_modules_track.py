"""``track()`` as a user calls it: several models, the global optimizer hook, bad arguments,
knobs, and the opt-in forward deltas."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from memexporter.tracking.modules import ROOT_LABEL, track
from tests.support.models import (
    Block,
    D,
    Deep,
    totals,
    unique_param_bytes,
)


def test_two_models_get_distinct_rows() -> None:
    class Generator(nn.Sequential):
        pass

    class Discriminator(nn.Sequential):
        pass

    g = Generator(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    d = Discriminator(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    hg, hd = track(g), track(d)
    assert (hg.prefix, hd.prefix) == ("", "Discriminator")
    third = track(Generator(nn.Linear(8, 8)))
    assert third.prefix == "Generator"
    fourth = track(Generator(nn.Linear(8, 8)))
    assert fourth.prefix == "model1"
    names = [set(h.snapshot().layout.names) for h in (hg, hd, third, fourth)]
    assert sum(len(n) for n in names) == len(set().union(*names))
    with pytest.raises(ValueError, match="already tracked"):
        track(g)
    with pytest.raises(ValueError, match="collide"):
        track(nn.Linear(2, 2), prefix="Discriminator")


def test_the_global_step_hook_keeps_only_optimizers_of_the_model() -> None:
    g, d = Deep(1), Deep(1)
    opt_g, opt_d = torch.optim.Adam(g.parameters()), torch.optim.Adam(d.parameters())
    hg = track(g, prefix="G")
    x = torch.randn(2, 16)
    g(x).sum().backward()
    d(x).sum().backward()
    opt_d.step()
    assert totals(hg)["optimizer_state"] == 0
    opt_g.step()
    steps = 4 * len(list(g.parameters()))  # Adam's scalar `step` tensors
    assert totals(hg)["optimizer_state"] == 2 * unique_param_bytes(g) + steps


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"model": "not a module"}, TypeError),
        ({"optimizer": 3}, TypeError),
        ({"optimizer": ["sgd"]}, TypeError),
        ({"prefix": 7}, TypeError),
        ({"depth": 0}, ValueError),
        ({"max_modules": -1}, ValueError),
    ],
)
def test_bad_arguments_fail_fast(kwargs: dict[str, Any], error: type[Exception]) -> None:
    args: dict[str, Any] = {"model": nn.Linear(2, 2), **kwargs}
    with pytest.raises(error):
        track(**args)


def test_track_ignores_unrelated_bad_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMEXPORTER_PORT", "not-a-port")
    monkeypatch.setenv("MEMEXPORTER_MODULE_DEPTH", "1")
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    with track(model, prefix="s") as handle:
        assert max(n.count(".") for n in handle.snapshot().layout.names) <= 1


def test_forward_deltas_with_an_injected_reading() -> None:
    # CPU stand-in for torch.cuda.memory_allocated: a counter that grows 100 per read.
    reads = iter(range(0, 10**9, 100))
    model = Deep(2)
    handle = track(model, cuda_forward_delta=True, allocated=lambda: next(reads), depth=2)
    assert handle.forward_deltas() == {}
    model(torch.randn(2, 16))
    deltas = handle.forward_deltas()
    # Every row whose module runs a forward; the ModuleList `blocks` has none (its blocks are hooked).
    assert set(deltas) == set(handle.snapshot().layout.names) - {"blocks"}
    assert deltas["blocks.0"] == 100  # one read before and one after, nothing else in between
    assert deltas[ROOT_LABEL] > deltas["blocks.0"]
    with torch.no_grad():
        model(torch.randn(2, 16))
    assert handle.forward_deltas() == deltas  # only grad-enabled forwards update


def test_forward_deltas_leave_the_activation_rows_alone() -> None:
    # The delta hooks replace the plain ones on every hooked module: the rows must not change.
    block, x = Block(), torch.randn(4, 32, D)
    with track(block, prefix="m", depth=1) as plain:
        block(x)
        rows = plain.snapshot().activation
    reads = iter(range(0, 10**9, 100))
    with track(block, prefix="m", depth=1, cuda_forward_delta=True, allocated=lambda: next(reads)) as deltas:
        block(x)
        assert deltas.forward_deltas(), "the delta hooks ran"
        assert deltas.snapshot().activation == rows
    assert sum(rows) > 0 and rows[0] > 0  # Block's own row (gelu's saved input) is among them
