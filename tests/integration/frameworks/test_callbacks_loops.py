"""The framework callbacks outside ``fit``/``train`` (issue 23): Lightning's ``validate``, ``test``
and ``predict`` and the HF ``Trainer``'s ``evaluate`` and ``predict`` each give one completed phase; a
``training_step`` that raises leaves nothing behind; the ``pytorch_lightning`` ``Trainer`` takes the
callback too. The runs: tests/support/callback_trainers.py; the callbacks' steps, phases and peaks
during training: test_callbacks.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import memexporter
from memexporter import exporter as mx_exporter
from memexporter.tracking.modules import active_handles
from tests.support.callback_trainers import (
    BATCH,
    HF_EVAL_ROWS,
    L_TRAIN_ROWS,
    L_VAL_ROWS,
    MARKS,
    hf_args,
    hf_dataset,
    l_loader,
    l_trainer,
    lightning,
    make_module,
    tiny_gpt2,
    transformers,
)
from tests.support.frameworks import read_samples

pytestmark = MARKS


def test_lightning_test_and_predict_phases(tmp_path: Path, clean: None) -> None:
    """``trainer.validate``, ``.test`` and ``.predict`` each give one completed phase (``eval``,
    ``test``, ``predict``); with the exporter started by the user, the callback leaves it running."""
    L = lightning()
    from memexporter.integrations.lightning import MemexporterCallback

    exp = memexporter.start(port=0, addr="127.0.0.1")
    assert exp.url is not None
    module = make_module(L)
    module.test_step = module.validation_step
    module.predict_step = lambda batch, batch_idx: module.net(batch[0])
    trainer = l_trainer(L, tmp_path, [MemexporterCallback()])
    loader = l_loader(L_VAL_ROWS, 2)
    trainer.validate(module, loader, verbose=False)
    trainer.test(module, loader, verbose=False)
    trainer.predict(module, loader)
    got = read_samples(exp.url)
    assert mx_exporter.running() is exp
    assert not active_handles()
    for phase in ("eval", "test", "predict"):
        assert got.need("memexporter_phase_completed_total", phase=phase) == 1, phase
        assert got.need("memexporter_phase_active", phase=phase) == 0, phase


def test_transformers_evaluate_and_predict_outside_train(tmp_path: Path, clean: None) -> None:
    """``trainer.evaluate()`` and ``trainer.predict()`` without ``train()``: the exporter the
    callback started when the ``Trainer`` was built sees one ``eval`` and one ``predict`` phase."""
    T = transformers()
    from memexporter.integrations.transformers import MemexporterCallback

    trainer = T.Trainer(
        model=tiny_gpt2(T),
        args=hf_args(T, tmp_path),
        eval_dataset=hf_dataset(HF_EVAL_ROWS, 2),
        callbacks=[MemexporterCallback(port=0, addr="127.0.0.1")],
    )
    exp = mx_exporter.running()
    assert exp is not None and exp.url, "on_init_end started no exporter"
    trainer.evaluate()
    trainer.predict(hf_dataset(HF_EVAL_ROWS, 3))
    got = read_samples(exp.url)
    assert got.need("memexporter_phase_completed_total", phase="eval") == 1
    assert got.need("memexporter_phase_completed_total", phase="predict") == 1
    for phase in ("eval", "predict"):
        assert got.need("memexporter_phase_active", phase=phase) == 0, phase


def test_lightning_exception_releases_everything(tmp_path: Path, clean: None) -> None:
    """A ``training_step`` that raises: Lightning skips the callbacks' ``teardown`` and calls
    ``on_exception``, where the callback closes its phases, untracks, unwraps
    ``trainer.save_checkpoint`` and stops its exporter; the exception reaches the caller unchanged."""
    L = lightning()
    from memexporter.integrations.lightning import MemexporterCallback

    module = make_module(L)
    step = module.training_step

    def failing(batch: Any, batch_idx: int) -> Any:
        if batch_idx == 3:
            raise RuntimeError("out of memory (simulated)")
        return step(batch, batch_idx)

    module.training_step = failing
    trainer = l_trainer(L, tmp_path, [MemexporterCallback(port=0, addr="127.0.0.1")])
    with pytest.raises(RuntimeError, match="simulated"):
        trainer.fit(module, l_loader(L_TRAIN_ROWS, 1))
    assert mx_exporter.running() is None
    assert not active_handles()
    assert "save_checkpoint" not in vars(trainer)


def test_pytorch_lightning_trainer_takes_the_callback(tmp_path: Path, clean: None) -> None:
    """With both packages installed the callback is a ``lightning.pytorch.Callback``; the
    ``pytorch_lightning`` ``Trainer`` calls its hooks all the same (it checks no callback's class):
    steps == ``global_step``, one eval phase per validation loop."""
    PL = pytest.importorskip("pytorch_lightning", reason="needs pytorch_lightning")
    from memexporter.integrations.lightning import MemexporterCallback

    exp = memexporter.start(port=0, addr="127.0.0.1")
    assert exp.url is not None
    module = make_module(PL)
    trainer = l_trainer(PL, tmp_path, [MemexporterCallback()], max_epochs=1, accumulate_grad_batches=2)
    trainer.fit(module, l_loader(L_TRAIN_ROWS, 1), l_loader(L_VAL_ROWS, 2))
    got = read_samples(exp.url)
    assert trainer.global_step == L_TRAIN_ROWS // BATCH // 2
    assert got.need("memexporter_steps_total") == trainer.global_step
    assert got.need("memexporter_phase_completed_total", phase="eval") == module.val_loops == 2
