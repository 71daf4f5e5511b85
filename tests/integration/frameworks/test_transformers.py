"""Per-module rows under the Hugging Face ``Trainer`` (issue 22): gradient accumulation, evaluation
between steps, tied embeddings, the optimizer wrapped by accelerate.

The ``Trainer`` prepares its optimizer with accelerate: ``kwargs["optimizer"]`` in a callback (and
``trainer.optimizer``) is an ``AcceleratedOptimizer`` around a torch ``AdamW`` (fused by default in
transformers 5). Under accumulation it calls ``optimizer.step()`` only at sync micro-batches (every
``gradient_accumulation_steps``-th, and the last of the epoch), then ``zero_grad``, then
``global_step += 1``: so the steps counter must equal ``trainer.state.global_step``.

What the rows must add up to is read from the live tensors in ``on_optimizer_step`` (after the
step, before ``zero_grad``), by element counts.
"""

from __future__ import annotations

import functools
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

pytestmark = [pytest.mark.integration]

# transformers is imported by the tests, not at collection (``hf()`` below): its import took 0.6 to 1.0
# CPU-s of each pytest worker's collection. Missing, the module still skips at collection.
if importlib.util.find_spec("transformers") is None:
    pytest.skip("needs transformers (pip install -e .[frameworks])", allow_module_level=True)
torch = pytest.importorskip("torch", reason="needs torch")

SEQ, VOCAB, BATCH = 16, 128, 4
TRAIN_ROWS, EVAL_ROWS = 44, 8  # 11 micro-batches an epoch: the last accumulation window is a single one
ACCUM, EPOCHS = 2, 2
DEPTH = 3  # the module_depth knob's default: transformer.h.0 is a row, its attn and mlp fold into it


class RandomTokens(torch.utils.data.Dataset):  # type: ignore[misc]
    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


@functools.cache
def hf() -> tuple[Any, Any]:
    """``transformers``, and the ``Record`` callback built on its ``TrainerCallback``, on first use."""
    transformers = pytest.importorskip("transformers", reason="needs transformers (pip install -e .[frameworks])")

    class Record(transformers.TrainerCallback):  # type: ignore[misc]
        """Counts the optimizer steps and reads what the rows should say after each; optionally tracks
        the model in ``on_train_begin`` with the optimizer the ``Trainer`` hands its callbacks."""

        def __init__(self, track_in_callback: bool) -> None:
            self.track_in_callback = track_in_callback
            self.handle: Any = None
            self.optimizer_type = ""
            self.steps = 0
            self.grads = self.state = 0
            self.params_with_state = 0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.optimizer_type = type(kwargs["optimizer"]).__name__
            if self.track_in_callback:
                self.handle = memexporter.track(kwargs["model"], kwargs["optimizer"])

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            model, opt = kwargs["model"], kwargs["optimizer"]
            inner = getattr(opt, "optimizer", opt)
            self.steps += 1
            self.grads = grad_bytes(model)
            self.state = state_bytes(model, inner)
            self.params_with_state = sum(1 for p in model.parameters() if inner.state.get(p))

    return transformers, Record


def tiny_gpt2() -> Any:
    transformers, _ = hf()
    cfg = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=VOCAB,
        n_positions=32,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    assert model.lm_head.weight is model.transformer.wte.weight, "the embedding is not tied to the LM head"
    return model


def train(tmp_path: Path, model: Any, callback: Any, optimizer: Any = None) -> Any:
    transformers, _ = hf()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "trainer"),
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        gradient_accumulation_steps=ACCUM,
        num_train_epochs=EPOCHS,
        eval_strategy="steps",
        eval_steps=2,
        logging_strategy="no",
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=RandomTokens(TRAIN_ROWS, 1),
        eval_dataset=RandomTokens(EVAL_ROWS, 2),
        callbacks=[callback],
        optimizers=(optimizer, None),
    )
    trainer.train()
    return trainer


HOW = ["start_model", "track_before_no_optimizer", "track_before_own_optimizer", "callback_wrapped_optimizer"]


@pytest.mark.parametrize("how", HOW)
def test_trainer_rows_partition_the_model(
    tmp_path: Path, start_exporter: Callable[..., Any], errors_before: int, how: str
) -> None:
    """``start(model=...)``, ``track(model)`` before ``train()`` (no optimizer yet: the global step
    hook finds it), ``track(model, opt)`` before ``train()`` with the AdamW handed to the ``Trainer``
    (``optimizers=(opt, None)``; it wraps it later) and ``track(model, kwargs["optimizer"])`` in
    ``on_train_begin`` (accelerate's wrapper) all give: steps == ``global_step``; each family summed over ``module`` == the model's
    bytes; the tied weight once, in the embedding's row; activation rows nonzero."""
    _, Record = hf()
    model = tiny_gpt2()
    callback = Record(track_in_callback=how == "callback_wrapped_optimizer")
    exp = start_exporter(model=model) if how == "start_model" else start_exporter()
    own = torch.optim.AdamW(model.parameters(), lr=5e-5) if how == "track_before_own_optimizer" else None
    if how == "track_before_no_optimizer":
        memexporter.track(model)  # removed by the fixture
    elif own is not None:
        memexporter.track(model, own)

    trainer = train(tmp_path, model, callback, own)
    got = scrape(exp.url)

    assert callback.optimizer_type == "AcceleratedOptimizer", callback.optimizer_type
    if how == "callback_wrapped_optimizer":
        assert callback.handle is not None
    state = trainer.state
    # Accumulation: 11 micro-batches an epoch, a step every 2nd and at the epoch's last one.
    assert state.global_step == EPOCHS * math.ceil(TRAIN_ROWS // BATCH / ACCUM), state.global_step
    assert callback.steps == state.global_step, (callback.steps, state.global_step)
    assert got.steps == state.global_step, f"memexporter_steps_total {got.steps}, global_step {state.global_step}"
    check_common(got, errors_before)

    params = param_bytes(model)
    assert got.total("parameter") == params, (got.rows["parameter"], params)
    assert callback.grads == params  # every parameter has a gradient at each step
    assert got.total("gradient") == callback.grads, got.rows["gradient"]
    assert got.total("optimizer_state") == callback.state, got.rows["optimizer_state"]
    n_params = sum(1 for _ in model.parameters())
    assert callback.params_with_state == n_params
    adamw = 2 * params + ADAMW_STEP_BYTES * n_params
    assert abs(got.total("optimizer_state") - adamw) <= 0.001 * adamw, (got.total("optimizer_state"), adamw)

    # Rows by their own names: each parameter in the module that registers it first.
    held = {k: v for k, v in got.rows["parameter"].items() if v}
    assert held == to_depth(own_param_rows(model), DEPTH), held
    wte = model.transformer.wte.weight
    assert got.rows["parameter"]["transformer.wte"] == wte.numel() * wte.element_size()  # tied: counted here
    assert got.rows["parameter"].get("lm_head", 0) == 0  # ... and not again in the head
    assert got.rows["gradient"].get("lm_head", 0) == 0
    assert got.rows["optimizer_state"].get("lm_head", 0) == 0

    acts = got.rows["activation"]
    assert got.total("activation") > 0, acts
    for block in ("transformer.h.0", "transformer.h.1"):
        assert acts.get(block, 0) > 0, acts
