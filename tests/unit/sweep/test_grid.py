"""`memexporter sweep`'s input: grid axes, placeholders, run order, and the CLI's errors for bad input."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from memexporter.cli import main as cli_main
from memexporter.cli.sweep import program
from memexporter.sweep.grid import Axis, SweepError, check_command, dominates, parse_axis, parse_grid, plan, substitute


@pytest.mark.parametrize(
    ("spec", "values", "numeric"),
    [
        ("batch=16,4,8", ("4", "8", "16"), True),  # numeric axes run small to large
        ("lr=1e-3, 0.5 ,2", ("1e-3", "0.5", "2"), True),  # floats, spaces around values
        ("opt=sgd,adamw", ("sgd", "adamw"), False),  # words keep their order
        ("delta=-2,0,3", ("-2", "0", "3"), True),
    ],
)
def test_axes(spec: str, values: tuple[str, ...], numeric: bool) -> None:
    axis = parse_axis(spec)
    assert (axis.values, axis.numeric) == (values, numeric)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("batch", "expected NAME=V1,V2"),
        ("batch=", "has no values (the grid is empty)"),
        ("batch=4,,8", "has an empty value"),
        ("batch=4,8,x", "'x' in axis 'batch' is not a number"),
        ("batch=4,nan", "'nan' in axis 'batch' is not a number"),
        ("batch=8,4,8.0", "has the value '8.0' twice"),
        ("2x=1,2", "must be a Python identifier"),
    ],
)
def test_bad_axes_name_the_problem(spec: str, message: str) -> None:
    with pytest.raises(SweepError, match=r"^memexporter sweep: ") as err:
        parse_axis(spec)
    assert message in str(err.value)


def test_grid_needs_an_axis_and_unique_names() -> None:
    with pytest.raises(SweepError, match="no --grid given"):
        parse_grid([])
    with pytest.raises(SweepError, match="axis 'batch' is given twice"):
        parse_grid(["batch=1,2", "batch=4"])


def test_placeholders_must_match_the_axes() -> None:
    axes = parse_grid(["batch=1,2", "seq=64"])
    with pytest.raises(
        SweepError, match=r"unknown placeholder \{bacth\} in the command; the grid defines \{batch\}, \{seq\}"
    ):
        check_command(["train.py", "--batch", "{bacth}", "--seq", "{seq}"], axes)
    with pytest.raises(SweepError, match=r"axis 'seq' is not used in the command \(no \{seq\} placeholder\)"):
        check_command(["train.py", "--batch={batch}"], axes)
    with pytest.raises(SweepError, match="no command: put it after --"):
        check_command([], axes)
    # ${HOME} is the shell's, not a placeholder; placeholders also work inside an argument.
    cmd = ["sh", "-c", "echo ${HOME}", "--batch={batch}", "--seq", "{seq}"]
    check_command(cmd, axes)
    assert substitute(cmd, {"batch": "2", "seq": "64"}) == ["sh", "-c", "echo ${HOME}", "--batch=2", "--seq", "64"]


def test_plan_order_and_dominance() -> None:
    axes = parse_grid(["batch=8,2,4", "opt=sgd,adamw"])
    assert [tuple(p.values()) for p in plan(axes)] == [
        ("2", "sgd"),
        ("2", "adamw"),
        ("4", "sgd"),
        ("4", "adamw"),
        ("8", "sgd"),
        ("8", "adamw"),
    ]
    oom = {"batch": "4", "opt": "adamw"}
    # Larger on the numeric axis, same word on the categorical one: needs at least as much memory.
    assert dominates(axes, oom, {"batch": "8", "opt": "adamw"})
    assert dominates(axes, oom, {"batch": "4", "opt": "adamw"})
    assert not dominates(axes, oom, {"batch": "8", "opt": "sgd"})
    assert not dominates(axes, oom, {"batch": "2", "opt": "adamw"})


def test_typed_values() -> None:
    assert [Axis("b", ("4", "8"), True).typed(v) for v in ("4", "8")] == [4, 8]
    axis = parse_axis("lr=0.5,1")
    assert [axis.typed(v) for v in axis.values] == [0.5, 1]
    assert not axis.integer and parse_axis("b=1,2").integer


def test_program_is_found_or_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    with pytest.raises(SweepError, match=r"command not found: 'trian\.py'"):
        program(["trian.py"])
    # `memexporter` off PATH still runs: as this interpreter's module.
    assert program(["memexporter", "demo"]) == [sys.executable, "-m", "memexporter", "demo"]
    with pytest.raises(SweepError, match="is not an executable file"):
        program([str(tmp_path / "missing.py")])


PY = sys.executable


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--grid", "batch=4,8", "--", PY, "t.py", "{batch}", "{seq}"], "unknown placeholder {seq}"),
        (["--", PY, "t.py"], "no --grid given"),
        (["--grid", "batch=", "--", PY, "t.py", "{batch}"], "axis 'batch' has no values"),
        (["--grid", "batch=4,8,big", "--", PY, "t.py", "{batch}"], "'big' in axis 'batch' is not a number"),
        (["--grid", "batch=4,8", PY, "t.py", "{batch}"], "put the command after --"),
        (
            ["--grid", "batch=4,8", "--json", "/no/such/dir/out.json", "--", PY, "t.py", "{batch}"],
            "the folder '/no/such/dir' does not exist",
        ),
        (["--grid", "batch=4,8", "--", "no-such-trainer", "{batch}"], "command not found: 'no-such-trainer'"),
        (["--grid", "batch=4,8", "--csv", "/", "--", PY, "t.py", "{batch}"], "--csv '/' is a folder"),
        (
            ["--grid", "batch=4,8", "--plot", "sweep.jpeg2", "--", PY, "t.py", "{batch}"],
            "matplotlib cannot write 'jpeg2'",
        ),
    ],
)
def test_cli_rejects_bad_input_before_running_anything(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["sweep", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "configuration(s)" not in err  # nothing was started


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--steps", "0"), ("--steps", "ten"), ("--limit-mib", "-5"), ("--timeout", "inf"), ("--poll-seconds", "0")],
)
def test_cli_rejects_bad_numbers(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli_main(["sweep", "--grid", "b=1", flag, value, "--", PY, "{b}"])
    assert exc.value.code == 2
    assert f"argument {flag}: '{value}'" in capsys.readouterr().err


def test_sweep_is_listed_in_the_top_level_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(["--help"])
    assert "sweep" in capsys.readouterr().out
