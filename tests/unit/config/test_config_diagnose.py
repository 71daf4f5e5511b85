"""The diagnosis knobs: bad values fail fast naming the value, good ones are normalised."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import memexporter
from memexporter.config import Config


@pytest.mark.parametrize(
    ("explicit", "env", "error", "names"),
    [
        ({"debug": "maybe"}, {}, ValueError, "'maybe'"),
        ({}, {"MEMEXPORTER_DEBUG": "yes please"}, ValueError, "MEMEXPORTER_DEBUG"),
        ({"debug_allow": "10.0.0.0/33"}, {}, ValueError, "'10.0.0.0/33'"),
        ({}, {"MEMEXPORTER_DEBUG_ALLOW": "10.0.0.0/8,localhost"}, ValueError, "'localhost'"),
        ({"debug_allow": 10}, {}, TypeError, "10"),
        ({"debug_allow": ["10.0.0.0/8", 7]}, {}, TypeError, "7"),
        ({"record_history": "2"}, {}, ValueError, "record_history"),
        ({"census_every": 0}, {}, ValueError, "census_every"),
        ({}, {"MEMEXPORTER_CENSUS_EVERY": "often"}, ValueError, "'often'"),
        ({"census_budget": 0}, {}, ValueError, "census_budget"),
        ({"census_budget": "1.5"}, {}, ValueError, "'1.5'"),
        ({}, {"MEMEXPORTER_CENSUS_BUDGET": "half"}, ValueError, "'half'"),
        ({"census_budget": True}, {}, TypeError, "True"),
        ({"oom_dump_dir": 3}, {}, TypeError, "3"),
    ],
)
def test_bad_values_raise_naming_the_value(
    explicit: dict[str, object], env: dict[str, str], error: type, names: str
) -> None:
    with pytest.raises(error) as info:
        Config.resolve(explicit, environ=env)
    assert names in str(info.value)


def test_oom_dump_dir_must_be_a_directory_we_can_write(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        Config.resolve({"oom_dump_dir": str(a_file / "below")}, environ={})
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        if not os.access(locked, os.W_OK):  # root can write anywhere
            with pytest.raises(ValueError, match="not writable"):
                Config.resolve({}, environ={"MEMEXPORTER_OOM_DUMP_DIR": str(locked / "dumps")})
    finally:
        locked.chmod(0o700)
    fresh = tmp_path / "new" / "dumps"
    assert Config.resolve({"oom_dump_dir": fresh}, environ={}).oom_dump_dir == str(fresh)
    assert not fresh.exists()  # validated, created by start()


def test_defaults_and_normalised_values() -> None:
    cfg = Config.resolve({}, environ={})
    assert (cfg.debug, cfg.debug_allow, cfg.record_history, cfg.oom_dump_dir) == (False, (), False, None)
    assert (cfg.census_every, cfg.census_budget) == (50, 0.005)
    cfg = Config.resolve(
        {},
        environ={
            "MEMEXPORTER_DEBUG": "1",
            "MEMEXPORTER_DEBUG_ALLOW": "10.1.2.3/8 fd00::1/8",
            "MEMEXPORTER_CENSUS_BUDGET": "0.01",
        },
    )
    assert cfg.debug and cfg.debug_allow == ("10.0.0.0/8", "fd00::/8") and cfg.census_budget == 0.01
    assert Config.resolve({"debug_allow": ["192.168.1.7"]}, environ={}).debug_allow == ("192.168.1.7/32",)


def test_start_creates_the_dump_dir(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b"
    memexporter.stop()
    exp = memexporter.start(port=0, addr="127.0.0.1", oom_dump_dir=str(target))
    try:
        assert target.is_dir() and exp.diagnostics is not None and exp.diagnostics.apps == {}
    finally:
        exp.stop()


def test_run_help_lists_the_knobs_with_their_percent_signs(capsys: pytest.CaptureFixture[str]) -> None:
    from memexporter import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["run", "--help"])  # argparse %-formats help texts: "0.5 %" once broke it
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--census-budget" in out and "(0.005: 0.5 %)" in out and "--debug-allow" in out
