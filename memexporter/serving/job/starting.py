"""Starting the helper from ``start()``: spawn it and return at once, or, when strict, wait for its bind.

What follows the helper's report happens on the publishing thread (``link.py``): the "serving" line
(``say_serving``) and the debug token file named by the bound port. A CUDA OOM that the allocator's
observer sees (``oom_dump_dir``) goes to the board at once, on the allocating thread: the process may not
live to publish again. A helper that cannot be started (no board: ``ENOSPC``, ``EPERM``; no interpreter; a
``sys.executable`` that is not a Python, which is never run) is said once and training goes on (strict:
``OSError``).
"""

from __future__ import annotations

import atexit
import logging
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from memexporter.serving.job.binding import log_failure
from memexporter.serving.job.link import REPORT_WAIT, Link
from memexporter.serving.job.spawn import Unrunnable

if TYPE_CHECKING:
    from memexporter.diagnose.wiring import Diagnostics

log = logging.getLogger("memexporter")


def start_helper(
    link: Link, strict: bool, diagnostics: Diagnostics | None, rank: str, steps: Callable[[], int]
) -> bool:
    """Start ``link``'s helper; False when it could not be started (said, or raised when ``strict``).
    ``strict`` also waits ``REPORT_WAIT`` s at most for the bind and raises its failure."""

    def bound(port: int | None) -> None:  # on the publishing thread, when the helper reports
        if diagnostics is not None:
            diagnostics.served(port)  # the debug token file is named by the bound port
        if port is not None:
            say_serving(link.url, rank)

    link.on_bound = bound
    link.steps = steps
    try:
        link.start()
    except (OSError, ValueError) as exc:  # ValueError: a platform without pass_fds
        if isinstance(exc, Unrunnable):  # what to do instead, since nothing else will serve
            message = (
                f"memexporter: cannot run the HTTP helper process: {exc}. To serve /metrics, set sys.executable to a "
                "Python interpreter that can import memexporter before start(); or push over OTLP (http=False, "
                "otel=True)"
            )
        elif link.board is None:
            message = getattr(exc, "strerror", None) or str(exc)  # the board: its own message
        else:
            message = f"memexporter: cannot start the HTTP helper process ({sys.executable}): {exc}"
        if strict:
            raise OSError(getattr(exc, "errno", None), message) from exc
        log_failure(message)
        link.stop()
        bound(None)
        return False
    atexit.register(link.at_exit)
    if diagnostics is not None:
        diagnostics.cuda.listeners.append(
            lambda device, asked: link.record_end(
                {"cuda_oom": {"device": device, "asked": asked, "steps": steps(), "time": time.time()}}
            )
        )
    if strict:
        if not link.wait(REPORT_WAIT):
            raise OSError(f"memexporter: the HTTP helper did not report its bind within {REPORT_WAIT:g} s")
        if link.error is not None:
            raise link.error
    return True


def say_serving(url: str | None, rank: str) -> None:
    """Where the metrics are, once per start: logged at INFO when the application set up logging,
    else one line on stderr, since a script that never configures logging would see nothing and not
    know where to look. Nothing else of memexporter's reaches stderr unasked."""
    line = f"memexporter: serving {url} (rank {rank})"
    if log.hasHandlers():
        log.info("%s", line)
    else:
        print(line, file=sys.stderr, flush=True)
