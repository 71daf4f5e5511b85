"""Imported by Python at start-up when memexporter's bootstrap directory is on PYTHONPATH.

It must never break the interpreter: every failure is reported on stderr and swallowed.
"""

from __future__ import annotations

import importlib.util
import os
import sys

_TRUE = {"1", "true", "yes", "on"}  # config.TRUE and config.FALSE (not imported: most processes never start)
_FALSE = {"0", "false", "no", "off", ""}
# Launchers start the training processes but never train themselves; they would bind port + 0
# first and leave local rank 0 without its port.
_LAUNCHERS = {"torchrun", "accelerate", "deepspeed", "lightning", "memexporter", "pip", "pip3"}
_LAUNCHER_MODULES = {
    "torch.distributed.run",
    "torch.distributed.launch",
    "accelerate.commands.launch",
    "deepspeed.launcher.runner",
    "memexporter",
    "pip",
}


def _should_start(orig_argv: list[str]) -> bool:
    """Start in training processes only: a script or a module, not a launcher (torchrun,
    accelerate, deepspeed...), not ``python -c`` (multiprocessing's spawn, forkserver and
    resource_tracker helpers all start that way), not the memexporter command (which starts the
    exporter itself when it should)."""
    value = os.environ.get("MEMEXPORTER_AUTOSTART", "")
    if value.strip().lower() in _FALSE or not _training_process(orig_argv[1:]):
        return False
    if value.strip().lower() not in _TRUE:  # a typo must not leave the job unwatched in silence
        print(
            f"memexporter bootstrap: not started: MEMEXPORTER_AUTOSTART={value!r} is not a boolean "
            f"(1/true/yes/on to start, 0/false/no/off not to)",
            file=sys.stderr,
        )
        return False
    return True


def _training_process(args: list[str]) -> bool:
    if "-c" in args or "--multiprocessing-fork" in args:
        return False
    if "-m" in args:
        i = args.index("-m")
        return i + 1 < len(args) and args[i + 1] not in _LAUNCHER_MODULES
    program = next((a for a in args if not a.startswith("-")), "")
    return bool(program) and os.path.basename(program) not in _LAUNCHERS


def _chain() -> None:
    # Another sitecustomize further down sys.path (a distribution's, say) still runs. Compare real
    # paths: the bootstrap folder may be on PYTHONPATH twice, once through a symlink.
    if getattr(sys, "_memexporter_bootstrap_chained", False):
        return
    sys._memexporter_bootstrap_chained = True  # type: ignore[attr-defined]
    here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    for entry in sys.path:
        if os.path.realpath(entry or ".") == here:
            continue
        candidate = os.path.join(entry or ".", "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_memexporter_chained_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


try:
    _chain()
except Exception as exc:
    print(f"memexporter bootstrap: the chained sitecustomize failed: {exc!r}", file=sys.stderr)

try:
    if _should_start(list(getattr(sys, "orig_argv", sys.argv))):
        from memexporter import exporter
        from memexporter.config import auto_track_default

        exporter.start(port_hint="MEMEXPORTER_PORT", auto_track=auto_track_default(None))
except Exception as exc:  # a bad MEMEXPORTER_* value must not stop the interpreter from starting
    print(f"memexporter bootstrap: not started: {exc}", file=sys.stderr)
