"""The framework callbacks never stop training (issue 23): a port another socket holds is logged
and the run trains to its last step (or, with ``strict=True``, is the one error let through), and a
memexporter function that raises on every call is counted and logged once, under Lightning and the
HF ``Trainer`` alike. The runs: tests/support/callback_trainers.py; the callbacks' steps, phases and
peaks: test_callbacks.py."""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Any

import pytest

import memexporter
from memexporter import exporter as mx_exporter
from memexporter.tracking.modules import active_handles, hook_errors
from tests.support.callback_trainers import (
    BATCH,
    HF_EVAL_ROWS,
    HF_TRAIN_ROWS,
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

pytestmark = MARKS


def at_train_end() -> tuple[Any, str | None]:
    """The exporter running as training ends, and its URL as it says then. ``url`` waits for the
    helper's report of its bind, as a user reading it would: read after the callback's stop(), it is
    None whatever happened, and a run shorter than the helper's start could end before the report."""
    exporter = mx_exporter.running()
    return exporter, exporter.url if exporter is not None else None


def run_small(
    framework: str, tmp_path: Path, callback_kwargs: dict[str, Any]
) -> tuple[int, int, tuple[Any, str | None]]:
    """A short run of ``framework`` with the callback: (global step, expected global step, the
    exporter that ran during training and its URL then)."""
    seen: list[tuple[Any, str | None]] = []
    if framework == "lightning":
        L = lightning()
        from memexporter.integrations.lightning import MemexporterCallback as LCallback

        class Seen(L.Callback):  # type: ignore[misc,name-defined]
            def on_train_end(self, trainer: Any, pl_module: Any) -> None:
                seen.append(at_train_end())

        trainer = l_trainer(
            L,
            tmp_path,
            [LCallback(**callback_kwargs), Seen()],
            max_epochs=1,
            accumulate_grad_batches=2,
            val_check_interval=4,
        )
        trainer.fit(make_module(L), l_loader(L_TRAIN_ROWS, 1), l_loader(L_VAL_ROWS, 2))
        return trainer.global_step, L_TRAIN_ROWS // BATCH // 2, seen[0]
    T = transformers()
    from memexporter.integrations.transformers import MemexporterCallback as HFCallback

    class HFSeen(T.TrainerCallback):  # type: ignore[misc,name-defined]
        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            seen.append(at_train_end())

    args = hf_args(
        T,
        tmp_path,
        num_train_epochs=1,
        gradient_accumulation_steps=2,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=3,
    )
    trainer = T.Trainer(
        model=tiny_gpt2(T),
        args=args,
        train_dataset=hf_dataset(HF_TRAIN_ROWS, 1),
        eval_dataset=hf_dataset(HF_EVAL_ROWS, 2),
        callbacks=[HFSeen(), HFCallback(**callback_kwargs)],
    )
    trainer.train()
    return trainer.state.global_step, HF_TRAIN_ROWS // BATCH // 2, seen[0]


@pytest.mark.parametrize("framework", ["lightning", "transformers"])
def test_port_taken_training_goes_on(
    tmp_path: Path, clean: None, caplog: pytest.LogCaptureFixture, framework: str
) -> None:
    """The base port is held by another socket: the exporter logs that it cannot serve (the
    default ``strict=False``), the run trains to its last step, and the callback still stops the
    exporter it started."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        with caplog.at_level(logging.ERROR, logger="memexporter"):
            steps, expected, seen = run_small(framework, tmp_path, {"port": port, "addr": "127.0.0.1"})
    assert steps == expected
    exporter, url = seen
    assert exporter is not None and url is None, seen
    assert any(f"port {port} is already in use" in r.getMessage() for r in caplog.records), caplog.text
    assert mx_exporter.running() is None


@pytest.mark.parametrize("framework", ["lightning", "transformers"])
def test_port_taken_with_strict_raises(tmp_path: Path, clean: None, framework: str) -> None:
    """``strict=True`` asks ``start()`` to raise when the port is taken: the callback lets that one
    error through (Lightning: out of ``fit``; Hugging Face: out of the ``Trainer``'s constructor)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        with pytest.raises(OSError, match="already in use"):
            run_small(framework, tmp_path, {"port": port, "addr": "127.0.0.1", "strict": True})
    assert mx_exporter.running() is None
    assert not active_handles()


@pytest.mark.parametrize("framework", ["lightning", "transformers"])
def test_memexporter_failures_never_reach_training(
    tmp_path: Path, clean: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, framework: str
) -> None:
    """``memexporter.phase`` and ``memexporter.step`` raise on every call: the run trains to its
    last step; the failures are counted in ``memexporter_hook_errors_total`` and logged once."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("broken on purpose")

    monkeypatch.setattr(memexporter, "phase", broken)
    monkeypatch.setattr(memexporter, "step", broken)
    errors = hook_errors()
    with caplog.at_level(logging.ERROR, logger="memexporter"):
        steps, expected, seen = run_small(framework, tmp_path, {"port": 0, "addr": "127.0.0.1"})
    assert steps == expected
    assert seen[0] is not None
    assert hook_errors() - errors >= expected, "the failures were not counted"
    logged = [r for r in caplog.records if r.exc_info and "broken on purpose" in str(r.exc_info[1])]
    assert len(logged) == 1, [r.getMessage() for r in logged]
    assert mx_exporter.running() is None
    assert not active_handles()
