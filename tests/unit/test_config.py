"""Config knobs: validation, precedence, and that start()/CLI/README agree with KNOBS."""

from __future__ import annotations

import inspect

import pytest

import memexporter
from memexporter.config import KNOBS, Config


@pytest.mark.parametrize(
    ("explicit", "env", "error", "names"),
    [
        ({"port": "abc"}, {}, ValueError, "'abc'"),
        ({"port": -1}, {}, ValueError, "-1"),
        ({"port": 70000}, {}, ValueError, "70000"),
        ({"port": True}, {}, TypeError, "True"),
        ({"port": 1.5}, {}, TypeError, "1.5"),
        ({}, {"MEMEXPORTER_PORT": "xyz"}, ValueError, "MEMEXPORTER_PORT"),
        ({}, {"MEMEXPORTER_STRICT": "maybe"}, ValueError, "'maybe'"),
        ({"leak_window": 2}, {}, ValueError, "leak_window"),
        ({}, {"MEMEXPORTER_MEMORY_LIMIT_BYTES": "0"}, ValueError, "MEMEXPORTER_MEMORY_LIMIT_BYTES"),
        ({"addr": ""}, {}, ValueError, "addr is empty"),
        ({"addr": 127}, {}, TypeError, "addr"),
        ({}, {"MEMEXPORTER_ADDR": "localhost "}, ValueError, "MEMEXPORTER_ADDR has blanks"),
        ({"certfile": "/nonexistent/cert.pem"}, {}, ValueError, "/nonexistent/cert.pem"),
        ({"nonsense": 1}, {}, TypeError, "nonsense"),
    ],
)
def test_bad_values_raise_naming_the_value(explicit: dict[str, object], env: dict[str, str], error: type, names: str) -> None:
    with pytest.raises(error, match=None) as info:
        Config.resolve(explicit, environ=env)
    assert names in str(info.value)


def test_defaults() -> None:
    cfg = Config.resolve({}, environ={})
    assert cfg.port == 9400
    assert cfg.addr == "0.0.0.0"
    assert cfg.strict is False


def test_environment_then_explicit_wins() -> None:
    env = {"MEMEXPORTER_PORT": "9500", "MEMEXPORTER_ADDR": "127.0.0.1", "MEMEXPORTER_STRICT": "true"}
    cfg = Config.resolve({}, environ=env)
    assert (cfg.port, cfg.addr, cfg.strict) == (9500, "127.0.0.1", True)
    cfg = Config.resolve({"port": 9600, "strict": False}, environ=env)
    assert (cfg.port, cfg.addr, cfg.strict) == (9600, "127.0.0.1", False)


def test_cert_and_key_go_together(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    with pytest.raises(ValueError, match="together"):
        Config.resolve({"certfile": str(cert)}, environ={})


def test_start_signature_matches_knobs() -> None:
    params = inspect.signature(memexporter.start).parameters
    # model, optimizer and meter_provider are objects, not settings with an environment variable
    assert [p for p in params if p not in ("model", "optimizer", "meter_provider")] == [k.name for k in KNOBS]


def test_every_knob_has_an_env_variable_named_after_it() -> None:
    for knob in KNOBS:
        assert knob.env == "MEMEXPORTER_" + knob.name.upper()
