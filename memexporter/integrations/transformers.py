"""memexporter as a Hugging Face ``TrainerCallback``::

    from memexporter.integrations.transformers import MemexporterCallback
    trainer = transformers.Trainer(..., callbacks=[MemexporterCallback(port=9400)])

Every rank starts its exporter (``port + LOCAL_RANK``) when the ``Trainer`` is built
(``on_init_end``), tracks the model, marks the phases and takes ``state.global_step`` as the step
count; the exporter stops in ``on_train_end`` unless it was running before. Needs ``transformers``.

transformers 5.24 behaviour this relies on (``transformers/trainer.py``, ``trainer_callback.py``):

- ``CallbackHandler.call_event`` calls every callback on every process; ``on_init_end`` comes
  near the end of ``Trainer.__init__``, with the model (``None`` under ``model_init``: then
  ``on_train_begin`` tracks it). The default ``DefaultFlowCallback`` comes first in the list, so
  the ``control`` flags it sets in ``on_step_end``/``on_epoch_end`` are set when ours runs.
- ``_run_epoch``: ``on_step_begin`` fires before the first micro-batch of an accumulation window,
  ``on_substep_end`` after each other one, and ``on_step_end`` after the optimizer step,
  ``zero_grad`` and ``global_step += 1``: ``train`` brackets one optimizer step, all its
  micro-batches included (unlike Lightning's, which is one batch).
- ``_maybe_log_save_evaluate`` runs after ``on_step_end`` (and ``on_epoch_end``): log, then
  ``_evaluate`` (``evaluate()`` ends with ``on_evaluate``), then ``_save_checkpoint`` and
  ``on_save``. So ``eval`` opens in ``on_step_end``/``on_epoch_end`` when ``control.should_evaluate``
  (or in ``on_train_begin`` with ``eval_on_start``) and closes in ``on_evaluate``;
  ``checkpoint`` opens after the evaluation (``on_evaluate``) or in ``on_step_end`` when there is
  none, and closes in ``on_save``.
- There is no begin signal for an ``evaluate()`` or ``predict()`` called outside ``train()``:
  the first ``on_prediction_step`` (after the first batch) opens the loop's phase, which then
  misses that batch; the ``evaluation_loop`` frame's ``description`` tells a prediction from an
  evaluation. ``predict()`` ends with ``on_predict``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from memexporter.integrations.session import Session, check_start_kwargs, import_framework

__all__ = ["MemexporterCallback"]

log = logging.getLogger("memexporter")

transformers = import_framework("transformers", (("transformers", "transformers"),))
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR  # noqa: E402  (after the friendly ImportError)


def _loop_phase() -> str:
    """``predict`` inside ``Trainer.predict()``, else ``eval``: read from the ``evaluation_loop``
    frame that called the callback handler (``description="Prediction"`` or ``"Evaluation"``)."""
    frame = sys._getframe(1)
    for _ in range(16):
        if frame.f_code.co_name == "evaluation_loop":
            return "predict" if frame.f_locals.get("description") == "Prediction" else "eval"
        if frame.f_back is None:
            break
        frame = frame.f_back
    return "eval"


def _any_rank(flag: bool, device: Any) -> bool:
    """``flag`` or'ed over the ranks of the default process group (one all-reduce)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flag
    t = torch.tensor([int(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


class MemexporterCallback(transformers.TrainerCallback):  # type: ignore[misc,name-defined]
    """Start memexporter on every rank and export the ``Trainer``'s phases and steps.

    ``port``: the base port (each rank adds its ``LOCAL_RANK``); ``start_kwargs``: any other
    ``memexporter.start()`` keyword (``memory_limit_bytes=``, ``addr=``...). Bad keywords raise
    here, when the callback is built; nothing raises into training afterwards.

    ``save_checkpoint_on_oom_risk=True``: when memexporter forecasts an OOM (``on_oom_risk``), set
    ``control.should_save`` at the next ``on_step_end``, so the ``Trainer`` saves its usual
    ``checkpoint-<step>`` in ``output_dir`` right after that step (``save_total_limit`` applies to
    it as to any other), once per risk episode. With several ranks, the ranks agree first (one
    all-reduce of one number per ``risk_sync_every_n_steps`` steps), since saving is collective.
    """

    risk_sync_every_n_steps = 20
    """Multi-rank runs with ``save_checkpoint_on_oom_risk``: steps between the ranks' agreements.
    Each agreement waits for the device (its answer is read on the host), so not every step: the
    OOM forecast looks minutes ahead, 20 steps are seconds."""

    def __init__(
        self, port: int | None = None, *, save_checkpoint_on_oom_risk: bool = False, **start_kwargs: Any
    ) -> None:
        check_start_kwargs(port, start_kwargs)
        self._session = Session("transformers", port, save_checkpoint_on_oom_risk, start_kwargs)
        self._training = False  # between on_train_begin and on_train_end

    # --- start and stop -------------------------------------------------------------------------

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        s = self._session
        with s.guard("on_init_end"):
            s.begin()
            s.track(kwargs.get("model"))

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        s = self._session
        with s.guard("on_train_begin"):
            s.close_all()  # left open by a train() that raised (the Trainer has no exception hook)
            s.begin()  # again after an earlier train(), or added after __init__
            s.track(kwargs.get("model"))
            self._training = True
            # A boundary at the start (global_step: 0, or a resumed run's) makes the step count the
            # Trainer's from the first optimizer step on: step() turns the optimizer hooks' counting off.
            s.step(state.global_step)
            if args.eval_on_start:
                s.open("eval")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._training = False
        self._session.end()

    # --- training steps ---------------------------------------------------------------------------

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        s = self._session
        with s.guard("on_step_begin"):
            self._settle()
            s.open("train")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        s = self._session
        with s.guard("on_step_end"):
            s.close("train")
            if s.step(state.global_step):
                self._save_on_risk(args, state, control)
            self._before_flow(control)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        with self._session.guard("on_epoch_end"):
            self._settle()
            self._before_flow(control)

    def _before_flow(self, control: Any) -> None:
        # _maybe_log_save_evaluate comes next: log, evaluate, save, in that order.
        if control.should_evaluate:
            self._session.open("eval")
        elif control.should_save:
            self._session.open("checkpoint")

    def _settle(self) -> None:
        # An eval or checkpoint phase opened for a loop that did not come (a callback after ours
        # turned the flag off): close it before the next step.
        self._session.close("eval")
        self._session.close("checkpoint")

    # --- evaluation, prediction, checkpoints ------------------------------------------------------

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        s = self._session
        with s.guard("on_prediction_step"):
            if "eval" not in s.phases and "predict" not in s.phases:
                # No begin signal: evaluate()/predict() outside train(), or the next dataset of a
                # dict of eval datasets (whose save, if any, comes after the last one).
                s.close("checkpoint")
                s.open(_loop_phase())

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        s = self._session
        with s.guard("on_evaluate"):
            if self._training and control.should_save:
                # _save_checkpoint follows once _evaluate returns. Opened before the eval closes:
                # no gap between the two out-of-step phases for a training-step sample to fall in.
                s.open("checkpoint")
            s.close("eval")

    def on_predict(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        with self._session.guard("on_predict"):
            self._session.close("predict")

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        with self._session.guard("on_save"):
            self._session.close("checkpoint")

    def _save_on_risk(self, args: Any, state: Any, control: Any) -> None:
        why = self._session.should_save(
            state.global_step,
            args.world_size,
            self.risk_sync_every_n_steps,
            lambda noted: _any_rank(noted, args.device),
        )
        if why is None:
            return
        where = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        log.warning("memexporter: %s: saving a checkpoint at step %s to %s", why, state.global_step, where)
        control.should_save = True
