"""The ``memexporter`` command: one table of subcommands (``COMMANDS``), each in its module here.

``demo``, ``run``, ``inspect``, ``rules``, ``dashboards``, ``sweep`` and ``top``; the generators of
the committed files (``docs``, ``dashboards``' JSON, ``kube``) and the container's ``healthcheck``
live beside them. A subcommand's module is imported only when it runs (or for ``--help``), so a
typo never waits for torch.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

from memexporter._version import __version__
from memexporter.config.logs import configure_for_command
from memexporter.config.values import LOG_LEVELS, log_level

LOG_LEVEL_ENV = "MEMEXPORTER_LOG_LEVEL"


def _level(option: str | None) -> str:
    """The level of memexporter's messages: ``--log-level``, else ``MEMEXPORTER_LOG_LEVEL``, else INFO.
    A bad variable raises ``ValueError`` naming it (``main`` says it in one line)."""
    return option or log_level(LOG_LEVEL_ENV, os.environ.get(LOG_LEVEL_ENV)) or "INFO"


@dataclass(frozen=True)
class Subcommand:
    """A ``memexporter`` subcommand: its help line and its module, imported only when it is needed.

    ``kind`` says how it takes its arguments: ``parsed``, by this parser (the module has
    ``add_arguments(parser)`` and ``run(args)``); ``rest``, the options this parser does not know (the
    demo: building its parser imports torch); ``own``, every argument as given, by the module's
    ``main(argv)`` (rules and dashboards, whose options name files; sweep, whose measured command
    follows ``--``). ``needs_torch``: checked first, for a clear message instead of a traceback.
    ``writes``: a file it cannot write is one line and exit status 1."""

    help: str
    module: str
    kind: Literal["parsed", "rest", "own"] = "parsed"
    needs_torch: bool = False
    writes: bool = False


COMMANDS: dict[str, Subcommand] = {
    "demo": Subcommand(
        "train a small GPT with the exporter on (the embedded default job)",
        "memexporter.cli.demo",
        kind="rest",
        needs_torch=True,
    ),
    "run": Subcommand(
        "run a script or module with the exporter started (no code change)", "memexporter.cli.run", needs_torch=True
    ),
    "inspect": Subcommand(
        "print a running job's /debug/memory, or a dump of oom_dump_dir, as tables", "memexporter.cli.inspect"
    ),
    "rules": Subcommand(
        "print the Prometheus recording and alerting rules", "memexporter.cli.rules", kind="own", writes=True
    ),
    "dashboards": Subcommand(
        "write the Grafana dashboards (JSON, or ConfigMaps)", "memexporter.cli.export", kind="own", writes=True
    ),
    "sweep": Subcommand(
        "find the largest configuration that fits: peak memory per configuration, each in a fresh process",
        "memexporter.cli.sweep",
        kind="own",
    ),
    "top": Subcommand("the ranks' memory in the terminal, refreshing (needs the [top] extra)", "memexporter.cli.top"),
}


def _top_level() -> argparse.ArgumentParser:
    """The options that come before a subcommand's name (``memexporter --log-level debug run``)."""
    parser = argparse.ArgumentParser(
        prog="memexporter", description="PyTorch training memory on a Prometheus /metrics endpoint."
    )
    parser.add_argument("--version", action="version", version=f"memexporter {__version__}")
    parser.add_argument(
        "--log-level",
        default=None,  # then MEMEXPORTER_LOG_LEVEL, then INFO (_level)
        type=str.upper,
        choices=LOG_LEVELS,
        help=f"level of memexporter's own messages (default: {LOG_LEVEL_ENV}, else INFO)",
    )
    return parser


def _parser() -> argparse.ArgumentParser:
    parser = _top_level()
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        if command.kind == "parsed":
            importlib.import_module(command.module).add_arguments(sub.add_parser(name, help=command.help))
        elif command.kind == "rest":  # listed in --help; parse_known_args leaves its options to the module
            sub.add_parser(name, help=command.help, add_help=False)
        else:  # listed in --help; the module parses every argument
            sub.add_parser(name, help=command.help, add_help=False).add_argument("rest", nargs=argparse.REMAINDER)
    parser.set_defaults(subparsers=sub.choices)  # main() reports a subcommand's own mistakes with its usage
    return parser


