"""What the rows add up to, measured on real CPU models: the partition of parameters, gradients
and optimizer state, the activation figure against an outer saved-tensors hook, a module called
twice, and the depth and row caps keeping the totals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from memexporter.tracking.modules import ROOT_LABEL, track
from memexporter.tracking.snapshots import fold
from tests.support.models import (
    Block,
    D,
    Deep,
    OuterCounter,
    TiedNet,
    V,
    batch,
    row,
    totals,
    train_step,
    unique_param_bytes,
)


@pytest.mark.parametrize("reentrant", [False, True])
def test_rows_partition_parameters_gradients_and_adamw_state(reentrant: bool) -> None:
    torch.manual_seed(0)
    model = TiedNet(reentrant)
    opt = torch.optim.AdamW(model.parameters())
    handle = track(model, opt)
    for _ in range(2):
        train_step(model, opt, batch())
    expected = unique_param_bytes(model)
    got = totals(handle)
    assert got["parameter"] == pytest.approx(expected, rel=1e-3)
    assert got["gradient"] == pytest.approx(expected, rel=1e-3)
    # exp_avg + exp_avg_sq per parameter (+ a 4-byte step tensor each: far below 0.1 %)
    assert got["optimizer_state"] == pytest.approx(2 * expected, rel=1e-3)
    # The tied weight is counted once, in the row of its first owner.
    assert row(handle, "parameter", "emb") == V * D * 4
    assert row(handle, "parameter", "head") == 0
    assert row(handle, "parameter", ROOT_LABEL) == D * 4  # the root's direct parameter
    # The exported rows (after folding) add up to the same totals.
    folded = fold(handle.snapshot())
    assert sum(v[0] for _, v in folded) == got["parameter"]
    assert sum(v[2] for _, v in folded) == got["optimizer_state"]


@pytest.mark.parametrize("reentrant", [False, True, None])
def test_activations_match_an_outer_saved_tensors_hook(reentrant: bool | None) -> None:
    torch.manual_seed(0)
    model = TiedNet(reentrant)
    x, y = batch()
    baseline = OuterCounter(model)  # what the same forward saves without tracking
    with baseline.hooks():
        out = model(x)
    F.cross_entropy(out.flatten(0, 1), y.flatten()).backward()
    handle = track(model, torch.optim.SGD(model.parameters(), lr=0.1))
    outer = OuterCounter(model)
    with outer.hooks():
        out = model(x)
    ours = totals(handle)["activation"]
    # The loss is outside the model's forward: the outer hook sees the same forward only.
    assert outer.bytes > 0
    # Both count each storage saved for backward once, parameters excluded: exactly the same bytes
    # (a tolerance would hide a storage counted twice).
    assert ours == outer.bytes == baseline.bytes
    out.sum().backward()  # the chain unpacks through the outer pair
    assert outer.unpacks == outer.packs


def test_module_called_twice_counts_both_calls_and_its_parameters_once() -> None:
    model = TiedNet(None)
    handle = track(model)
    model(batch()[0])
    once = Block()
    h2 = track(once, prefix="single")
    once(torch.randn(4, 32, D))
    # gelu saves fc1's output on every call: two calls, two distinct storages
    assert row(handle, "activation", "shared") == 2 * row(h2, "activation", "single")
    assert row(handle, "parameter", "shared.fc1") == row(h2, "parameter", "single.fc1")


@pytest.mark.parametrize(("depth", "max_modules"), [(1, 100), (2, 5), (3, 7), (3, 100), (5, 1)])
def test_depth_and_max_modules_keep_totals(depth: int, max_modules: int) -> None:
    model = Deep()
    opt = torch.optim.Adam(model.parameters())
    full = track(model, opt, depth=8, max_modules=1000)
    data = torch.randn(2, 5, 16)
    model(data).sum().backward()
    opt.step()
    full_totals = [sum(col) for col in zip(*(v for _, v in fold(full.snapshot())), strict=True)]
    full.remove()
    handle = track(model, opt, depth=depth, max_modules=max_modules)
    model(data).sum().backward()
    opt.step()
    rows = fold(handle.snapshot())
    assert len(rows) <= max_modules + 1
    assert all(name.count(".") < depth for name, _ in rows)
    assert [sum(col) for col in zip(*(v for _, v in rows), strict=True)] == pytest.approx(full_totals, rel=1e-9)


def test_each_save_goes_to_the_innermost_running_module() -> None:
    # Block: x + fc2(gelu(fc1(ln(x)))). gelu runs in Block.forward itself, between its children:
    # its saved input (fc1's output) is the Block's own row; fc2 saves its input (gelu's output).
    # Weights are parameters, never activations.
    block = Block()
    handle = track(block, prefix="b", depth=1)
    block(torch.randn(4, 32, D))
    wide = 4 * 32 * 4 * D * 4  # float32 bytes of a (4, 32, 4D) tensor
    assert row(handle, "activation", "b") == wide
    assert row(handle, "activation", "b.fc2") == wide
    assert row(handle, "activation", "b.fc1") == 4 * 32 * D * 4  # ln's output


class Reuse(nn.Module):
    """Saves storages more than once per forward, and calls itself: tanh saves its output, which
    the next call's Linear saves again as its input, and ``h * h`` saves ``h`` twice, in every
    call after the inner call has returned."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(D, D)

    def forward(self, x: torch.Tensor, calls: int = 3) -> torch.Tensor:
        h = torch.tanh(self.fc(x))
        if calls > 1:
            h = self(h, calls - 1)
        return h * h


def test_a_storage_saved_twice_counts_once_also_across_nested_calls_of_the_root() -> None:
    model = Reuse()
    handle = track(model)
    outer = OuterCounter(model)
    with outer.hooks():
        model(torch.randn(4, 32, D))
    assert outer.activation_packs > len(outer.seen), "the model should save some storage twice"
    assert totals(handle)["activation"] == outer.bytes
    assert torch._C._autograd._top_saved_tensors_default_hooks(True) is None  # nothing left pushed
