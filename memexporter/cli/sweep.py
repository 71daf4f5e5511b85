"""``memexporter sweep``: the command line.

    memexporter sweep --grid batch=4,8,16 [--grid seq=128,256] [--limit-mib N] [--steps K]
                      [--json OUT] [--csv OUT] [--plot OUT.png] -- COMMAND ARGS...

Exit status: 0 when every run was measured (running out of memory is a result, not an error),
1 when a command could not be measured, a run failed for another reason, or an output could not be
written, 2 for bad arguments, 130 after Ctrl-C (what was measured is still printed and written).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from memexporter.cli import COMMANDS
from memexporter.sweep import plot as plotting
from memexporter.sweep.child import POLL_SECONDS, Timing
from memexporter.sweep.fit import max_fit
from memexporter.sweep.grid import SweepError, check_command, parse_grid, plan, substitute
from memexporter.sweep.report import TerminalProgress, as_json, table, write_csv
from memexporter.sweep.runner import Sweep, run_sweep

EPILOG = """\
Each combination of the grid runs COMMAND with its {NAME} placeholders replaced, in a fresh process
with the exporter on (through the environment, as PYTHONPATH=$(python -m memexporter.bootstrap)
MEMEXPORTER_AUTOSTART=1 does), until K optimizer steps or its exit. Numeric axes run from small to
large; once a size runs out of memory, the larger ones are skipped. The sweep picks the port: do not
pass --port to the command.

example:
  memexporter sweep --grid batch=4,8,16 --plot sweep.png -- memexporter demo --batch {batch} --steps 10
"""


def _positive(kind: type[int] | type[float], allow_zero: bool = False) -> argparse._ActionType:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if value < 0 or (value == 0 and not allow_zero) or not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} must be {'>= 0' if allow_zero else '> 0'}")
        return value

    return parse


def parser() -> argparse.ArgumentParser:
    """``memexporter sweep``'s parser, for the arguments before ``--`` (the measured command follows it)."""
    p = argparse.ArgumentParser(
        prog="memexporter sweep",
        description=COMMANDS["sweep"].help,
        epilog=EPILOG,
        usage="memexporter sweep --grid NAME=V1,V2,... [--grid ...] [options] -- COMMAND ARGS...",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--grid",
        action="append",
        metavar="NAME=V1,V2,...",
        help="an axis: the values of the {NAME} placeholder (repeat for more axes; the first is plotted and fitted)",
    )
    p.add_argument("--steps", type=_positive(int), default=10, metavar="K", help="optimizer steps per run (default 10)")
    p.add_argument(
        "--limit-mib",
        type=_positive(float),
        default=None,
        metavar="N",
        help="the memory limit to fit under; default: the device's, as memexporter_memory_limit_bytes reports it",
    )
    p.add_argument(
        "--timeout", type=_positive(float), default=900.0, metavar="S", help="seconds a run may take (default 900)"
    )
    p.add_argument(
        "--grace",
        type=_positive(float, allow_zero=True),
        default=10.0,
        metavar="S",
        help="seconds a run has to exit after SIGINT before SIGTERM, then SIGKILL (default 10)",
    )
    p.add_argument(
        "--poll-seconds",
        type=_positive(float),
        default=POLL_SECONDS,
        metavar="S",
        help=f"how often the child's /metrics is read (default {POLL_SECONDS}); each read is one scrape of the "
        "child: fewer cost it less, more time its steps more sharply",
    )
    p.add_argument("--json", type=Path, metavar="OUT", help="write the runs and max_fit as JSON")
    p.add_argument("--csv", type=Path, metavar="OUT", help="write one row per run as CSV")
    p.add_argument("--plot", type=Path, metavar="OUT.png", help="draw peak against the first axis (needs matplotlib)")
    return p


def program(command: list[str]) -> list[str]:
    """The command with its program found; ``memexporter`` falls back to this interpreter's module."""
    exe = command[0]
    if os.sep in exe:
        if not os.access(exe, os.X_OK) or os.path.isdir(exe):
            raise SweepError(f"the command {exe!r} is not an executable file")
        return command
    if shutil.which(exe) is None:
        if exe == "memexporter":
            return [sys.executable, "-m", "memexporter", *command[1:]]
        raise SweepError(f"command not found: {exe!r} (not on PATH)")
    return command


def _check_outputs(args: argparse.Namespace) -> None:
    """Fail before hours of runs, not after: each output's folder exists, and --plot can draw."""
    for flag in ("json", "csv", "plot"):
        path: Path | None = getattr(args, flag)
        if path is not None and not path.parent.is_dir():
            raise SweepError(f"--{flag} {str(path)!r}: the folder {str(path.parent)!r} does not exist")
        if path is not None and path.is_dir():
            raise SweepError(f"--{flag} {str(path)!r} is a folder; name a file")
    if args.plot is not None:
        if not plotting.available():
            raise SweepError("--plot needs matplotlib: pip install 'memexporter[plot]'")
        if (fmt := args.plot.suffix.lstrip(".").lower()) not in (formats := plotting.formats()):
            raise SweepError(
                f"--plot {str(args.plot)!r}: matplotlib cannot write {fmt or 'a file without a suffix'!r}; "
                f"use one of {', '.join(sorted(formats))}"
            )


def main(argv: Sequence[str]) -> int:
    """``memexporter sweep [options] -- COMMAND``: run every configuration of the grid, print the table on
    stdout and write ``--json``, ``--csv`` and ``--plot``. Exit 0 when every run was measured, 1 when a
    command could not be measured, a run failed for a reason other than memory or an output could not be
    written, 2 for bad arguments, 130 after Ctrl-C."""
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser().parse_known_args(argv[:split])
    command = argv[split + 1 :]
    try:
        if extra:
            raise SweepError(
                f"unexpected {' '.join(extra)!r}: put the command after --, "
                "as in memexporter sweep --grid batch=4,8 -- python train.py --batch {batch}"
            )
        axes = parse_grid(args.grid)
        check_command(command, axes)
        command = program(command)
        program(substitute(command, plan(axes)[0]))  # a placeholder in the program's name
        _check_outputs(args)
    except SweepError as exc:
        print(exc, file=sys.stderr)
        return 2
    sweep = Sweep(axes, command, args.steps, args.limit_mib)
    print(
        f"memexporter sweep: {len(plan(axes))} configuration(s), {args.steps} steps each: {' '.join(command)}",
        file=sys.stderr,
        flush=True,
    )
    try:
        run_sweep(sweep, Timing(args.timeout, args.grace, args.poll_seconds), TerminalProgress())
    except SweepError as exc:
        sweep.error = str(exc)
    mf = max_fit(sweep)
    print(table(sweep, mf), flush=True)
    status = 0
    doc = as_json(sweep, mf)
    try:
        if args.json is not None:
            args.json.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        if args.csv is not None:
            write_csv(doc, args.csv)
        if args.plot is not None:
            plotting.plot(sweep, mf, args.plot)
    except OSError as exc:
        print(f"memexporter sweep: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        status = 1
    if sweep.error:
        print(
            sweep.error if sweep.error.startswith("memexporter sweep") else f"memexporter sweep: {sweep.error}",
            file=sys.stderr,
        )
        return 1
    if sweep.interrupted:
        print("memexporter sweep: interrupted; the table and files hold what was measured", file=sys.stderr)
        return 130
    if failed := [r for r in sweep.runs if r.status == "failed"]:
        print(
            f"memexporter sweep: {len(failed)} run(s) failed for a reason other than memory (see the result column)",
            file=sys.stderr,
        )
        return 1
    return status
