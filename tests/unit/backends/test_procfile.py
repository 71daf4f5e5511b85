"""backends/procfile.py: a ``/proc`` file read through one descriptor a process, closed by ``stop()``.

The files are stand-ins in a temporary folder (what is checked is the descriptors, not ``/proc``'s
contents); ``HostBackend`` reads them as it reads ``/proc/self/statm``."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from memexporter.backends import procfile
from memexporter.backends.host import HostBackend
from memexporter.backends.procfile import ProcFile
from tests.support.descriptors import open_on

PAGE = os.sysconf("SC_PAGE_SIZE")


def both_at_once(monkeypatch: pytest.MonkeyPatch, read: Callable[[], object]) -> list[object]:
    """``read()`` on two threads whose first ``os.open`` calls wait for each other (up to 1 s): what two
    threads reading for the first time do when the first one's ``open`` lets go of the GIL."""
    meet = threading.Barrier(2, timeout=0.3)
    real = os.open

    def slow_open(path: str, flags: int, *args: int) -> int:
        with contextlib.suppress(threading.BrokenBarrierError):  # the other never came: it waited for the lock
            meet.wait()
        return real(path, flags, *args)

    monkeypatch.setattr(procfile.os, "open", slow_open)
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(read())) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    monkeypatch.undo()
    return got


def test_two_threads_reading_first_open_one_descriptor_which_stop_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 40: the training thread's phase and the publishing thread's collection read the RSS for the first
    # time together; each opened /proc/self/statm and one descriptor outlived stop(), one run in five.
    statm = tmp_path / "statm"
    statm.write_text("5000 1200 300 1 0 900 0\n")
    host = HostBackend(statm=str(statm))
    assert both_at_once(monkeypatch, host.rss) == [1200 * PAGE] * 2
    assert len(open_on(statm)) == 1
    host.close()
    assert open_on(statm) == []
    statm.write_text("5000 1300 300 1 0 900 0\n")
    assert host.rss() == 1300 * PAGE  # read after stop(), as a phase closed then does
    assert open_on(statm) == []


def test_a_release_reopens_at_the_next_read_and_a_close_never(tmp_path: Path) -> None:
    path = tmp_path / "status"
    path.write_text("VmHWM:\t  100 kB\n")
    f = ProcFile(str(path), 64)
    assert f.read() == b"VmHWM:\t  100 kB\n" and len(open_on(path)) == 1
    f.release()
    assert open_on(path) == []
    assert f.read() is not None and len(open_on(path)) == 1
    f.close()
    assert f.read() == b"VmHWM:\t  100 kB\n" and open_on(path) == []
    assert ProcFile(str(tmp_path / "missing"), 64).read() is None


def test_a_forked_child_opens_its_own_and_the_lock_is_new(tmp_path: Path) -> None:
    path = tmp_path / "statm"
    path.write_text("1 2 3\n")
    f = ProcFile(str(path), 64)
    assert f.read() == b"1 2 3\n"
    inherited = open_on(path)
    with procfile._opening:  # held by another thread at the fork: the child must not wait for it
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit status
            ok = f.read() == b"1 2 3\n" and len(open_on(path)) == len(inherited) + 1
            os._exit(0 if ok else 1)
    deadline = time.monotonic() + 10
    while (status := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if status[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on its first read: it waited for the parent's lock")
    assert os.waitstatus_to_exitcode(status[1]) == 0
    assert open_on(path) == inherited
    f.close()
