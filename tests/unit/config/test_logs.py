"""memexporter's own log level: ``MEMEXPORTER_LOG_LEVEL`` (or ``start(log_level=...)``) takes the values
of the commands' ``--log-level``, for ``start()`` and for every command (tests/unit/cli/test_cli_table.py).
Before, ``start()`` said the variable was unknown, and the commands ignored it."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

import memexporter
from memexporter.config import KNOBS, Config, environment

LOGGER = logging.getLogger("memexporter")


@pytest.fixture(autouse=True)
def _logger_kept(monkeypatch: pytest.MonkeyPatch, no_exporter: None) -> Iterator[None]:
    """No ``MEMEXPORTER_*`` knob from the shell; memexporter's logger as it was, after the test."""
    for knob in KNOBS:
        monkeypatch.delenv(knob.env, raising=False)
    monkeypatch.setattr(environment, "_said", set())
    saved = (list(LOGGER.handlers), LOGGER.level, LOGGER.propagate)
    yield
    memexporter.stop()
    LOGGER.handlers[:], LOGGER.level, LOGGER.propagate = saved[0], saved[1], saved[2]


@pytest.mark.parametrize(
    ("text", "level"), [("debug", "DEBUG"), ("INFO", "INFO"), (" Warning ", "WARNING"), ("error", "ERROR")]
)
def test_the_variable_takes_the_commands_values_in_any_case(
    monkeypatch: pytest.MonkeyPatch, text: str, level: str
) -> None:
    monkeypatch.setenv("MEMEXPORTER_LOG_LEVEL", text)
    assert Config.resolve().log_level == level


def test_a_bad_level_names_the_variable_and_the_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMEXPORTER_LOG_LEVEL", "verbose")
    with pytest.raises(
        ValueError, match=r"MEMEXPORTER_LOG_LEVEL must be one of debug, info, warning, error, got 'verbose'"
    ):
        Config.resolve()


def test_start_takes_the_level_from_the_environment_and_knows_the_variable(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MEMEXPORTER_LOG_LEVEL", "debug")
    memexporter.start(http=False)
    assert LOGGER.level == logging.DEBUG
    assert not [r for r in caplog.records if "unknown environment variable" in r.getMessage()]


def test_an_argument_wins_and_no_setting_leaves_the_logger_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMEXPORTER_LOG_LEVEL", "debug")
    memexporter.start(http=False, log_level="error")
    assert LOGGER.level == logging.ERROR
    memexporter.stop()
    monkeypatch.delenv("MEMEXPORTER_LOG_LEVEL")
    LOGGER.setLevel(logging.NOTSET)
    memexporter.start(http=False)
    assert LOGGER.level == logging.NOTSET  # the application's logging configuration decides


def test_without_any_logging_configured_the_messages_go_to_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # An application that configured no logging would see no DEBUG line at all (Python's last
    # resort says WARNING and up): asking for a level is asking to see memexporter's messages.
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    LOGGER.handlers[:] = []
    monkeypatch.setenv("MEMEXPORTER_LOG_LEVEL", "debug")
    memexporter.start(http=False)
    memexporter.start(http=False)  # a second start() adds no second handler
    LOGGER.debug("memexporter: a debug line")
    assert capsys.readouterr().err.count("memexporter: a debug line") == 1


def test_the_handler_writes_to_stderr_as_it_is_at_each_message(monkeypatch: pytest.MonkeyPatch) -> None:
    # A harness (pytest's capture, a launcher's log redirect) that swaps stderr after start() and closes
    # the old one: the handler bound to the old stream printed "--- Logging error ---" for every later
    # line (seen: the HTTP stderr test after tests/unit/rules, whose CLI runs set up this handler).
    import io
    import sys

    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    LOGGER.handlers[:] = []
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    memexporter.start(http=False, log_level="info")
    first.close()
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    errors = io.StringIO()
    monkeypatch.setattr(sys, "__stderr__", errors)  # where logging reports its own errors
    LOGGER.info("memexporter: after the swap")
    assert "memexporter: after the swap" in second.getvalue()
    assert "Logging error" not in errors.getvalue() + second.getvalue()
