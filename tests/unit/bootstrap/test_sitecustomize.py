"""The bootstrap's start decision on ``MEMEXPORTER_AUTOSTART``: a value that is not a boolean is
said on stderr (the interpreter's start-up has no logging yet) instead of ignored in silence."""

from __future__ import annotations

import pytest

from memexporter.bootstrap import sitecustomize
from memexporter.config import FALSE, TRUE


@pytest.mark.parametrize("value", ["yes please", "2", "ture", "enable"])
def test_a_mistyped_autostart_is_said_and_does_not_start(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MEMEXPORTER_AUTOSTART", value)
    assert sitecustomize._should_start(["python", "train.py"]) is False
    err = capsys.readouterr().err
    assert f"MEMEXPORTER_AUTOSTART={value!r} is not a boolean" in err and "1/true/yes/on" in err


@pytest.mark.parametrize("value", [*TRUE, *FALSE, "", " On "])
def test_booleans_decide_in_silence(
    value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MEMEXPORTER_AUTOSTART", value)
    assert sitecustomize._should_start(["python", "train.py"]) is (value.strip().lower() in TRUE)
    assert capsys.readouterr().err == ""


def test_launchers_and_helpers_stay_quiet_about_a_mistyped_value(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # torchrun and multiprocessing's helpers never start the exporter: the training processes say it.
    monkeypatch.setenv("MEMEXPORTER_AUTOSTART", "yes please")
    assert not sitecustomize._should_start(["python", "/venv/bin/torchrun", "train.py"])
    assert not sitecustomize._should_start(["python", "-c", "from multiprocessing.spawn import spawn_main"])
    assert capsys.readouterr().err == ""


def test_the_bootstrap_knows_the_config_booleans() -> None:
    assert set(TRUE) == sitecustomize._TRUE and set(FALSE) | {""} == sitecustomize._FALSE
