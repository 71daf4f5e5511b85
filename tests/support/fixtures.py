"""The fixtures every part of the suite may use, in one pytest plugin (``pytest_plugins`` in
``tests/conftest.py`` registers it once). A fixture of one folder only stays in that folder's
``conftest.py`` (tests/unit/tracking/, tests/integration/, tests/integration/frameworks/).

- ``_runtime_dir`` (autouse): the debug token files of every test, and of the children it starts,
  go to a temporary ``$XDG_RUNTIME_DIR``, never the user's.
- ``_logger_restored`` (autouse): memexporter's logger as it was before the test (a command run in
  the test process sets its own handler, and a later test's stderr would get its lines).
- ``no_exporter``: no exporter runs in this process before the test or after it.
  ``pytestmark = pytest.mark.usefixtures("no_exporter")`` for a whole file.
- ``otel_push_environment``: that, and none of the shell's ``OTEL_*``/``MEMEXPORTER_*`` variables.
- ``dead_pid``: the id of a process that has exited, as a file left by a killed job names it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator

import psutil
import pytest

import memexporter


@pytest.fixture(autouse=True)
def _runtime_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The debug endpoints' token files go to ``$XDG_RUNTIME_DIR/memexporter``: a test's go to a
    temporary folder, never the user's runtime folder (children started by a test inherit it)."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path_factory.mktemp("runtime")))


@pytest.fixture(autouse=True)
def _logger_restored() -> Iterator[None]:
    """memexporter's logger (handlers, level, propagation) as it was before the test."""
    logger = logging.getLogger("memexporter")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]


@pytest.fixture
def no_exporter() -> Iterator[None]:
    """No exporter runs in this process before the test or after it (the exporter is a
    process-wide singleton; a test that fails half-way must not leave one to the next)."""
    memexporter.stop()
    yield
    memexporter.stop()


@pytest.fixture
def otel_push_environment(monkeypatch: pytest.MonkeyPatch, no_exporter: None) -> None:
    """An OTLP push set up only by what the test sets: no exporter around it, none of the
    ``OTEL_*`` or ``MEMEXPORTER_*`` variables of the shell running the tests, and an export
    every 100 ms (``OTEL_METRIC_EXPORT_INTERVAL``)."""
    for name in [n for n in os.environ if n.startswith(("OTEL_", "MEMEXPORTER_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "100")


@pytest.fixture
def dead_pid() -> int:
    """The id of a process that has exited and been reaped: a child forked here that exits at
    once (it runs nothing else, so forking a process with threads is safe)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


@pytest.fixture
def new_children() -> Callable[[], list[psutil.Process]]:
    """The worker's child processes that this test started: its children now, less those it began with
    (an earlier test's that is still exiting: "no child" of a whole worker failed a fresh-clone run)."""
    before = {p.pid for p in psutil.Process().children()}
    return lambda: [p for p in psutil.Process().children() if p.pid not in before]
