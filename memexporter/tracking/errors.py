"""Failures inside the training-thread side, counted and never raised into training.

Every hook body catches everything and calls ``count_failure``: the count is exported as
``memexporter_hook_errors_total`` and only the first traceback is logged, since a broken hook
runs on every forward and would flood the training log.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("memexporter")

_errors = 0
_errors_lock = threading.Lock()


def hook_errors() -> int:
    """Failures caught inside tracking hooks since the process started (never raised to training)."""
    return _errors


def count_failure(where: str) -> None:
    """Count a failure; log the first one with its traceback. Call it from an ``except`` block."""
    global _errors
    with _errors_lock:
        _errors += 1
        first = _errors == 1
    if first:
        log.exception(
            "memexporter: a training-thread hook failed in the %s; training goes on, further "
            "failures are only counted (memexporter.tracking.modules.hook_errors())",
            where,
        )
