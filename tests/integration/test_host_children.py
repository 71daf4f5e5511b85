"""The host backend over real child processes (each started as a subprocess and waited on): their
resident memory, grandchildren included, as ``children_rss()`` sums it, and the fast path through
``/proc/PID/task/TID/children`` (the rest of the backend: tests/unit/backends/test_host.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memexporter.backends.host import HostBackend

pytestmark = pytest.mark.integration

MiB = 1 << 20


def test_children_rss_counts_real_child_processes() -> None:
    import subprocess
    import sys

    backend = HostBackend()
    before = backend.children_rss()
    # A child that holds ~64 MiB resident, and a grandchild of its own.
    code = (
        "import subprocess, sys, time; b = bytearray(64 << 20); "
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); print('ready', flush=True); time.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        during = backend.children_rss()
        assert during - before >= 64 * MiB
        import psutil

        expected = sum(c.memory_info().rss for c in psutil.Process().children(recursive=True))
        assert abs(during - expected) <= 8 * MiB, "agrees with psutil's full scan"
    finally:
        for c in __import__("psutil").Process().children(recursive=True):
            c.kill()
        child.wait()


def test_proc_children_lists_name_a_real_child() -> None:
    # The fast path children_rss() takes instead of psutil's scan of every process.
    import os
    import subprocess
    import sys

    from memexporter.backends.host import _children_from_proc

    if not any(Path("/proc/self/task").glob("*/children")):
        pytest.skip("no /proc/PID/task/TID/children here (kernel without CONFIG_PROC_CHILDREN): psutil scans instead")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        listed = _children_from_proc(os.getpid())
        assert listed is not None and child.pid in listed
    finally:
        child.kill()
        child.wait()
