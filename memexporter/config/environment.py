"""Checks of the ``MEMEXPORTER_*`` environment that warn rather than raise (``config.py`` calls them).

- A bad variable that an explicit argument overrides does not stop the job (the argument wins),
  but it is said once as a WARNING: where nothing overrides it, ``start()`` refuses it.
- A ``MEMEXPORTER_*`` variable that nothing reads is a typo until proven otherwise: said once,
  with the closest known name (difflib).

Each message is said once per process: ``start()``, ``track()`` and a callback may each resolve
the same knob.
"""

from __future__ import annotations

import difflib
import logging
import threading
from collections.abc import Callable, Collection, Mapping
from typing import Any

log = logging.getLogger("memexporter")

PREFIX = "MEMEXPORTER_"
AUTOSTART = "MEMEXPORTER_AUTOSTART"
"""Read by the bootstrap (``memexporter/bootstrap/sitecustomize.py``), not a ``start()`` keyword."""
OTHER_VARIABLES = frozenset(
    {
        AUTOSTART,
        "MEMEXPORTER_DEBUG_TOKEN",  # diagnose/token.py: the /debug/* token, shared with memexporter inspect
    }
)
"""Read by the exporter, but not ``start()`` keywords (those are ``config.KNOBS``)."""
TOOLING_VARIABLES = frozenset(
    {
        "MEMEXPORTER_VENV",
        "MEMEXPORTER_TORCH_VERSION",
        "MEMEXPORTER_TORCH_INDEX",
        "MEMEXPORTER_SETUP_RETRY",
        "MEMEXPORTER_GPU_CHECK_DIR",
        "MEMEXPORTER_BASE",
        "MEMEXPORTER_RULES_PRESET",
        "MEMEXPORTER_REQUIRE_BINARIES",
        "MEMEXPORTER_UPDATE_GOLDEN",
        "MEMEXPORTER_STRESS_SECONDS",
    }
)
"""Read by the repository's scripts, compose file and tests, never by the exporter: not typos."""
TOOLING_PREFIXES = ("MEMEXPORTER_TEST_", "MEMEXPORTER_BIN_")

_said: set[str] = set()
_said_lock = threading.Lock()


def warn_once(key: str, message: str) -> None:
    """A WARNING the first time ``key`` is seen in this process, then nothing."""
    with _said_lock:
        if key in _said:
            return
        _said.add(key)
    log.warning(message)


def check_overridden(
    name: str, variable: str, value: object, environ: Mapping[str, str], parse: Callable[[str, object], Any]
) -> None:
    """Parse ``environ[variable]`` although the explicit ``name=value`` wins; say once if it is bad."""
    text = environ.get(variable, "")
    if text == "":
        return
    try:
        parse(variable, text)
    except (TypeError, ValueError) as exc:
        reason = str(exc).removeprefix("memexporter: ")
        warn_once(
            f"overridden:{variable}={text}",
            f"memexporter: {reason}. Ignored here: {name}={value!r} is given explicitly and wins. "
            f"Fix or unset {variable}: where nothing overrides it, start() refuses it",
        )


def unknown_variables(environ: Mapping[str, str], known: Collection[str]) -> dict[str, str | None]:
    """``MEMEXPORTER_*`` variables that nothing reads: ``{name: the closest known name, or None}``.
    The repository's own tooling variables are not typos."""
    out: dict[str, str | None] = {}
    for name in sorted(environ):
        if not name.upper().startswith(PREFIX) or name in known or name in TOOLING_VARIABLES:
            continue
        if name.startswith(TOOLING_PREFIXES):
            continue
        # Compared without the shared prefix, which would make every name look close to every other.
        suffixes = {k.removeprefix(PREFIX): k for k in known}
        close = difflib.get_close_matches(name.upper().removeprefix(PREFIX), sorted(suffixes), n=1, cutoff=0.6)
        out[name] = suffixes[close[0]] if close else None
    return out


def warn_unknown_variables(environ: Mapping[str, str], known: Collection[str]) -> None:
    """Say once per variable that an unknown ``MEMEXPORTER_*`` variable is ignored, with the likely name."""
    for name, close in unknown_variables(environ, known).items():
        if close is None:
            hint = (
                f"memexporter reads {PREFIX}<a start() keyword in capitals>, and {', '.join(sorted(OTHER_VARIABLES))}"
            )
        elif close == name.upper():
            hint = f"did you mean {close}? (environment variables are case-sensitive)"
        else:
            hint = f"did you mean {close}?"
        # The name only, never the value: a mistyped debug-token variable holding a secret must not
        # put the secret in the job's log.
        warn_once(f"unknown:{name}", f"memexporter: ignoring the unknown environment variable {name}; {hint}")
