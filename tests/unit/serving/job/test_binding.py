"""A taken port is logged with advice that works for the code at hand: a port passed in the code
cannot be moved by ``MEMEXPORTER_PORT`` (an argument wins), so the advice names the argument;
a port from the variable names the variable; under ``memexporter run``, ``--port``. The helper binds and
reports; the job says it (``Exporter.port`` waits for the report)."""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import memexporter
from memexporter import cli
from memexporter.cli import run as run_command
from memexporter.config import environment
from memexporter.serving.job.binding import PortAdvice
from tests.support.ports import free_port


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch, no_exporter: None) -> None:
    for name in ("MEMEXPORTER_PORT", "MEMEXPORTER_ADDR", "MEMEXPORTER_STRICT", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(environment, "_said", set())


@pytest.fixture
def taken() -> Iterator[int]:
    """A port another process holds (as dcgm-exporter holds 9400)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def errors(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(
        r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and "cannot serve" in r.getMessage()
    )


def test_a_port_passed_in_the_code_is_moved_in_the_code(
    taken: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="memexporter"):
        exp = memexporter.start(port=taken, addr="127.0.0.1")  # the README's line, on a taken port
    assert exp.port is None
    said = errors(caplog)
    assert f"port {taken} is already in use" in said
    assert f"the argument port={taken} in the code" in said and "MEMEXPORTER_PORT does not override" in said
    assert "pass port=None to let MEMEXPORTER_PORT choose" in said
    assert "set MEMEXPORTER_PORT" not in said
    # The advice works: with port=None, the variable decides.
    memexporter.stop()
    free = free_port()
    monkeypatch.setenv("MEMEXPORTER_PORT", str(free))
    assert memexporter.start(port=None, addr="127.0.0.1").port == free


def test_a_port_from_the_variable_is_moved_by_the_variable(
    taken: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MEMEXPORTER_PORT", str(taken))
    with caplog.at_level(logging.ERROR, logger="memexporter"):
        assert memexporter.start(addr="127.0.0.1").port is None
    assert f"it comes from MEMEXPORTER_PORT={taken}: set MEMEXPORTER_PORT to another base port" in errors(caplog)


def test_strict_raises_with_the_same_advice_and_names_the_rank(taken: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(OSError) as info:
        memexporter.start(port=taken - 1, addr="127.0.0.1", strict=True)
    said = str(info.value)
    assert f"port {taken} (base port {taken - 1} + LOCAL_RANK) is already in use" in said
    assert f"the argument port={taken - 1} in the code" in said


def test_under_memexporter_run_the_advice_is_the_option(
    taken: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    script = tmp_path / "train.py"
    script.write_text("import memexporter.exporter\nmemexporter.exporter.running().port  # the helper's report\n")
    args = cli._parser().parse_args(
        ["run", "--port", str(taken), "--addr", "127.0.0.1", "--no-auto-track", str(script)]
    )
    with caplog.at_level(logging.ERROR, logger="memexporter"):
        assert run_command.run(args) == 0  # the port is taken: the script still runs
    assert f"it comes from --port {taken}: pass another base port there" in errors(caplog)


@pytest.mark.parametrize(
    ("origin", "hint", "expected"),
    [
        (
            "default",
            "start(port=...) or MEMEXPORTER_PORT",
            "9400 is the default base port: choose another with start(port=...) or MEMEXPORTER_PORT",
        ),
        ("default", "MEMEXPORTER_PORT", "9400 is the default base port: choose another with MEMEXPORTER_PORT"),
        (
            "environment",
            "MEMEXPORTER_PORT",
            "it comes from MEMEXPORTER_PORT=9400: set MEMEXPORTER_PORT to another base port",
        ),
        ("argument", "--port or MEMEXPORTER_PORT", "it comes from --port 9400: pass another base port there"),
    ],
)
def test_advice_by_origin(origin: str, hint: str, expected: str) -> None:
    assert PortAdvice(9400, origin, hint).where() == expected
