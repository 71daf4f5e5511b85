"""Per-module rows with accelerate (issue 22): ``Accelerator(gradient_accumulation_steps=2)`` and the
optimizer ``prepare()`` returns.

accelerate quirks these tests rely on (accelerate 1.15):

- ``prepare(optimizer)`` returns an ``AcceleratedOptimizer``: a ``torch.optim.Optimizer`` subclass
  that never runs ``Optimizer.__init__``, so it has no step hooks of its own and torch never
  patches its ``step``; ``.optimizer`` is the user's optimizer, whose ``step`` (hooked) it calls.
- Under ``accumulate()``, ``AcceleratedOptimizer.step()`` is a no-op unless ``sync_gradients``
  (every ``gradient_accumulation_steps``-th micro-batch, and the dataloader's last one); the
  real optimizer steps only then. So steps == the number of micro-batches with ``sync_gradients``.
- On one CPU process ``prepare(model)`` returns the model itself (no DDP wrapper).
"""

from __future__ import annotations

import functools
import importlib.util
import math
from collections.abc import Callable
from typing import Any

import pytest

import memexporter
from tests.support.frameworks import (
    ADAMW_STEP_BYTES,
    check_common,
    grad_bytes,
    own_param_rows,
    param_bytes,
    scrape,
    state_bytes,
)

pytestmark = [pytest.mark.integration]

# accelerate is imported by the test, not at collection (``accelerate()`` below): 0.05 to 0.1 CPU-s of
# each pytest worker's collection. Missing, the module still skips at collection.
if importlib.util.find_spec("accelerate") is None:
    pytest.skip("needs accelerate (pip install -e .[frameworks])", allow_module_level=True)
torch = pytest.importorskip("torch", reason="needs torch")
nn = torch.nn
F = torch.nn.functional

D_IN, D, D_OUT, BATCH = 16, 32, 4, 4
ROWS, ACCUM, EPOCHS = 44, 2, 2  # 11 micro-batches an epoch: the last window is a single one


@functools.cache
def accelerate() -> Any:
    """The ``accelerate`` package, on first use."""
    return pytest.importorskip("accelerate", reason="needs accelerate (pip install -e .[frameworks])")


def new_model() -> Any:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D_IN, D), nn.GELU(), nn.LayerNorm(D), nn.Linear(D, D_OUT))


@pytest.mark.parametrize("how", ["prepared_optimizer", "raw_optimizer", "no_optimizer_before_prepare"])
def test_accelerate_steps_and_partition(start_exporter: Callable[..., Any], errors_before: int, how: str) -> None:
    """``track(model, prepared_optimizer)`` (the ``AcceleratedOptimizer``) does not raise; so do the
    user's own optimizer and ``track(model)`` before ``prepare()``. Steps == the real optimizer
    steps (``sync_gradients`` micro-batches), each counted once; rows add up to the model."""
    model = new_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(ROWS, D_IN, generator=g), torch.randn(ROWS, D_OUT, generator=g))
    acc = accelerate().Accelerator(gradient_accumulation_steps=ACCUM, cpu=True)
    exp = start_exporter()
    if how == "no_optimizer_before_prepare":
        memexporter.track(model)  # removed by the fixture
    pmodel, popt, loader = acc.prepare(model, opt, torch.utils.data.DataLoader(data, batch_size=BATCH))
    assert type(popt).__name__ == "AcceleratedOptimizer" and popt.optimizer is opt
    if how == "prepared_optimizer":
        memexporter.track(pmodel, popt)
    elif how == "raw_optimizer":
        memexporter.track(pmodel, opt)

    syncs, grads, state = 0, 0, 0
    for _ in range(EPOCHS):
        for x, y in loader:
            with acc.accumulate(pmodel):
                acc.backward(F.mse_loss(pmodel(x), y))
                popt.step()
                if acc.sync_gradients:
                    syncs += 1
                    grads, state = grad_bytes(model), state_bytes(model, opt)
                popt.zero_grad()
    got = scrape(exp.url)

    assert syncs == EPOCHS * math.ceil(ROWS // BATCH / ACCUM), syncs
    first = next(iter(model.parameters()))
    assert int(opt.state[first]["step"]) == syncs  # the torch optimizer stepped exactly at the syncs
    assert got.steps == syncs, f"memexporter_steps_total {got.steps}, optimizer steps {syncs}"
    check_common(got, errors_before)

    params = param_bytes(model)
    n_params = sum(1 for _ in model.parameters())
    assert got.total("parameter") == params, got.rows["parameter"]
    assert grads == params
    assert got.total("gradient") == grads, got.rows["gradient"]
    assert state == 2 * params + ADAMW_STEP_BYTES * n_params
    assert got.total("optimizer_state") == state, got.rows["optimizer_state"]
    assert {k: v for k, v in got.rows["parameter"].items() if v} == own_param_rows(model)
    assert got.total("activation") > 0, got.rows["activation"]
