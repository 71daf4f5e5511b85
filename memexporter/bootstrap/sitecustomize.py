"""Imported by Python at start-up when memexporter's bootstrap directory is on PYTHONPATH.

It must never break the interpreter: every failure is reported on stderr and swallowed.
"""

from __future__ import annotations

import importlib.util
import os
import sys

_TRUE = {"1", "true", "yes", "on"}


def _should_start(orig_argv: list[str]) -> bool:
    """Start in training processes only: not torchrun's launcher, not a multiprocessing child,
    not the memexporter command (which starts the exporter itself when it should)."""
    if os.environ.get("MEMEXPORTER_AUTOSTART", "").strip().lower() not in _TRUE:
        return False
    args = orig_argv[1:]
    program = os.path.basename(args[0]) if args else ""
    if program in ("torchrun", "memexporter"):
        return False
    if "-m" in args:
        module = args[args.index("-m") + 1] if args.index("-m") + 1 < len(args) else ""
        if module in ("torch.distributed.run", "torch.distributed.launch", "memexporter", "pip"):
            return False
    return "--multiprocessing-fork" not in args and not any("multiprocessing" in a and "spawn" in a for a in args)


def _chain() -> None:
    # Another sitecustomize further down sys.path (a distribution's, say) still runs.
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if os.path.abspath(entry or ".") == here:
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
        import memexporter

        memexporter.start()
except Exception as exc:  # a bad MEMEXPORTER_* value must not stop the interpreter from starting
    print(f"memexporter bootstrap: not started: {exc}", file=sys.stderr)
