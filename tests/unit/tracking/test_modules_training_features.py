"""Training features: activation checkpointing, no-grad evaluation, autocast, dtype conversion
and ``torch.compile`` give the figures the contract describes."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from memexporter.tracking.modules import ROOT_LABEL, hook_errors, track
from tests.support.models import (
    Deep,
    OuterCounter,
    TiedNet,
    batch,
    row,
    totals,
    unique_param_bytes,
)


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_recompute_is_not_a_new_forward(reentrant: bool) -> None:
    model = TiedNet(reentrant)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = track(model, opt)
    x, y = batch()
    out = model(x)
    after_forward = handle.snapshot().activation
    F.cross_entropy(out.flatten(0, 1), y.flatten()).backward()  # recomputes ckpt
    assert handle.snapshot().activation == after_forward
    opt.step()
    assert sum(after_forward) > 0


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointing_the_whole_model(reentrant: bool) -> None:
    model = Deep(2)
    handle = track(model)
    x = torch.randn(4, 16, requires_grad=True)  # reentrant checkpoint needs an input that requires grad
    out = checkpoint(model, x, use_reentrant=reentrant)
    figure = handle.snapshot().activation
    out.sum().backward()  # the root's forward runs again, inside backward
    assert handle.snapshot().activation == figure
    assert all(p.grad is not None for p in model.parameters())


def test_no_grad_evaluation_keeps_the_last_training_figure() -> None:
    model = TiedNet()
    handle = track(model)
    x = batch()[0]
    model(x)
    trained = handle.snapshot().activation
    assert sum(trained) > 0
    with torch.no_grad():
        model(x)
    with torch.inference_mode():
        model(x)
    assert handle.snapshot().activation == trained


def test_autocast_bf16() -> None:
    model = TiedNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handle = track(model, opt)
    x, y = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
    fp32 = totals(handle)
    loss.backward()
    opt.step()
    assert fp32["activation"] > 0
    # Parameters stay fp32; the bf16 casts autocast saves for backward are activations.
    assert totals(handle)["parameter"] == unique_param_bytes(model)
    assert totals(handle)["gradient"] == unique_param_bytes(model)


@pytest.mark.parametrize(("convert", "factor"), [(lambda m: m.to(torch.float64), 2.0), (lambda m: m.half(), 0.5)])
def test_moved_or_converted_parameters_are_recounted(convert: Any, factor: float) -> None:
    model = TiedNet(None)
    handle = track(model)
    before = totals(handle)["parameter"]
    convert(model)
    dtype = next(model.parameters()).dtype
    outer = OuterCounter(model)
    with outer.hooks():
        model(batch()[0])  # the next forward sees the new storages
    assert totals(handle)["parameter"] == pytest.approx(before * factor)
    # the converted parameters are not mistaken for activations
    assert totals(handle)["activation"] == outer.bytes
    assert dtype in (torch.float64, torch.float16)


def compile_or_skip(model: nn.Module, backend: str) -> nn.Module:
    if not hasattr(torch, "compile"):
        pytest.skip("torch.compile is not available in this torch build")
    return torch.compile(model, backend=backend)  # type: ignore[return-value]


@pytest.mark.parametrize("style", ["wrapper", "in_place"])
def test_torch_compile_smoke(style: str) -> None:
    # aot_eager runs Dynamo and AOTAutograd (what decides the saved tensors) without code
    # generation, so the test stays a few seconds on CPU. Inductor: see the test below.
    torch._dynamo.reset()
    errors = hook_errors()
    model = Deep(2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if style == "wrapper":
        run = compile_or_skip(model, "aot_eager")
        handle = track(run, opt)
    else:
        model.compile(backend="aot_eager")
        run = model
        handle = track(model, opt)
    for _ in range(2):
        run(torch.randn(4, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
    got = totals(handle)
    assert got["parameter"] == unique_param_bytes(model)
    assert got["gradient"] == unique_param_bytes(model)
    assert got["activation"] > 0
    assert row(handle, "activation", ROOT_LABEL) == got["activation"]  # compiled: all in the root row
    assert hook_errors() == errors


@pytest.mark.skipif(
    os.environ.get("MEMEXPORTER_TEST_INDUCTOR") != "1",
    reason="inductor compiles C++ (20-60 s on a 2-core CPU box); set MEMEXPORTER_TEST_INDUCTOR=1 to run",
)
def test_torch_compile_inductor() -> None:
    torch._dynamo.reset()
    model = Deep(2)
    run = compile_or_skip(model, "inductor")
    handle = track(run)
    run(torch.randn(4, 16)).sum().backward()
    assert totals(handle)["activation"] > 0
    assert row(handle, "activation", ROOT_LABEL) == totals(handle)["activation"]
    assert totals(handle)["parameter"] == unique_param_bytes(model)


def test_parameters_moved_by_the_optimizer_step_are_recounted_at_that_step() -> None:
    class Rematerialising(torch.optim.Optimizer):
        """Stands in for optimizers that give parameters new storage in step() (offloading, ZeRO)."""

        def step(self, closure: Any = None) -> None:  # type: ignore[override]
            with torch.no_grad():
                for group in self.param_groups:
                    for p in group["params"]:
                        p.data = (p - group["lr"] * p.grad).double()

    model = Deep(1)
    opt = Rematerialising(model.parameters(), {"lr": 0.1})
    handle = track(model, opt)
    before = totals(handle)["parameter"]
    model(torch.randn(2, 16)).sum().backward()
    opt.step()  # no forward after it: the step hook itself must see the new storages
    assert totals(handle)["parameter"] == 2 * before == unique_param_bytes(model)
