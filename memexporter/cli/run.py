"""``memexporter run [options] script.py [args...]`` (or ``-m module``): a training script with the
exporter started, like ``python -m cProfile``: no code change. Its options are generated from the
config knobs, so they are always the keywords of ``start()``. It works under
``torchrun --no-python memexporter run train.py``."""

from __future__ import annotations

import argparse
import importlib.util
import os
import runpy
import sys

from memexporter.config import FALSE, KNOBS, TRUE, auto_track_default


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``memexporter run``'s options: ``-m``, one per config knob, the target and its arguments."""
    p.add_argument("-m", dest="module", action="store_true", help="run TARGET as a module, like python -m")
    _add_knob_options(p)
    p.add_argument("target", nargs="?", help="script path, or module name with -m")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")


def _add_knob_options(p: argparse.ArgumentParser) -> None:
    for knob in KNOBS:
        if knob.name == "log_level":  # the top-level --log-level: memexporter --log-level debug run ...
            continue
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


def run(args: argparse.Namespace) -> int:
    """Run the script or module with the exporter started; its exit status."""
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
