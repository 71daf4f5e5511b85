"""The OOM-risk checkpoint of the framework callbacks (issue 23): ``save_checkpoint_on_oom_risk``
writes a loadable Lightning checkpoint before a leaking run reaches its limit, and never in a healthy
run; a risk noted during an HF ``Trainer`` run makes it save its usual checkpoint right after that
step. The runs: tests/support/callback_trainers.py; the callbacks' steps, phases and peaks:
test_callbacks.py."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from tests.support.callback_trainers import (
    BATCH,
    HF_TRAIN_ROWS,
    MARKS,
    MiB,
    hf_args,
    hf_dataset,
    l_loader,
    l_trainer,
    lightning,
    make_module,
    rss,
    settled_rss,
    tiny_gpt2,
    transformers,
)

pytestmark = MARKS

torch = pytest.importorskip("torch", reason="needs torch")

# The risk is judged once a second; its forecast needs the leak rate, which needs 5 s and 32 steps
# after the warm-up (memexporter/oom/window.py): at 20 steps a second, about step 130 and 6.5 s. The budget
# gives the leak 192 steps (~10 s) to the simulated OOM. The 97 % "headroom" judgement alone would
# come too late here: 3 % of the budget is under a second of this leak.
LEAK = 1 * MiB  # kept for good at every batch (Lightning: one batch is one step here)
HEADROOM = 192 * MiB  # the budget above the RSS at the start
RISK_STEP_S = 0.05  # seconds a batch
HEALTHY_STEPS = 160  # a healthy run as long as the leaking one takes to its risk


class SimulatedOom:
    """Stops the run when the RSS passes the budget (the OOM this test stands in for), noting the
    step and the oom-risk checkpoints already written."""

    def __init__(self, limit: int, ckpt_dir: Path) -> None:
        self.limit, self.ckpt_dir = limit, ckpt_dir
        self.oom_step: int | None = None
        self.files_at_oom: list[Path] = []

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.oom_step is None and rss() > self.limit:
            self.oom_step = trainer.global_step
            self.files_at_oom = sorted(self.ckpt_dir.glob("oom-risk-*.ckpt"))
            trainer.should_stop = True


@pytest.mark.parametrize("leaking", [True, False], ids=["leaking", "healthy"])
def test_lightning_checkpoint_on_oom_risk(
    tmp_path: Path, clean: None, caplog: pytest.LogCaptureFixture, leaking: bool
) -> None:
    """``save_checkpoint_on_oom_risk=True`` with ``memory_limit_bytes`` 192 MiB above the RSS at the
    start. Leaking 1 MiB a step, the run writes ``oom-risk-step=<N>.ckpt`` (loadable, with the
    model's weights) into the ``ModelCheckpoint``'s folder, and logs why and where, before its RSS
    passes the budget. Without the leak, a run as long writes none."""
    L = lightning()
    from memexporter.integrations.lightning import MemexporterCallback

    ckpt_dir = tmp_path / "ckpt"
    module = make_module(L, leak=LEAK if leaking else 0, step_sleep=RISK_STEP_S)
    limit = settled_rss() + HEADROOM
    oom = type("Oom", (SimulatedOom, L.Callback), {})(limit, ckpt_dir)
    callback = MemexporterCallback(
        port=0, addr="127.0.0.1", save_checkpoint_on_oom_risk=True, memory_limit_bytes=limit, warmup_steps=0
    )
    saver = L.pytorch.callbacks.ModelCheckpoint(dirpath=str(ckpt_dir), save_top_k=0)  # only gives the folder
    max_steps = int(1.5 * HEADROOM / LEAK) if leaking else HEALTHY_STEPS
    trainer = l_trainer(
        L,
        tmp_path,
        [callback, oom, saver],
        max_steps=max_steps,
        max_epochs=-1,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        enable_checkpointing=True,
    )
    with caplog.at_level(logging.WARNING, logger="memexporter"):
        trainer.fit(module, l_loader(4 * BATCH, 1))
    written = sorted(ckpt_dir.glob("oom-risk-*.ckpt"))
    warnings = [r.getMessage() for r in caplog.records if "saving a checkpoint" in r.getMessage()]

    if not leaking:
        assert oom.oom_step is None
        assert trainer.global_step == max_steps
        assert written == [], written
        assert warnings == []
        return
    assert oom.oom_step is not None, f"the leak never passed the budget in {trainer.global_step} steps"
    assert len(oom.files_at_oom) == 1, f"no oom-risk checkpoint before the simulated OOM at step {oom.oom_step}"
    (path,) = oom.files_at_oom
    saved_at = int(path.stem.split("=")[1])
    print(f"oom-risk checkpoint at step {saved_at}, simulated OOM at step {oom.oom_step}")
    assert saved_at < oom.oom_step
    assert written == [path], "one checkpoint per risk episode"
    state = torch.load(path, weights_only=False)
    assert state["global_step"] == saved_at
    assert set(state["state_dict"]) == set(module.state_dict())
    assert len(warnings) == 1 and str(path) in warnings[0], warnings


def test_transformers_oom_risk_sets_should_save(tmp_path: Path, clean: None, caplog: pytest.LogCaptureFixture) -> None:
    """An OOM risk noted at step 3 (a risk function called by hand: the judgement itself is the
    Lightning test's) makes the ``Trainer`` save its usual ``checkpoint-3`` right after that step,
    with ``save_strategy="no"``, and the callback logs why and where; no other checkpoint."""
    T = transformers()
    from memexporter.integrations.transformers import MemexporterCallback
    from memexporter.oom import risk

    class RiskAtStep3(T.TrainerCallback):  # type: ignore[misc,name-defined]
        """Before the memexporter callback in the list: its on_step_end runs first."""

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 3:
                for fn in risk.registered():
                    fn(risk.OomRisk("cpu", 9e8, 9.5e8, 1e9, 60.0, "forecast", "step", 3))

    args = hf_args(T, tmp_path, num_train_epochs=1, gradient_accumulation_steps=2)
    callback = MemexporterCallback(port=0, addr="127.0.0.1", save_checkpoint_on_oom_risk=True)
    trainer = T.Trainer(
        model=tiny_gpt2(T), args=args, train_dataset=hf_dataset(HF_TRAIN_ROWS, 1), callbacks=[RiskAtStep3(), callback]
    )
    with caplog.at_level(logging.WARNING, logger="memexporter"):
        trainer.train()
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-3"]
    assert (out / "checkpoint-3" / "trainer_state.json").is_file()
    warnings = [r.getMessage() for r in caplog.records if "saving a checkpoint" in r.getMessage()]
    assert len(warnings) == 1 and str(out / "checkpoint-3") in warnings[0], warnings
    assert not risk.registered(), "the callback left its risk function registered"
