"""One started helper process, seen from the job: its process, its channel, its stderr, and its heartbeat.

The job may start several in its life (``supervise.py``): each ``Running`` owns what one helper needs, and
``end``, ``kill`` and ``reap`` give all of it back (the process reaped, the socket and the stderr file closed),
so that a helper replaced a thousand times leaves no zombie and no descriptor behind. Nothing here blocks
longer than ``wait`` seconds: a helper that does not exit on SIGTERM, or after its channel's EOF, is killed.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from typing import Any

from memexporter.config import Config
from memexporter.serving.job.debug import Debug
from memexporter.serving.job.spawn import spawn, tail

STARTING = 3  # times the heartbeat's limit a helper that has not reported its bind yet may stay silent


def settings(config: Config, rank: str, port: int, grace: float | None, debug: Debug | None) -> dict[str, Any]:
    """The ``config`` message a helper gets first: the same for every helper of a job (``port``: the one the
    first helper bound, once it did). The debug token travels here, never on the command line."""
    message: dict[str, Any] = {
        "t": "config",
        "pid": os.getpid(),
        "rank": rank,
        "addr": config.addr,
        "port": port,
        "certfile": config.certfile,
        "keyfile": config.keyfile,
    }
    if grace is not None:
        message["grace"] = grace
    if debug is not None:
        message["debug"] = debug.settings()
    return message


class Running:
    """A helper started on ``board_fd`` (``OSError`` when it cannot be). ``reported``: it said how its bind
    went; ``failure``: why it could not bind, when it said so."""

    def __init__(self, board_fd: int) -> None:
        self.proc, self.channel, self.errors = spawn(board_fd)
        self.started = time.monotonic()
        self.reported = False
        self.failure: str | None = None
        self._asked: float | None = None  # when the oldest ping not answered yet was sent

    @property
    def pid(self) -> int:
        return self.proc.pid

    def uptime(self) -> float:
        """Seconds since it was started."""
        return time.monotonic() - self.started

    def heard(self) -> None:
        """A message came: its loop turns (any message answers the pings before it)."""
        self._asked = None

    def ping(self, now: float) -> None:
        """Send the heartbeat's ping (queued: never blocks), timed from the first one not answered."""
        self.channel.post({"t": "ping"})
        if self._asked is None:
            self._asked = now

    def silent(self, now: float, limit: float) -> bool:
        """Whether a ping has waited more than ``limit`` seconds for its answer (stopped, deadlocked); three times
        that before it reported its bind: an interpreter starting on a loaded machine is not a hung one."""
        allowed = limit if self.reported else STARTING * limit
        return self._asked is not None and now - self._asked > allowed

    def tail(self) -> str:
        """The last lines of its stderr, on one line."""
        return tail(self.errors)

    def reap(self, wait: float) -> int | None:
        """After its channel's EOF: its exit status (killed when it has not exited within ``wait`` s)."""
        try:
            self.proc.wait(wait)
        except subprocess.TimeoutExpired:
            return self.kill()
        self.close()
        return self.proc.returncode

    def kill(self) -> int | None:
        """SIGKILL (a stopped process dies too), reap, close; its exit status."""
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.proc.wait()
        self.close()
        return self.proc.returncode

    def end(self, wait: float) -> None:
        """SIGTERM (the helper exits at once, with no grace period after a deliberate stop), SIGKILL after
        ``wait`` seconds; reaped and closed on return, so the port is free."""
        with contextlib.suppress(OSError):
            self.proc.terminate()
        try:
            self.proc.wait(wait)
        except subprocess.TimeoutExpired:
            self.kill()
        self.close()

    def close(self) -> None:
        self.channel.close()
        with contextlib.suppress(OSError, ValueError):
            self.errors.close()

    def close_in_child(self) -> None:
        """In a forked child: close the copies of its descriptors without a lock (another thread of the parent
        may have held one at the fork); the process is the parent's to signal and reap, never the child's."""
        with contextlib.suppress(OSError):
            self.channel.sock.close()
        with contextlib.suppress(OSError, ValueError):
            self.errors.close()
