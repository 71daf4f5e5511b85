"""Every knob reaches the exporter by every path, the cases generated from ``config.KNOBS``:
``start(name=value)``, ``MEMEXPORTER_<NAME>=text``, ``memexporter run --name text`` (run in this
process, on a script that looks at the running exporter) and, for the module knobs, ``track()``.
Each case checks the resolved setting and, where it shows, its effect on the running exporter."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import memexporter
from memexporter import cli, exporter
from memexporter.cli import run as run_command
from memexporter.collectors.scrape import Scrape
from memexporter.config import BY_NAME, KNOBS, Knob, environment
from memexporter.exporter import Exporter
from tests.support.ports import free_port
from tests.support.tls import self_signed

PATHS = ("argument", "environment", "run")
NEEDS_HTTP = {
    "port",
    "addr",
    "certfile",
    "keyfile",
    "http",
    "end_grace",
}  # the others run with http=False: no port, no token file


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch, no_exporter: None) -> Iterator[None]:
    logger = logging.getLogger("memexporter")
    saved = (list(logger.handlers), logger.level, logger.propagate)  # log_level changes them
    yield
    memexporter.stop()
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]


@pytest.fixture(autouse=True)
def _no_knobs(monkeypatch: pytest.MonkeyPatch, no_exporter: None) -> None:
    for knob in KNOBS:
        monkeypatch.delenv(knob.env, raising=False)
    monkeypatch.setattr(environment, "_said", set())  # each test sees its own once-only warnings
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")  # otel=True: a last push that fails at once
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")


class Case:
    """One knob's good value: as an argument, as text (the variable, the option) and resolved."""

    def __init__(self, knob: Knob, tmp_path: Path) -> None:
        self.knob = knob
        self.tmp_path = tmp_path
        self.argument, self.text, self.resolved = self._good(knob.name, tmp_path)

    def _good(self, name: str, tmp: Path) -> tuple[Any, str, Any]:
        if name == "port":
            port = free_port()
            return port, str(port), port
        if name in ("certfile", "keyfile"):
            path = str(self.tls()[0 if name == "certfile" else 1])
            return path, path, path
        if name == "oom_dump_dir":
            return str(tmp / "dumps"), str(tmp / "dumps"), str(tmp / "dumps")
        return GOOD[name]

    def tls(self) -> tuple[Path, Path]:
        folder = self.tmp_path / "tls"
        folder.mkdir(exist_ok=True)
        return self_signed(folder)

    def base(self) -> dict[str, Any]:
        """The other settings this case runs with (always given as arguments or options)."""
        name = self.knob.name
        if name in ("census_every", "census_budget"):
            return {"http": False, "debug": True}  # the census runs with debug or oom_dump_dir
        if name not in NEEDS_HTTP:
            return {"http": False}
        out: dict[str, Any] = {"port": 0, "addr": "127.0.0.1"}
        if name in ("certfile", "keyfile"):
            cert, key = self.tls()
            out["keyfile" if name == "certfile" else "certfile"] = str(key if name == "certfile" else cert)
        out.pop(name, None)
        return out


GOOD: dict[str, tuple[Any, str, Any]] = {
    "addr": ("localhost", "localhost", "127.0.0.1"),
    "strict": (True, "1", True),
    "memory_limit_bytes": (1 << 30, str(1 << 30), 1 << 30),
    "leak_window": (64, "64", 64),
    "warmup_steps": (3, "3", 3),
    "max_input_elements": (4096, "4096", 4096),
    "auto_step": (False, "0", False),
    "module_depth": (1, "1", 1),
    "max_modules": (5, "5", 5),
    "auto_track": (True, "1", True),
    "otel": (True, "1", True),
    "http": (False, "0", False),
    "end_grace": (5, "5", 5),
    "debug": (True, "1", True),
    "debug_allow": ("10.0.0.0/8", "10.0.0.0/8", ("10.0.0.0/8",)),
    "record_history": (True, "1", True),
    "census_every": (7, "7", 7),
    "census_budget": (0.25, "0.25", 0.25),
    "run_id": ("exp-7", "exp-7", "exp-7"),
    "log_level": ("warning", "Warning", "WARNING"),
    "detail_ranks": ("none", "NONE", "none"),
}
SPECIAL = {"port", "certfile", "keyfile", "oom_dump_dir"}  # values made per test (a free port, files)


def test_every_knob_has_a_case() -> None:
    assert set(GOOD) | SPECIAL == set(BY_NAME), "give the new knob a good value in GOOD (and an effect in EFFECTS)"


def nested() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.Linear(4, 4))), torch.nn.Linear(4, 2)
    )


