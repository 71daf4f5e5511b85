"""Run checks inside a forked child (a DataLoader worker, say) and bring the answers back.

The child's memory is a copy of the parent's: whatever the child does can never be seen from
the parent by reading the parent's objects. So the child observes, and sends what it saw to the
parent as JSON over a pipe; the test asserts on that report.
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any

Report = dict[str, Any]


def _send(fd: int, obj: object) -> None:
    data = (json.dumps(obj) + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


def _receive(fd: int, deadline: float) -> Report:
    buf = b""
    while not buf.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise TimeoutError("the forked child sent no report in time")
        chunk = os.read(fd, 65536)
        if not chunk:
            raise EOFError(f"the forked child exited without a report (got {buf[:200]!r})")
        buf += chunk
    report: Report = json.loads(buf)
    return report


def run_forked(
    at_fork: Callable[[], Report],
    in_parent: Callable[[], None],
    afterwards: Callable[[], Report],
    timeout: float = 60.0,
) -> tuple[Report, Report]:
    """Fork. The child runs ``at_fork()`` and reports it; the parent then runs ``in_parent()``
    (while the child is alive and waiting); then the child runs ``afterwards()`` and reports that.

    Returns both reports. A child that raises is reported as ``{"child raised": traceback}``; the
    child always leaves with ``os._exit``, so no test machinery runs twice.
    """
    up_r, up_w = os.pipe()
    down_r, down_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            os.close(up_r)
            os.close(down_w)
            _send(up_w, at_fork())
            os.read(down_r, 1)  # wait for in_parent()
            _send(up_w, afterwards())
        except BaseException:
            _send(up_w, {"child raised": traceback.format_exc()})
        finally:
            os._exit(0)
    os.close(up_w)
    os.close(down_r)
    deadline = time.monotonic() + timeout
    try:
        first = _receive(up_r, deadline)
        if "child raised" in first:
            return first, {}
        in_parent()
        os.write(down_w, b"x")
        return first, _receive(up_r, deadline)
    finally:
        os.close(up_r)
        os.close(down_w)
        _reap(pid, time.monotonic() + 10)


def _reap(pid: int, deadline: float) -> None:
    """Wait for the child to exit on its own until ``deadline``, then kill it (a hung child)."""
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return
        time.sleep(0.01)
