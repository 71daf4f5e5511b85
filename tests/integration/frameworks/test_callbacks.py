"""The framework callbacks (issue 23): ``memexporter.integrations.lightning`` and ``.transformers``
under real ``Trainer`` runs on CPU.

What is asserted here, from ``/metrics`` read during and after the runs:

- the step count is the trainer's global step under gradient accumulation;
- each validation/evaluation loop (Lightning's sanity check included), each checkpoint save and
  each training batch (Lightning) or optimizer step (HF) is one completed phase;
- an evaluation that holds a known 64 MiB buffer has a phase peak that much above the training
  phase's (RSS-based: ``ru_maxrss`` when the evaluation sets a new lifetime high, else samples),
  and the training steps after it report their own peak, not the evaluation's (the issue's bug);
  in a worker whose heap holds freed, resident pages (``worn_heap``), as a worker that ran other
  tests does: the buffer is in pages new to the process (``callback_trainers.ones``), since one
  from the C heap would reuse those pages and raise the RSS by nothing (issue 40);
- ``import memexporter`` imports no framework.

Beside it: a port that cannot be bound, or a memexporter function that raises, never stops training
(test_callbacks_never_raise.py); ``save_checkpoint_on_oom_risk`` writes a checkpoint before a leaking
run reaches its limit, and never in a healthy run (test_callbacks_oom_risk.py); the loops outside
training and an exception (test_callbacks_loops.py). The runs they share (data, models, trainers):
tests/support/callback_trainers.py; the ``clean`` fixture: conftest.py.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import memexporter
from memexporter import exporter as mx_exporter
from memexporter.tracking.modules import active_handles, hook_errors
from tests.support.callback_trainers import (
    BATCH,
    D_IN,
    D_OUT,
    HF_ACCUM,
    HF_EPOCHS,
    HF_EVAL_EVERY,
    HF_EVAL_ROWS,
    HF_SAVE_EVERY,
    HF_TRAIN_ROWS,
    L_ACCUM,
    L_EPOCHS,
    L_SAVE_EVERY,
    L_TRAIN_ROWS,
    L_VAL_EVERY,
    L_VAL_ROWS,
    MARKS,
    SEQ,
    MiB,
    hf_args,
    hf_dataset,
    l_loader,
    l_trainer,
    lightning,
    make_module,
    ones,
    tiny_gpt2,
    transformers,
)
from tests.support.frameworks import Samples, read_samples
from tests.support.ports import free_port

pytestmark = MARKS

EVAL_EXTRA = 64 * MiB  # held by every evaluation loop, allocated with torch.ones: resident pages


def check_phases_and_peaks(got: Samples, steps: list[tuple[int, bool, Samples]], evaluation: str) -> None:
    """After a run: no phase left open; the last evaluation peaked EVAL_EXTRA above the last
    training step (within 5 %); and, the issue's headline, every step's peak (``steps``: global
    step, whether it came right after ``evaluation``, the scrape then) stays near the first
    step's, never at the evaluation's high-water mark."""
    for phase in ("train", "eval", "checkpoint"):
        assert got.need("memexporter_phase_active", phase=phase) == 0, phase

    eval_peak = got.need("memexporter_phase_peak_bytes", phase="eval", device="cpu")
    train_peak = got.need("memexporter_phase_peak_bytes", phase="train", device="cpu")
    print(
        f"eval peak {eval_peak / MiB:.1f} MiB, train peak {train_peak / MiB:.1f} MiB, "
        f"difference {(eval_peak - train_peak) / MiB:.2f} MiB"
    )
    assert EVAL_EXTRA * 0.95 <= eval_peak - train_peak <= EVAL_EXTRA * 1.05

    peaks = [(g, after, s.need("memexporter_memory_peak_bytes", device="cpu")) for g, after, s in steps]
    print("step peaks (MiB):", [(g, after, round(p / MiB, 1)) for g, after, p in peaks])
    assert sum(after for _, after, _ in peaks) >= 4, peaks
    first = peaks[0][2]  # before any evaluation (Lightning's sanity check aside)
    # A quarter of the evaluation's buffer: the CPU heap creeps by a few MiB over the first steps
    # (9.2 MiB by the HF Trainer's 4th step once, on a loaded 2-core box), the buffer is 64 MiB.
    for g, after, peak in peaks:
        assert peak <= first + EVAL_EXTRA / 4, (
            f"step {g}{f' right after {evaluation}' if after else ''}: "
            f"peak {peak / MiB:.1f} MiB, step 1's {first / MiB:.1f} MiB"
        )


# --- Lightning ----------------------------------------------------------------------------------


class LProbe:
    """Reads ``/metrics`` after each step boundary (its hooks run after the memexporter callback's)
    and once more in ``on_fit_end``, before the callbacks' ``teardown`` stops the exporter."""

    def __init__(self) -> None:
        self.url: str | None = None
        self.steps: list[tuple[int, bool, Samples]] = []  # (global step, first step after a validation, read)
        self.after_validation = False
        self.last_step = 0
        self.final: Samples | None = None
        self.running_during_fit: Any = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        exp = mx_exporter.running()
        self.running_during_fit = exp
        self.url = exp.url if exp is not None else None

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step != self.last_step and self.url:
            self.last_step = trainer.global_step
            self.steps.append((trainer.global_step, self.after_validation, read_samples(self.url)))
            self.after_validation = False

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self.after_validation = True

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.url:
            self.final = read_samples(self.url)


def lightning_probe(L: Any) -> Any:
    return type("Probe", (LProbe, L.Callback), {})()


def test_lightning_callback_steps_phases_and_peaks(tmp_path: Path, clean: None, worn_heap: None) -> None:
    """``accumulate_grad_batches=2``, validation every 4 batches, ``ModelCheckpoint`` every 4
    steps: steps == ``global_step`` at every boundary; eval phases == validation loops (the
    sanity check is one); train phases == batches; checkpoint phases == files written; the eval
    peak is the 64 MiB buffer above the train peak; the step after a validation is back at the
    pre-validation peak; the callback's exporter and model handle are gone after ``fit``."""
    L = lightning()
    from memexporter.integrations.lightning import MemexporterCallback

    module = make_module(L, eval_extra=EVAL_EXTRA)
    probe = lightning_probe(L)
    ckpt_dir = tmp_path / "ckpt"
    saver = L.pytorch.callbacks.ModelCheckpoint(dirpath=str(ckpt_dir), every_n_train_steps=L_SAVE_EVERY, save_top_k=-1)
    callback = MemexporterCallback(port=free_port(), addr="127.0.0.1")
    trainer = l_trainer(
        L,
        tmp_path,
        [callback, probe, saver],
        accumulate_grad_batches=L_ACCUM,
        val_check_interval=L_VAL_EVERY,
        enable_checkpointing=True,
    )
    errors = hook_errors()
    trainer.fit(module, l_loader(L_TRAIN_ROWS, 1), l_loader(L_VAL_ROWS, 2))

    batches = L_EPOCHS * L_TRAIN_ROWS // BATCH
    assert trainer.global_step == L_EPOCHS * math.ceil(L_TRAIN_ROWS // BATCH / L_ACCUM)
    assert probe.running_during_fit is not None, "the callback started no exporter"
    assert mx_exporter.running() is None, "the exporter the callback started still runs after fit()"
    assert not active_handles(), "the callback left its model handle"
    got = probe.final
    assert got is not None
    assert hook_errors() == errors

    # Steps: the trainer's global step at every boundary, and at the end.
    assert [int(s.need("memexporter_steps_total")) for _, _, s in probe.steps] == [g for g, _, _ in probe.steps]
    assert got.need("memexporter_steps_total") == trainer.global_step
    # The step's input: the batch the callback is handed, [x (4 x 16), y (4 x 4)]; its length, x's dim 1.
    assert got.need("memexporter_step_input_elements_max") == BATCH * (D_IN + D_OUT)
    assert got.need("memexporter_step_input_max_length") == D_IN

    # Phases: the sanity check plus 3 validations an epoch (batches 4, 8, 12).
    assert module.val_loops == 1 + L_EPOCHS * (L_TRAIN_ROWS // BATCH // L_VAL_EVERY)
    assert got.need("memexporter_phase_completed_total", phase="eval") == module.val_loops
    assert got.need("memexporter_phase_completed_total", phase="train") == batches
    saved = sorted(ckpt_dir.glob("*.ckpt"))
    assert len(saved) == trainer.global_step // L_SAVE_EVERY, saved
    assert got.need("memexporter_phase_completed_total", phase="checkpoint") == len(saved)
    check_phases_and_peaks(got, probe.steps, "a validation")


# --- Hugging Face ---------------------------------------------------------------------------------


class HFProbe:
    """Counts evaluations and saves, and reads ``/metrics`` after each step (listed after the
    memexporter callback) and in ``on_train_end`` (listed before it: the callback stops there)."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self.evaluations = self.saves = 0
        self.steps: list[tuple[int, bool, Samples]] = []
        self.after_eval = False

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.url:
            self.steps.append((state.global_step, self.after_eval, read_samples(self.url)))
        self.after_eval = False

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.evaluations += 1
        self.after_eval = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.saves += 1


def hf_probe(T: Any, url: str | None) -> Any:
    return type("Probe", (HFProbe, T.TrainerCallback), {})(url)


def test_transformers_callback_steps_phases_and_peaks(tmp_path: Path, clean: None, worn_heap: None) -> None:
    """``gradient_accumulation_steps=2``, evaluation every 2 steps, a save every 3, the exporter
    started by the user (the callback adopts it and leaves it running): steps ==
    ``state.global_step``; eval phases == evaluations; checkpoint phases == saves == checkpoint
    folders; train phases == optimizer steps; an evaluation whose model forward holds 64 MiB
    until ``on_evaluate`` peaks that much above a training step; the steps after it do not."""
    T = transformers()
    from memexporter.integrations.transformers import MemexporterCallback

    exp = memexporter.start(port=0, addr="127.0.0.1")
    assert exp.url is not None
    model = tiny_gpt2(T)
    held: list[Any] = []

    def hold_in_eval(module: Any, args: Any) -> None:
        if not module.training and not held:
            held.append(ones(EVAL_EXTRA))  # an eval-only cache, alive for the whole loop

    model.register_forward_pre_hook(hold_in_eval)

    class DropHeld(T.TrainerCallback):  # type: ignore[misc,name-defined]
        def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            held.clear()  # after the memexporter callback's on_evaluate (the list's order)

    probe = hf_probe(T, exp.url)
    args = hf_args(
        T,
        tmp_path,
        gradient_accumulation_steps=HF_ACCUM,
        eval_strategy="steps",
        eval_steps=HF_EVAL_EVERY,
        save_strategy="steps",
        save_steps=HF_SAVE_EVERY,
    )
    trainer = T.Trainer(
        model=model,
        args=args,
        train_dataset=hf_dataset(HF_TRAIN_ROWS, 1),
        eval_dataset=hf_dataset(HF_EVAL_ROWS, 2),
        callbacks=[MemexporterCallback(), probe, DropHeld()],
    )
    errors = hook_errors()
    trainer.train()
    got = read_samples(exp.url)

    state = trainer.state
    assert state.global_step == HF_EPOCHS * HF_TRAIN_ROWS // BATCH // HF_ACCUM
    assert mx_exporter.running() is exp, "the callback stopped an exporter it did not start"
    assert not active_handles(), "the callback left its model handle"
    assert hook_errors() == errors

    assert [int(s.need("memexporter_steps_total")) for _, _, s in probe.steps] == [g for g, _, _ in probe.steps]
    assert got.need("memexporter_steps_total") == state.global_step
    # The step's input, from the tracked model's forward: model(input_ids=, labels=), each 4 x 16, and the
    # Trainer's num_items_in_batch, a 0-d tensor in recent transformers (one element).
    assert got.need("memexporter_step_input_elements_max") in (2 * BATCH * SEQ, 2 * BATCH * SEQ + 1)
    assert got.need("memexporter_step_input_max_length") == SEQ
    assert got.need("memexporter_phase_completed_total", phase="train") == state.global_step
    assert probe.evaluations == state.global_step // HF_EVAL_EVERY
    assert got.need("memexporter_phase_completed_total", phase="eval") == probe.evaluations
    folders = sorted((tmp_path / "out").glob("checkpoint-*"))
    assert probe.saves == len(folders) == state.global_step // HF_SAVE_EVERY, folders
    assert got.need("memexporter_phase_completed_total", phase="checkpoint") == probe.saves
    check_phases_and_peaks(got, probe.steps, "an evaluation")


# --- Import-light ---------------------------------------------------------------------------------


def test_import_memexporter_imports_no_framework() -> None:
    """``import memexporter`` (and ``memexporter.integrations``) never imports a framework."""
    code = (
        "import memexporter, memexporter.integrations, sys; "
        "bad = sorted(m for m in ('lightning', 'pytorch_lightning', 'transformers', 'accelerate') if m in sys.modules); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize(
    ("module", "blocked", "says"),
    [
        ("lightning", ("lightning", "lightning.pytorch", "pytorch_lightning"), "pip install lightning"),
        ("transformers", ("transformers",), "pip install transformers"),
    ],
)
def test_missing_framework_says_what_to_install(module: str, blocked: tuple[str, ...], says: str) -> None:
    """Without the framework, importing its integration raises an ``ImportError`` naming the
    package and the ``frameworks`` extra."""
    code = (
        f"import sys; sys.modules.update(dict.fromkeys({blocked!r}))\n"
        f"try:\n    import memexporter.integrations.{module}\n"
        "except ImportError as e:\n    print(e)\nelse:\n    raise SystemExit('imported')"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, timeout=120, capture_output=True, text=True).stdout
    assert says in out and "memexporter[frameworks]" in out, out
