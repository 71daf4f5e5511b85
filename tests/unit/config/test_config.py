"""Config knobs: validation, precedence, and that start()/CLI/README agree with KNOBS."""

from __future__ import annotations

import inspect

import pytest

import memexporter
from memexporter.config import KNOBS, Config, Knob
from tests.support import REPO_ROOT


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
def test_bad_values_raise_naming_the_value(
    explicit: dict[str, object], env: dict[str, str], error: type, names: str
) -> None:
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


_A_FILE = REPO_ROOT / "pyproject.toml"
# One bad value per parser, as an argument and as its environment variable (None: no string is
# bad there). Keyed by the parser, so a knob with a new parser fails here until it has its case.
BAD_BY_PARSER: dict[str, tuple[object, str | None]] = {
    "port": (65536, "-1"),
    "addr": ("999.1.1.1", "not an address"),
    "boolean": ("sometimes", "sometimes"),
    "opt_path": ("/nonexistent/file.pem", "/nonexistent/file.pem"),
    "opt_bytes": (0, "40G"),
    "window": (7, "100001"),
    "non_negative": (-1, "minus one"),
    "positive": (0, "0"),
    "opt_positive": (0, "-5"),
    "networks": ("10.0.0.0/33", "10.0.0.0/8, not-a-network"),
    "opt_dir": (str(_A_FILE / "dumps"), str(_A_FILE)),  # under a file: can never be a directory
    "fraction": (0, "1.5"),
    "label_value": ("x" * 129, "tab\there"),
    "ranks": ("0-7,9-3", "first-node"),
    "log_level": ("verbose", "trace"),
}


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
def test_every_knob_rejects_a_bad_value_naming_it(knob: Knob) -> None:
    assert knob.parse.__name__ in BAD_BY_PARSER, f"add a bad value for {knob.parse.__name__} ({knob.name})"
    bad, bad_env = BAD_BY_PARSER[knob.parse.__name__]
    with pytest.raises((TypeError, ValueError)) as info:
        Config.resolve({knob.name: bad}, environ={})
    assert knob.name in str(info.value) and repr(bad) in str(info.value)
    if bad_env is not None:
        with pytest.raises(ValueError) as info:
            Config.resolve({}, environ={knob.env: bad_env})
        assert knob.env in str(info.value) and repr(bad_env) in str(info.value)


@pytest.mark.parametrize(
    ("given", "size"),
    [
        ("40GiB", 40 << 30),
        ("40Gi", 40 << 30),
        ("512MiB", 512 << 20),
        ("1.5GiB", 3 << 29),
        ("40GB", 40 * 10**9),
        ("2tib", 2 << 40),
        ("42949672960", 40 << 30),
        (42949672960, 40 << 30),
        (" 8 KiB ", 8192),
    ],
)
def test_byte_sizes_take_units(given: object, size: int) -> None:
    assert Config.resolve({"memory_limit_bytes": given}, environ={}).memory_limit_bytes == size
    if isinstance(given, str):
        assert Config.resolve({}, environ={"MEMEXPORTER_MEMORY_LIMIT_BYTES": given}).memory_limit_bytes == size


def test_a_bare_g_is_refused_with_both_readings() -> None:
    with pytest.raises(ValueError, match=r"say 40GiB \(42949672960 bytes\) or 40GB \(40000000000 bytes\)"):
        Config.resolve({}, environ={"MEMEXPORTER_MEMORY_LIMIT_BYTES": "40G"})
    for bad in ("lots", "1.5", "0KiB", "40 GiB of it"):
        with pytest.raises(ValueError, match="memory_limit_bytes"):
            Config.resolve({"memory_limit_bytes": bad}, environ={})
