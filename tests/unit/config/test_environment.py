"""The ``MEMEXPORTER_*`` environment is checked even where it does not decide: a bad variable that
an argument overrides is said once as a WARNING (the job goes on), and a variable nothing reads
(a typo) is said once with the closest known name."""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

import pytest

import memexporter
from memexporter import cli
from memexporter.cli import run as run_command
from memexporter.config import KNOBS, Config, Knob, environment, known_variables, resolve_knob
from tests.support import REPO_ROOT
from tests.support.ports import free_port
from tests.unit.config.test_config import BAD_BY_PARSER

_A_FILE = str(REPO_ROOT / "pyproject.toml")


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch, no_exporter: None) -> None:
    for knob in KNOBS:
        monkeypatch.delenv(knob.env, raising=False)
    monkeypatch.setattr(environment, "_said", set())


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "memexporter"]


def good_argument(knob: Knob) -> dict[str, object]:
    """A good explicit value for ``knob`` (and its companion: certfile and keyfile go together)."""
    if knob.name in ("certfile", "keyfile"):
        return {"certfile": _A_FILE, "keyfile": _A_FILE}
    value = {
        "port": 9500,
        "addr": "127.0.0.1",
        "debug_allow": "10.0.0.0/8",
        "oom_dump_dir": str(REPO_ROOT),
        "census_budget": 0.5,
        "leak_window": 64,
        "memory_limit_bytes": 1 << 30,
        "run_id": "exp-7",
        "log_level": "warning",
    }.get(knob.name)
    if value is None:
        value = (not knob.default) if knob.boolean else 2
    return {knob.name: value}


BAD_ENV = [k for k in KNOBS if BAD_BY_PARSER[k.parse.__name__][1] is not None]


@pytest.mark.parametrize("knob", BAD_ENV, ids=lambda k: k.name)
def test_a_bad_variable_that_an_argument_overrides_is_said_once(knob: Knob, caplog: pytest.LogCaptureFixture) -> None:
    bad = BAD_BY_PARSER[knob.parse.__name__][1]
    assert bad is not None
    explicit = good_argument(knob)
    with caplog.at_level(logging.WARNING, logger="memexporter"):
        for _ in range(3):  # start(), then track() or a callback resolving the same knob: said once
            config = Config.resolve(explicit, environ={knob.env: bad})
        assert getattr(config, knob.name) == resolve_knob(knob.name, explicit[knob.name], {})  # the argument wins
    said = [m for m in warnings(caplog) if knob.env in m]
    assert len(said) == 1, warnings(caplog)
    assert repr(bad) in said[0] and "given explicitly and wins" in said[0] and f"Fix or unset {knob.env}" in said[0]
    with pytest.raises((TypeError, ValueError), match=knob.env):  # the message is right: alone, it is refused
        Config.resolve({k: v for k, v in explicit.items() if k != knob.name} or None, environ={knob.env: bad})


def test_start_with_a_port_argument_warns_about_a_bad_port_variable(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The README's line, with a mistyped variable in the job's environment: the job starts, and says so.
    monkeypatch.setenv("MEMEXPORTER_PORT", "abc")
    port = free_port()
    with caplog.at_level(logging.WARNING, logger="memexporter"):
        exp = memexporter.start(port=port, addr="127.0.0.1")
        memexporter.start(port=port, addr="127.0.0.1")  # the second call returns the running one, silently
    assert exp.port == port
    said = [m for m in warnings(caplog) if "MEMEXPORTER_PORT" in m]
    assert len(said) == 1 and "'abc'" in said[0] and "port=" in said[0], warnings(caplog)


def test_run_with_a_port_option_warns_about_a_bad_port_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MEMEXPORTER_PORT", "abc")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    script = tmp_path / "train.py"
    script.write_text("import memexporter.exporter as e\nassert e.running() is not None and e.running().port\n")
    args = cli._parser().parse_args(
        ["run", "--port", str(free_port()), "--addr", "127.0.0.1", "--no-auto-track", str(script)]
    )
    with caplog.at_level(logging.WARNING, logger="memexporter"):
        assert run_command.run(args) == 0
    said = [m for m in warnings(caplog) if "MEMEXPORTER_PORT" in m]
    assert len(said) == 1 and "'abc'" in said[0] and "given explicitly and wins" in said[0], warnings(caplog)


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("MEMEXPORTER_PROT", "did you mean MEMEXPORTER_PORT?"),
        ("MEMEXPORTER_LEAK_WINDOWS", "did you mean MEMEXPORTER_LEAK_WINDOW?"),
        ("MEMEXPORTER_AUTOSTRAT", "did you mean MEMEXPORTER_AUTOSTART?"),
        ("memexporter_port", "did you mean MEMEXPORTER_PORT? (environment variables are case-sensitive)"),
        (
            "MEMEXPORTER_FROBNICATE",
            "memexporter reads MEMEXPORTER_<a start() keyword in capitals>, and "
            "MEMEXPORTER_AUTOSTART, MEMEXPORTER_DEBUG_TOKEN",
        ),
    ],
)
def test_an_unknown_variable_is_said_once_with_the_closest_name(
    name: str, hint: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="memexporter"):
        Config.resolve({}, environ={name: "9500"})
        Config.resolve({}, environ={name: "9500"})
    assert warnings(caplog) == [f"memexporter: ignoring the unknown environment variable {name}; {hint}"]
    assert "9500" not in caplog.text  # the value never: it may be a mistyped secret


def test_start_says_a_mistyped_variable(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("MEMEXPORTER_PROT", "9500")
    with caplog.at_level(logging.WARNING, logger="memexporter"):
        memexporter.start(http=False, otel=False)
    assert [m for m in warnings(caplog) if "MEMEXPORTER_PROT; did you mean MEMEXPORTER_PORT?" in m]


def test_known_and_tooling_variables_are_not_typos(caplog: pytest.LogCaptureFixture) -> None:
    env = {name: "1" for name in known_variables()}
    env.update({name: "1" for name in environment.TOOLING_VARIABLES})
    env.update({"MEMEXPORTER_TEST_WORKERS": "4", "MEMEXPORTER_BIN_PROMETHEUS": "/usr/bin/prometheus"})
    assert environment.unknown_variables(env, known_variables()) == {}


def test_every_variable_the_package_names_is_known() -> None:
    # A new MEMEXPORTER_* read anywhere in the package must be registered, or start() calls it a typo.
    named = set()
    for path in (REPO_ROOT / "memexporter").rglob("*.py"):
        named |= set(re.findall(r"\bMEMEXPORTER_[A-Z][A-Z_]*[A-Z]\b", path.read_text()))
    assert named, "the scan found nothing: the pattern is wrong"
    assert named - known_variables() - environment.TOOLING_VARIABLES == set()
