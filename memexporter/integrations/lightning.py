"""memexporter as a Lightning callback::

    from memexporter.integrations.lightning import MemexporterCallback
    trainer = lightning.Trainer(callbacks=[MemexporterCallback(port=9400)])

Every rank starts its exporter (``port + LOCAL_RANK``) in ``setup``, tracks the
``LightningModule``, marks the phases, reports each training batch as the step's input
(``memexporter.step_input``; ``max_input_elements=`` declares the largest the data can bring) and
takes ``trainer.global_step`` as the step count; the exporter stops in ``teardown`` (or
``on_exception``) unless it was running before. Needs
``lightning`` (``lightning.pytorch``), or ``pytorch_lightning`` when only that is installed.

Lightning 2.6 behaviour this relies on (``lightning/pytorch/...``):

- Callback hooks run on every rank; ``setup`` is the first with the trainer and the module
  (``trainer/call.py`` ``_call_setup_hook``), before the sanity check and the strategy's set-up.
- An exception in ``fit``/``validate``/``test``/``predict`` calls ``on_exception`` and then the
  trainer's own ``_teardown()``, *not* the callbacks' ``teardown`` (``trainer/call.py``
  ``_call_and_handle_interrupt``): everything is released in both.
- ``on_train_batch_start``/``_end`` bracket one batch (a micro-batch under
  ``accumulate_grad_batches``); the optimizer step, if any, runs inside (``loops/
  training_epoch_loop.py`` ``advance``). Validation inside ``fit`` runs after ``on_train_batch_end``
  (``on_advance_end``); the sanity check is a validation loop too (``on_validation_start``/``_end``).
- ``ModelCheckpoint`` saves through ``trainer.save_checkpoint`` (``callbacks/model_checkpoint.py``
  ``_save_checkpoint``), which has no after-save hook: the callback wraps it on the trainer
  instance for the ``checkpoint`` phase, and unwraps it at the end. Checkpoint callbacks run after
  the others (the trainer reorders them), so a step's ``train`` phase is closed before one saves.
"""

from __future__ import annotations

import logging
from typing import Any

import memexporter
from memexporter.integrations.session import Session, check_start_kwargs, import_framework

__all__ = ["MemexporterCallback"]

log = logging.getLogger("memexporter")

pl = import_framework("lightning", (("lightning.pytorch", "lightning"), ("pytorch_lightning", "pytorch-lightning")))


class MemexporterCallback(pl.Callback):  # type: ignore[misc,name-defined]
    """Start memexporter on every rank and export the Lightning run's phases and steps.

    ``port``: the base port (each rank adds its ``LOCAL_RANK``); ``start_kwargs``: any other
    ``memexporter.start()`` keyword (``memory_limit_bytes=``, ``addr=``...). Bad keywords raise
    here, when the callback is built; nothing raises into training afterwards.

    ``save_checkpoint_on_oom_risk=True``: when memexporter forecasts an OOM (``on_oom_risk``), save
    a checkpoint with ``trainer.save_checkpoint`` at the next step boundary, as
    ``oom-risk-step=<N>.ckpt`` in the ``ModelCheckpoint``'s ``dirpath`` (else
    ``trainer.default_root_dir``), once per risk episode. With several ranks, the ranks agree
    first (``strategy.reduce_boolean_decision``: one all-reduce of one number per
    ``risk_sync_every_n_steps`` optimizer steps), since saving is a collective call.
    """

    risk_sync_every_n_steps = 20
    """Multi-rank runs with ``save_checkpoint_on_oom_risk``: steps between the ranks' agreements.
    Each agreement waits for the device (its answer is read on the host), so not every step: the
    OOM forecast looks minutes ahead, 20 steps are seconds."""

    def __init__(
        self, port: int | None = None, *, save_checkpoint_on_oom_risk: bool = False, **start_kwargs: Any
    ) -> None:
        super().__init__()
        check_start_kwargs(port, start_kwargs)
        self._session = Session("lightning", port, save_checkpoint_on_oom_risk, start_kwargs)
        self._saver: Any = None  # our wrapper of trainer.save_checkpoint, while installed

    # --- start and stop -------------------------------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        s = self._session
        with s.guard("setup"):
            s.begin()
            s.track(pl_module)
            self._wrap_save(trainer)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # A boundary at the start (global_step: 0, or where a resumed run starts) makes the step
        # count the trainer's from the first optimizer step on: step() turns the optimizer hooks'
        # counting off.
        with self._session.guard("on_train_start"):
            self._session.step(trainer.global_step)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._end(trainer, "teardown")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        # The callbacks' teardown does not run after an exception: release everything here.
        self._end(trainer, "on_exception")

    def _end(self, trainer: Any, hook: str) -> None:
        with self._session.guard(hook):
            self._unwrap_save(trainer)
        self._session.end()

    # --- training steps ---------------------------------------------------------------------------

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        with self._session.guard("on_train_batch_start"):
            self._session.open("train")
            # The step's input, from the batch the loop hands the module (shapes only): a LightningModule's
            # training_step may call a submodule with something else than the batch, or no tracked forward.
            memexporter.step_input(batch)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        s = self._session
        with s.guard("on_train_batch_end"):
            s.close("train")
            # global_step counts optimizer steps (one per accumulate_grad_batches micro-batches),
            # whatever the precision plugin did with the step.
            if s.step(trainer.global_step):
                self._save_on_risk(trainer)

    # --- evaluation loops -------------------------------------------------------------------------

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._loop("eval", True)  # the sanity check too

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._loop("eval", False)

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self._loop("test", True)

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self._loop("test", False)

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        self._loop("predict", True)

    def on_predict_end(self, trainer: Any, pl_module: Any) -> None:
        self._loop("predict", False)

    def _loop(self, phase: str, start: bool) -> None:
        s = self._session
        with s.guard(f"{phase} {'start' if start else 'end'}"):
            if start:
                s.open(phase)
            else:
                s.close(phase)

    # --- checkpoints ------------------------------------------------------------------------------

    def _wrap_save(self, trainer: Any) -> None:
        """Shadow ``trainer.save_checkpoint`` on the instance with one that marks ``checkpoint``."""
        if self._saver is not None and vars(trainer).get("save_checkpoint") is self._saver:
            return
        original = trainer.save_checkpoint
        session = self._session

        def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
            opened = False
            with session.guard("save_checkpoint"):
                if "checkpoint" not in session.phases:
                    session.open("checkpoint")
                    opened = True
            try:
                return original(*args, **kwargs)
            finally:
                if opened:
                    with session.guard("save_checkpoint"):
                        session.close("checkpoint")

        save_checkpoint.__wrapped__ = original  # type: ignore[attr-defined]
        trainer.save_checkpoint = save_checkpoint
        self._saver = save_checkpoint

    def _unwrap_save(self, trainer: Any) -> None:
        saver, self._saver = self._saver, None
        if saver is not None and vars(trainer).get("save_checkpoint") is saver:
            del trainer.save_checkpoint

    def _save_on_risk(self, trainer: Any) -> None:
        why = self._session.should_save(
            trainer.global_step,
            trainer.world_size,
            self.risk_sync_every_n_steps,
            lambda noted: bool(trainer.strategy.reduce_boolean_decision(noted, all=False)),
        )
        if why is None:
            return
        dirpath = getattr(trainer.checkpoint_callback, "dirpath", None) or trainer.default_root_dir
        path = f"{str(dirpath).rstrip('/')}/oom-risk-step={trainer.global_step}.ckpt"
        log.warning("memexporter: %s: saving a checkpoint at step %s to %s", why, trainer.global_step, path)
        trainer.save_checkpoint(path)
