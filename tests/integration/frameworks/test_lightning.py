"""Per-module rows under the Lightning ``Trainer`` (issue 22): gradient accumulation, validation,
and a ``LightningModule`` whose ``training_step`` calls ``self.net(x)``, never ``self(x)``.

Lightning quirks these tests rely on (lightning 2.6):

- ``trainer.optimizers[0]`` is the user's torch optimizer; ``pl_module.optimizers()`` is a
  ``LightningOptimizer``: an instance of a class made on the fly, ``Lightning<AdamW>``, subclassing
  both ``LightningOptimizer`` and the optimizer's class (so ``isinstance(o, torch.optim.Optimizer)``
  holds) without running ``Optimizer.__init__``; ``.optimizer`` is the torch one. Its ``step()``
  calls the torch optimizer's ``step(closure)``, whose hooks fire once.
- Automatic optimization passes the training step as the closure of ``optimizer.step()``: the
  forward and backward of a sync micro-batch run *inside* the step, between torch's step pre- and
  post-hooks. Micro-batches that only accumulate call the closure directly, with no step.
- ``trainer.global_step`` counts optimizer steps: one per ``accumulate_grad_batches`` micro-batches
  and one at the epoch's last micro-batch. ``zero_grad`` runs at the start of the next window, so
  ``.grad`` is still there at ``on_train_batch_end`` of a step.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
from collections.abc import Callable
from pathlib import Path
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
    to_depth,
)

pytestmark = [
    pytest.mark.integration,
    # lightning 2.6 on torch 2.13: lightning's own pytree helper uses a deprecated torch name. Not ours.
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
]

# Lightning is imported by the tests, not at collection (``lightning()`` below): its import took
# 3.6 CPU-s, most of a pytest worker's collection, in each of the six workers of a parallel run.
if importlib.util.find_spec("lightning") is None:
    pytest.skip("needs lightning (pip install -e .[frameworks])", allow_module_level=True)
torch = pytest.importorskip("torch", reason="needs torch")
nn = torch.nn
F = torch.nn.functional

D_IN, D, D_OUT, BATCH = 16, 32, 4, 4
TRAIN_ROWS, VAL_ROWS = 44, 8  # 11 micro-batches an epoch
ACCUM, EPOCHS = 2, 2
DEPTH = 3  # the module_depth knob's default: net.blocks.0 is a row, its fc1/fc2 fold into it


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x: Any) -> Any:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(D_IN, D)
        self.blocks = nn.Sequential(Block(D), Block(D))
        self.head = nn.Linear(D, D_OUT)

    def forward(self, x: Any) -> Any:
        return self.head(self.blocks(self.inp(x)))


@functools.cache
def lightning() -> tuple[Any, Any, Any]:
    """``lightning``, and the ``Regressor`` module and ``Record`` callback built on its classes, on first use."""
    L = importlib.import_module("lightning")

    class Regressor(L.LightningModule):  # type: ignore[misc]
        """Lightning's documented style: the steps call ``self.net``; ``forward`` is never defined."""

        def __init__(self) -> None:
            super().__init__()
            self.net = Net()

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return F.mse_loss(self.net(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", F.mse_loss(self.net(x), y))

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class Record(L.Callback):  # type: ignore[misc]
        """Tracks the module in ``on_train_start`` (the optimizers exist there) with the optimizer
        ``how`` names; counts the optimizer steps and reads what the rows should say after each."""

        def __init__(self, how: str) -> None:
            self.how = how
            self.handle: Any = None
            self.wrapper_type = ""
            self.steps = 0
            self.seen_step = 0
            self.grads = self.state = 0

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.wrapper_type = type(pl_module.optimizers()).__name__
            if self.how == "trainer_optimizer":
                self.handle = memexporter.track(pl_module, trainer.optimizers[0])
            elif self.how == "lightning_optimizer":
                self.handle = memexporter.track(pl_module, pl_module.optimizers())

        def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
            self.steps += 1

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if trainer.global_step != self.seen_step:  # this micro-batch stepped: .grad is still there
                self.seen_step = trainer.global_step
                self.grads = grad_bytes(pl_module)
                self.state = state_bytes(pl_module, trainer.optimizers[0])

    return L, Regressor, Record


def loader(n: int, seed: int) -> Any:
    g = torch.Generator().manual_seed(seed)
    data = torch.utils.data.TensorDataset(torch.randn(n, D_IN, generator=g), torch.randn(n, D_OUT, generator=g))
    return torch.utils.data.DataLoader(data, batch_size=BATCH)


@pytest.mark.parametrize("how", ["trainer_optimizer", "lightning_optimizer", "track_before_fit_no_optimizer"])
def test_lightning_rows_partition_the_model(
    tmp_path: Path, start_exporter: Callable[..., Any], errors_before: int, how: str
) -> None:
    """steps == ``trainer.global_step``; parameters, gradients and AdamW state summed over rows ==
    the module's; activation rows nonzero although the root's forward never runs (entries through
    ``net``); no hook error. Tracked with ``trainer.optimizers[0]``, with the ``LightningOptimizer``,
    or before ``fit()`` with no optimizer (the global step hook finds it)."""
    L, Regressor, Record = lightning()
    torch.manual_seed(0)
    module = Regressor()
    exp = start_exporter()
    if how == "track_before_fit_no_optimizer":
        memexporter.track(module)  # removed by the fixture
    callback = Record(how)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=EPOCHS,
        accumulate_grad_batches=ACCUM,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        callbacks=[callback],
    )
    trainer.fit(module, loader(TRAIN_ROWS, 1), loader(VAL_ROWS, 2))
    got = scrape(exp.url)

    assert callback.wrapper_type == "LightningAdamW", callback.wrapper_type
    if how != "track_before_fit_no_optimizer":
        assert callback.handle is not None
    assert trainer.global_step == EPOCHS * math.ceil(TRAIN_ROWS // BATCH / ACCUM), trainer.global_step
    assert callback.steps == trainer.global_step
    assert got.steps == trainer.global_step, f"memexporter_steps_total {got.steps}, global_step {trainer.global_step}"
    check_common(got, errors_before)

    params = param_bytes(module)
    n_params = sum(1 for _ in module.parameters())
    assert got.total("parameter") == params, got.rows["parameter"]
    assert callback.grads == params
    assert got.total("gradient") == callback.grads, got.rows["gradient"]
    assert got.total("optimizer_state") == callback.state, got.rows["optimizer_state"]
    assert callback.state == 2 * params + ADAMW_STEP_BYTES * n_params
    held = {k: v for k, v in got.rows["parameter"].items() if v}
    assert held == to_depth(own_param_rows(module), DEPTH), held

    acts = got.rows["activation"]
    for row in ("net.inp", "net.blocks.0", "net.blocks.1", "net.head"):
        assert acts.get(row, 0) > 0, f"no activation bytes in {row}: {acts}"