def _unrecognized(parser: argparse.ArgumentParser, args: argparse.Namespace, rest: list[str]) -> NoReturn:
    """``memexporter run --prot 9500 x.py``: the subcommand's usage and the option meant, not the
    top-level usage (argparse leaves a subcommand's unknown options to the top-level parser)."""
    sub: argparse.ArgumentParser = getattr(args, "subparsers", {}).get(args.command, parser)
    known = list(sub._option_string_actions)  # argparse has no public list of a parser's options
    hints = [
        f"{bad} (did you mean {close[0]}?)"
        if (close := difflib.get_close_matches(bad.split("=")[0], known, 1))
        else bad
        for bad in rest
    ]
    sub.error(f"unrecognized arguments: {' '.join(hints)}")


def os_error(exc: OSError) -> str:
    """``cannot write '/proc/x': Permission denied``: one line, no ``[Errno 13]``."""
    where = f" {exc.filename!r}" if exc.filename else ""
    return f"cannot write{where}: {exc.strerror or exc}"


def main(argv: Sequence[str] | None = None) -> int:
    """The ``memexporter`` command: find the subcommand in ``COMMANDS`` and run it with its
    arguments (``sys.argv`` by default). Returns the exit status: the subcommand's, 2 for a usage
    mistake or a missing torch (argparse exits 2 itself for most usage mistakes)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        _level(None)  # a bad MEMEXPORTER_LOG_LEVEL: one line, before anything runs
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    at = _command_at(argv)
    first = COMMANDS.get(argv[at]) if at is not None else None
    if at is not None and first is not None and first.kind == "own":  # its own parser: the arguments as given
        # Top-level options before it (--log-level debug), read by the top-level parser.
        option = _parser().parse_args([*argv[: at + 1], "--"]).log_level if at else None
        configure_for_command(_level(option))
        return _call(argv[at], lambda module: module.main(argv[at + 1 :]))
    if first is not None and first.needs_torch:
        from memexporter.backends.torchcheck import require_torch

        try:  # before the demo or the script imports torch: a clear message, not a traceback
            require_torch()
        except ImportError as exc:
            print(exc, file=sys.stderr)
            return 2
    parser = _parser()
    args, rest = parser.parse_known_args(argv)  # the rest: the demo's options, for its own parser
    command = COMMANDS[args.command]
    if rest and command.kind != "rest":
        _unrecognized(parser, args, rest)
    args.log_level = _level(args.log_level)  # `memexporter run` passes it on to start()
    configure_for_command(args.log_level)
    if command.kind == "rest":
        return _call(args.command, lambda module: module.main(rest))
    return _call(args.command, lambda module: module.run(args))


def _command_at(argv: list[str]) -> int | None:
    """Where the subcommand's name is, after the top-level options; None before ``--help`` and the like."""
    # The top-level options that take a value, read from their parser: one list of them.
    valued = {s for a in _top_level()._actions if a.nargs != 0 for s in a.option_strings}
    i = 0
    while i < len(argv):
        if argv[i] in valued:
            i += 2
        elif argv[i].split("=", 1)[0] in valued:
            i += 1
        elif argv[i].startswith("-"):
            return None
        else:
            return i
    return None


def _call(name: str, how: Callable[[Any], int]) -> int:
    """Run the subcommand ``name``: its module imported now, its errors said in one line."""
    command = COMMANDS[name]
    try:
        return how(importlib.import_module(command.module))
    except OSError as exc:
        if not command.writes:
            raise
        print(f"memexporter {name}: {os_error(exc)}", file=sys.stderr)
        return 1
    except (TypeError, ValueError) as exc:
        if str(exc).startswith("memexporter"):
            print(exc, file=sys.stderr)
            return 2
        raise
