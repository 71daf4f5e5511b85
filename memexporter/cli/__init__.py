"""The ``memexporter`` command: ``demo``, ``run``, ``rules``, ``dashboards``, ``inspect`` and ``sweep``.

``memexporter run [options] script.py [args...]`` (or ``-m module``) runs a training script with
the exporter started, like ``python -m cProfile``: no code change. Its options are generated
from the config knobs, so they are always the keywords of ``start()``. It works under
``torchrun --no-python memexporter run train.py``.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import logging
import os
import runpy
import sys
from collections.abc import Sequence
from typing import NoReturn

from memexporter._version import __version__
from memexporter.config import FALSE, KNOBS, TRUE, auto_track_default


def _add_knob_options(p: argparse.ArgumentParser) -> None:
    for knob in KNOBS:
        flag = "--" + knob.name.replace("_", "-")
        # argparse formats help with %: escape the docs' own.
        if knob.boolean:  # --strict / --no-strict; unset: the environment, then the default
            p.add_argument(
                flag,
                dest=knob.name,
                default=None,
                action=argparse.BooleanOptionalAction,
                help=f"{knob.doc} (env {knob.env}=1/0; default {str(knob.default).lower()})".replace("%", "%%"),
            )
        else:
            values = f" Values: {knob.values}." if knob.values else ""
            p.add_argument(
                flag,
                dest=knob.name,
                default=None,
                metavar=knob.name.upper(),
                help=f"{knob.doc}{values} (env {knob.env}; default {knob.default!r})".replace("%", "%%"),
            )


def _missing_target(target: str, module: bool) -> str | None:
    """Why ``target`` cannot run, in one line, or None: checked before the exporter starts."""
    if module:
        try:
            found = importlib.util.find_spec(target) is not None
        except (ImportError, ValueError):  # a parent package is missing, or the name is empty
            found = False
        return None if found else f"memexporter run: no module named {target!r} (from {os.getcwd()})"
    if os.path.isdir(target):
        if os.path.isfile(os.path.join(target, "__main__.py")):
            return None
        return f"memexporter run: {target!r} is a directory without a __main__.py"
    if not os.path.isfile(target):
        hint = ""
        if target.lower() in TRUE + FALSE:  # `--strict yes train.py`: the flags take no value
            hint = " (boolean options take no value: --strict or --no-strict, --auto-step or --no-auto-step)"
        return f"memexporter run: no such script: {target!r}{hint}"
    return None


def _run(args: argparse.Namespace) -> int:
    import memexporter

    settings = {k.name: getattr(args, k.name) for k in KNOBS}
    settings["auto_track"] = auto_track_default(settings["auto_track"])
    target = args.target
    if not target:
        print("memexporter run: name a script (memexporter run train.py) or a module (-m pkg.train)", file=sys.stderr)
        return 2
    # The script sees itself as __main__ with its own argv and sys.path[0], as under
    # `python script.py` (the script's folder) or `python -m pkg.mod` (the working directory);
    # from the console script, sys.path[0] would otherwise be the virtualenv's bin/. Set before
    # the module is looked up, so that find_spec searches where `python -m` would.
    sys.path[0] = os.getcwd() if args.module else os.path.dirname(os.path.abspath(target))
    if (problem := _missing_target(target, args.module)) is not None:
        print(problem, file=sys.stderr)  # before anything starts: no server, no hooks
        return 2
    from memexporter import exporter

    try:
        exporter.start(port_hint="--port or MEMEXPORTER_PORT", **settings)
    except (OSError, RuntimeError) as exc:  # strict: the server or the OTLP push could not start
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc  # no "[Errno 98]" prefix
        print(f"memexporter run: {reason} (--strict: the script was not started)", file=sys.stderr)
        return 1
    sys.argv = [target, *args.args]
    try:
        if args.module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)  # sys.exit("message"): Python prints it and exits 1
        return 1
    finally:
        memexporter.stop()
    return 0


def _configure_logging(level: str) -> None:
    """Configure memexporter's own logger only: the user's script owns the root logger, and its
    own ``logging.basicConfig()`` must still take effect under ``memexporter run``."""
    logger = logging.getLogger("memexporter")
    for old in [h for h in logger.handlers if getattr(h, "_memexporter_cli", False)]:
        logger.removeHandler(old)  # main() called again in one process (tests): one handler, not two
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    handler._memexporter_cli = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False


DEMO_HELP = "train a small GPT with the exporter on (the embedded default job)"


def _demo(argv: list[str]) -> int:
    from memexporter.cli.demo import add_arguments
    from memexporter.cli.demo import run as run_demo

    parser = argparse.ArgumentParser(prog="memexporter demo", description=DEMO_HELP[0].upper() + DEMO_HELP[1:] + ".")
    add_arguments(parser)
    return run_demo(parser.parse_args(argv))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memexporter", description="PyTorch training memory on a Prometheus /metrics endpoint."
    )
    parser.add_argument("--version", action="version", version=f"memexporter {__version__}")
    parser.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="level of memexporter's own messages (default: INFO)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    # The demo's options are parsed by its own parser (_demo): building it imports torch, which
    # every other command (a typo under `memexporter run`, say) should not wait for.
    sub.add_parser("demo", help=DEMO_HELP, add_help=False)

    run = sub.add_parser("run", help="run a script or module with the exporter started (no code change)")
    run.add_argument("-m", dest="module", action="store_true", help="run TARGET as a module, like python -m")
    _add_knob_options(run)
    run.add_argument("target", nargs="?", help="script path, or module name with -m")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")

    from memexporter.cli.inspect import add_parser as add_inspect

    add_inspect(sub)

    rules = sub.add_parser("rules", help="print the Prometheus recording and alerting rules", add_help=False)
    rules.add_argument("rest", nargs=argparse.REMAINDER)
    dashboards = sub.add_parser("dashboards", help="write the Grafana dashboards (JSON, or ConfigMaps)", add_help=False)
    dashboards.add_argument("rest", nargs=argparse.REMAINDER)

    from memexporter.cli.sweep import add_parser as add_sweep
    from memexporter.cli.top import add_parser as add_top

    add_sweep(sub)
    add_top(sub)
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


def _write_command(command: str, argv: list[str]) -> int:
    """``rules`` and ``dashboards``, whose files the user names: a path that cannot be written is
    one line on stderr and exit status 1, not a traceback."""
    try:
        if command == "rules":
            from memexporter.cli.rules import main as rules

            return rules(argv)
        from memexporter.cli.export import main as dashboards

        return dashboards(argv)
    except OSError as exc:
        print(f"memexporter {command}: {os_error(exc)}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `rules` owns its own parser (memexporter.cli.rules), so hand it the raw arguments.
    if argv[:1] in (["rules"], ["dashboards"]):
        return _write_command(argv[0], argv[1:])
    if argv[:1] == ["sweep"]:  # owns its parser too: the measured command follows `--`
        from memexporter.cli.sweep import main as sweep

        return sweep(argv[1:])
    if argv[:1] in (["demo"], ["run"]):
        from memexporter.backends.torchcheck import require_torch

        try:  # before the demo or the script imports torch: a clear message, not a traceback
            require_torch()
        except ImportError as exc:
            print(exc, file=sys.stderr)
            return 2
    parser = _parser()
    args, rest = parser.parse_known_args(argv)  # the rest: the demo's options, for its own parser
    if rest and args.command != "demo":
        _unrecognized(parser, args, rest)
    _configure_logging(args.log_level)
    try:
        if args.command == "inspect":
            from memexporter.cli.inspect import run as run_inspect

            try:
                return run_inspect(args)
            except KeyboardInterrupt:
                return 130
        if args.command == "demo":
            return _demo(rest)
        if args.command == "top":
            from memexporter.cli.top import run as run_top

            return run_top(args)
        return _run(args)
    except (TypeError, ValueError) as exc:
        if str(exc).startswith("memexporter"):
            print(exc, file=sys.stderr)
            return 2
        raise
