"""The ``memexporter`` command: ``demo``, ``run``, ``rules``, ``inspect`` and ``sweep``.

``memexporter run [options] script.py [args...]`` (or ``-m module``) runs a training script with
the exporter started, like ``python -m cProfile``: no code change. Its options are generated
from the config knobs, so they are always the keywords of ``start()``. It works under
``torchrun --no-python memexporter run train.py``.
"""

from __future__ import annotations

import argparse
import logging
import os
import runpy
import sys
from collections.abc import Sequence

from memexporter import __version__
from memexporter.config import KNOBS


def _add_knob_options(p: argparse.ArgumentParser) -> None:
    for knob in KNOBS:
        flag = "--" + knob.name.replace("_", "-")
        p.add_argument(flag, dest=knob.name, default=None, metavar=knob.name.upper(),
                       help=f"{knob.doc} (env {knob.env}; default {knob.default!r})".replace("%", "%%"))  # argparse formats help with %


def _run(args: argparse.Namespace) -> int:
    import memexporter

    settings = {k.name: getattr(args, k.name) for k in KNOBS}
    target = args.target
    if not target:
        print("memexporter run: name a script (memexporter run train.py) or a module (-m pkg.train)", file=sys.stderr)
        return 2
    memexporter.start(**settings)
    # The script sees itself as __main__ with its own argv and sys.path[0], as under
    # `python script.py` (the script's folder) or `python -m pkg.mod` (the working directory);
    # from the console script, sys.path[0] would otherwise be the virtualenv's bin/.
    sys.argv = [target, *args.args]
    sys.path[0] = os.getcwd() if args.module else os.path.dirname(os.path.abspath(target))
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
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memexporter", description="PyTorch training memory on a Prometheus /metrics endpoint.")
    parser.add_argument("--version", action="version", version=f"memexporter {__version__}")
    parser.add_argument("--log-level", default="INFO", help="logging level for memexporter's own messages")
    sub = parser.add_subparsers(dest="command", required=True)

    from memexporter.demo import add_arguments

    demo = sub.add_parser("demo", help="train a small GPT with the exporter on (the embedded default job)")
    add_arguments(demo)

    run = sub.add_parser("run", help="run a script or module with the exporter started (no code change)")
    run.add_argument("-m", dest="module", action="store_true", help="run TARGET as a module, like python -m")
    _add_knob_options(run)
    run.add_argument("target", nargs="?", help="script path, or module name with -m")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")

    from memexporter.diagnose.inspect import add_parser as add_inspect

    add_inspect(sub)

    rules = sub.add_parser("rules", help="print the Prometheus recording and alerting rules", add_help=False)
    rules.add_argument("rest", nargs=argparse.REMAINDER)

    from memexporter.sweep.command import add_parser as add_sweep

    add_sweep(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `rules` owns its own parser (memexporter.rules.main), so hand it the raw arguments.
    if argv[:1] == ["rules"]:
        from memexporter import rules

        return rules.main(argv[1:])
    if argv[:1] == ["sweep"]:  # owns its parser too: the measured command follows `--`
        from memexporter.sweep.command import main as sweep

        return sweep(argv[1:])
    args = _parser().parse_args(argv)
    _configure_logging(args.log_level)
    try:
        if args.command == "inspect":
            from memexporter.diagnose.inspect import run as run_inspect

            return run_inspect(args)
        if args.command == "demo":
            from memexporter.demo import run as run_demo

            return run_demo(args)
        return _run(args)
    except (TypeError, ValueError) as exc:
        if str(exc).startswith("memexporter"):
            print(exc, file=sys.stderr)
            return 2
        raise
