"""Find the real binaries the tests use, and skip (or fail) with a reason when one is missing.

Tests call ``require("promtool")``. When the binary is missing the test is skipped with a reason
that names the binary and the Debian package that ships it. With ``MEMEXPORTER_REQUIRE_BINARIES=1``
(set in CI, where the packages are installed) a missing binary fails the test instead, so a broken
CI image cannot pass by skipping.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REQUIRE_ENV = "MEMEXPORTER_REQUIRE_BINARIES"

# name -> (file names to look for, in order; where it comes from)
KNOWN: dict[str, tuple[tuple[str, ...], str]] = {
    "prometheus": (("prometheus",), "apt-get install prometheus"),
    "promtool": (("promtool",), "apt-get install prometheus"),
    # Debian installs Alertmanager as prometheus-alertmanager; upstream tarballs call it alertmanager.
    "alertmanager": (("prometheus-alertmanager", "alertmanager"), "apt-get install prometheus-alertmanager"),
    "amtool": (("amtool",), "apt-get install prometheus-alertmanager"),
    # VictoriaMetrics single-node and its rule evaluator (tests/support/victoriametrics.py).
    "victoria-metrics": (("victoria-metrics", "victoria-metrics-prod"), "apt-get install victoria-metrics"),
    "vmalert": (("vmalert", "vmalert-prod"), "apt-get install victoria-metrics"),
    "torchrun": (("torchrun",), "pip install torch"),
    # Compose v1: validates a compose file against the schema without an engine (`config -q`).
    "docker-compose": (("docker-compose",), "apt-get install docker-compose"),
}
_EXTRA_DIRS = ("/usr/bin", "/usr/local/bin", "/usr/sbin")


def find(name: str) -> str | None:
    """Absolute path of the binary ``name`` (a key of ``KNOWN`` or a plain file name), or None.

    ``MEMEXPORTER_BIN_<NAME>`` (e.g. ``MEMEXPORTER_BIN_PROMETHEUS``) points at a specific build.
    """
    override = os.environ.get(f"MEMEXPORTER_BIN_{name.upper().replace('-', '_')}")
    if override:
        return override if os.access(override, os.X_OK) else None
    candidates = KNOWN.get(name, ((name,), ""))[0]
    for candidate in candidates:
        found = shutil.which(candidate)
        if found:
            return found
    for candidate in candidates:
        for folder in _EXTRA_DIRS:
            path = Path(folder) / candidate
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    return None


def require(name: str) -> str:
    """The path of ``name``; skip the test (fail under ``MEMEXPORTER_REQUIRE_BINARIES=1``) if missing."""
    path = find(name)
    if path:
        return path
    names, source = KNOWN.get(name, ((name,), "install it"))
    reason = f"binary {' or '.join(names)!s} not found on PATH ({source})"
    if os.environ.get(REQUIRE_ENV, "") not in ("", "0"):
        pytest.fail(f"{reason}; {REQUIRE_ENV} is set, so missing binaries fail", pytrace=False)
    pytest.skip(reason)
