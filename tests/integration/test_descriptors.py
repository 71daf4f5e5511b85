"""Every descriptor ``start()`` opens in the job, ``stop()`` closes (docs/security.md, "stop()"): after a
served run with clients holding connections, after a strict start that fails, and after a phase the user
closes once the exporter has stopped (it still reads the memory, and must not reopen what stop() closed).

Compared descriptor by descriptor (each with what it is open on), with the worker's garbage collected
first and none collected during the test (``tests.support.hostile.no_collection``): a count of a pytest
worker's descriptors once came back one short, when a collection in the middle of the test closed a
socket that an earlier test's garbage held (issue 40)."""

from __future__ import annotations

import errno
import socket

import pytest

import memexporter
from tests.support.descriptors import changed, descriptors
from tests.support.hostile import no_collection
from tests.support.web import get_text

pytestmark = pytest.mark.usefixtures("no_exporter")


def test_a_served_run_with_clients_leaves_nothing_open_after_stop() -> None:
    with no_collection():
        before = descriptors()
        exp = memexporter.start(port=0, addr="127.0.0.1")
        held = [socket.create_connection(("127.0.0.1", exp.port or 0), timeout=5) for _ in range(10)]
        get_text(f"http://127.0.0.1:{exp.port}/metrics", 10)
        exp.stop()
        for s in held:
            s.close()
        assert not changed(before, descriptors())


def test_a_strict_start_that_fails_leaves_nothing_open() -> None:
    # Before: the host's /proc/self/statm descriptor stayed open until the failed exporter was collected
    # (stop() closed it only for the exporter that had become the running one).
    with socket.socket() as holder, no_collection():
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        before = descriptors()
        with pytest.raises(OSError) as info:
            memexporter.start(port=holder.getsockname()[1], addr="127.0.0.1", strict=True)
        assert info.value.errno == errno.EADDRINUSE
        del info  # its traceback holds the exporter: what is checked is that stop() closed it, not the collector
        assert not changed(before, descriptors())


def test_a_phase_closed_after_stop_reopens_nothing() -> None:
    # Before: its reading reopened /proc/self/statm, which nothing closed until the exporter was collected.
    with no_collection():
        before = descriptors()
        exp = memexporter.start(port=0, addr="127.0.0.1")
        evaluation = memexporter.phase("eval")
        evaluation.__enter__()
        exp.stop()
        evaluation.__exit__(None, None, None)
        assert not changed(before, descriptors())