def train(model: torch.nn.Module, steps: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()


def _rows(exp: Exporter, name: str, expected: Any) -> bool:
    handle = memexporter.track(nested())  # the public track(): its defaults are the running exporter's
    try:
        snap = handle.snapshot()
        if name == "module_depth":
            return max(n.count(".") + 1 for n in snap.layout.names if n != "(root)") == expected
        return bool(snap.max_modules == expected)
    finally:
        handle.remove()


def _auto(exp: Exporter, name: str, expected: Any) -> bool:
    model = nested()
    train(model, 3)
    model(torch.randn(2, 4))
    if name == "auto_step":
        return exp.sources.steps is not None and (exp.sources.steps.steps == 3) is expected
    return bool(exp.tracked) is expected


def _diag(exp: Exporter, name: str, expected: Any) -> bool:
    attribute = {"census_every": "every", "census_budget": "budget"}[name]
    return exp.diagnostics is not None and getattr(exp.diagnostics.diagnosis, attribute) == expected


def _tracker(exp: Exporter, name: str, expected: Any) -> bool:
    attribute = {"leak_window": "_window", "warmup_steps": "_warmup"}[name]
    return getattr(exp.sources.steps, attribute) == expected


def _url(prefix: str) -> Callable[[Exporter, str, Any], bool]:
    return lambda exp, name, expected: (exp.url or "").startswith(prefix)


Effect = Callable[[Exporter, str, Any], bool]
EFFECTS: dict[str, Effect] = {
    "port": lambda exp, name, expected: exp.port == expected,
    "addr": _url("http://127.0.0.1:"),
    "certfile": _url("https://127.0.0.1:"),
    "keyfile": _url("https://127.0.0.1:"),
    "memory_limit_bytes": lambda exp, name, expected: Scrape(exp.sources).views["cpu"].limit == expected,
    "leak_window": _tracker,
    "warmup_steps": _tracker,
    "max_input_elements": lambda exp, name, expected: (
        exp.registry.get_sample_value("memexporter_input_declared_max_elements", {"rank": "0"}) == expected
    ),
    "auto_step": _auto,
    "auto_track": _auto,
    "module_depth": _rows,
    "max_modules": _rows,
    "otel": lambda exp, name, expected: (exp.otel is not None) == expected,
    "http": lambda exp, name, expected: (exp.port is None) != expected,
    "end_grace": lambda exp, name, expected: exp._link is not None and exp._link.grace == expected,
    "debug": lambda exp, name, expected: bool(exp.diagnostics and exp.diagnostics.apps) == expected,
    "record_history": lambda exp, name, expected: (exp.diagnostics is not None) == expected,
    "oom_dump_dir": lambda exp, name, expected: bool(
        exp.diagnostics and exp.diagnostics.premortem and os.path.isdir(expected)
    ),
    "census_every": _diag,
    "census_budget": _diag,
    "run_id": lambda exp, name, expected: exp.sources.identity.run_id == expected,
    "log_level": lambda exp, name, expected: logging.getLogger("memexporter").level == logging.WARNING,
    "detail_ranks": lambda exp, name, expected: exp.sources.identity.detail == "core",  # none: no rank is one
}  # strict and debug_allow: the resolved setting is all there is to see without a failure or a client


def effect_shows(exp: Exporter, name: str, expected: Any) -> bool:
    return EFFECTS.get(name, lambda *_: True)(exp, name, expected)


OBSERVED: dict[str, Any] = {}


def observe() -> None:
    """Called by the script under ``memexporter run``, while its exporter runs."""
    exp = exporter.running()
    assert exp is not None
    name, expected = sys.argv[1], OBSERVED.pop("expected")
    OBSERVED["config"] = getattr(exp.config, name)
    OBSERVED["effect"] = effect_shows(exp, name, expected)


def option(knob: Knob, value: Any, text: str) -> list[str]:
    flag = "--" + knob.name.replace("_", "-")
    if knob.boolean:
        return [flag if value else "--no-" + flag[2:]]
    return [flag, text]


def run_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: list[str], name: str, expected: Any, top: list[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text("from tests.unit.config.test_config_paths import observe\nobserve()\n")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    OBSERVED.clear()
    OBSERVED["expected"] = expected
    args = cli._parser().parse_args([*top, "run", *options, str(script), name])
    assert run_command.run(args) == 0
    assert OBSERVED.get("effect") is True, OBSERVED


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
def test_every_knob_reaches_the_exporter(
    knob: Knob, path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = Case(knob, tmp_path)
    base = case.base()
    argument, text, expected = case.argument, case.text, case.resolved
    if path == "run":
        if knob.boolean:  # the opposite of this path's default (auto_track is on under run)
            expected = not (True if knob.name == "auto_track" else knob.default)
            argument = expected
        options = [o for k, v in base.items() for o in option(BY_NAME[k], v, str(v))]
        given = option(knob, argument, text)
        # log_level is every command's option, before the subcommand: memexporter --log-level warning run ...
        top = given if knob.name == "log_level" else []
        run_in_process(tmp_path, monkeypatch, [*options, *([] if top else given)], knob.name, expected, top)
        assert OBSERVED["config"] == expected
        return
    if path == "environment":
        monkeypatch.setenv(knob.env, text)
        exp = memexporter.start(**base)
    else:
        exp = memexporter.start(**base, **{knob.name: argument})
    assert getattr(exp.config, knob.name) == expected
    assert effect_shows(exp, knob.name, expected), f"{knob.name}={expected!r} resolved but does not show on {exp!r}"


@pytest.mark.parametrize("name", ["module_depth", "max_modules"])
def test_track_takes_the_module_knobs_from_the_environment_without_an_exporter(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(BY_NAME[name].env, "1")
    handle = memexporter.track(nested())
    try:
        snap = handle.snapshot()
        assert (snap.max_modules == 1) if name == "max_modules" else all("." not in n for n in snap.layout.names)
    finally:
        handle.remove()


def test_start_with_a_model_applies_its_own_max_modules_and_depth() -> None:
    exp = memexporter.start(http=False, model=nested(), max_modules=2, module_depth=1)
    snap = exp.tracked[0].snapshot()
    assert snap.max_modules == 2 and all("." not in n for n in snap.layout.names)
    # On an exporter that already runs, the call's own caps win over the running exporter's.
    again = memexporter.start(model=nested(), max_modules=5)
    assert again is exp and exp.tracked[1].snapshot().max_modules == 5
