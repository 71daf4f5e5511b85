"""The level of memexporter's own messages (the ``memexporter`` logger), set by the commands'
``--log-level`` or by ``log_level`` / ``MEMEXPORTER_LOG_LEVEL`` (``start()`` and every command).

The application owns the root logger: only memexporter's logger is touched. A handler is added
where nothing would show the messages asked for: the commands always (their output is the
terminal), ``start()`` only where neither memexporter's logger nor the root logger has one
(Python's last resort shows WARNING and up only, so a DEBUG level would show nothing).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

LOGGER = "memexporter"
FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to ``sys.stderr`` as it is at each message, as Python's last resort does: a script or
    a harness that replaces stderr after ``start()`` (and closes the old one) gets the lines, not a
    "--- Logging error ---" traceback per message."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler.__init__ sets it: sys.stderr stays the one
        pass


def _stderr_handler() -> logging.Handler:
    handler = _Stderr()
    handler.setFormatter(logging.Formatter(FORMAT))
    handler._memexporter = True  # type: ignore[attr-defined]
    return handler


def set_level(level: str | None) -> None:
    """``start()``'s ``log_level``: memexporter's logger at ``level`` (``DEBUG`` ... ``ERROR``),
    with a stderr handler only where the application configured no logging at all; ``None``
    (unset) leaves the logger as it is."""
    if level is None:
        return
    logger = logging.getLogger(LOGGER)
    logger.setLevel(level)
    if not logger.handlers and not logging.getLogger().handlers:
        logger.addHandler(_stderr_handler())
        logger.propagate = False  # a basicConfig() the application calls later must not print each line twice


def configure_for_command(level: str) -> None:
    """A command's logging: memexporter's logger at ``level``, on stderr, its own handler only.
    The script that ``memexporter run`` runs keeps the root logger: its ``basicConfig()`` works."""
    logger = logging.getLogger(LOGGER)
    for old in [h for h in logger.handlers if getattr(h, "_memexporter", False)]:
        logger.removeHandler(old)  # main() called again in one process (tests): one handler, not two
    logger.addHandler(_stderr_handler())
    logger.setLevel(level)
    logger.propagate = False
