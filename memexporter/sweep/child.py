"""One run of a sweep: a fresh child process with the exporter on, watched over its ``/metrics``.

The exporter starts in the child the zero-touch way (``memexporter.bootstrap`` on ``PYTHONPATH``
and ``MEMEXPORTER_AUTOSTART=1``), so a plain ``python train.py`` is measured with no code change,
and ``memexporter demo`` / ``memexporter run`` start it themselves from the same variables. The
child serves on a loopback port the sweep picks. The sweep polls ``memexporter_steps_total`` every
``POLL_SECONDS``; after K steps it ends the child the way a user would (SIGINT, as Ctrl-C does,
then SIGTERM, then SIGKILL), to its whole process group, so launchers and workers end too.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import BinaryIO, cast

from memexporter.bootstrap import path as bootstrap_path
from memexporter.sweep.reading import Observed, parse

POLL_SECONDS = 0.05
TAIL_BYTES = 32 * 1024
BOOTSTRAP_FAILED = "memexporter bootstrap: not started"
# No proxy for a loopback scrape, whatever http_proxy says.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    """A loopback port that is free now, below the kernel's ephemeral range: a child importing torch
    binds seconds later, and an ephemeral port could meanwhile go to some outgoing connection."""
    try:
        high = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text(encoding="ascii").split()[0]) - 1
    except (OSError, ValueError, IndexError):
        high = 32767
    for _ in range(200):
        port = random.randint(10000, max(high, 10001))
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            with contextlib.suppress(OSError):
                s.bind(("127.0.0.1", port))
                return port
    raise OSError("memexporter sweep: no free loopback port found in 200 tries")


def child_env(port: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: the caller's, plus the bootstrap and the exporter's address. TLS
    is turned off and the server forced on: the sweep reads plain HTTP on loopback."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (bootstrap_path(), env.get("PYTHONPATH", "")) if p)
    env.update(MEMEXPORTER_AUTOSTART="1", MEMEXPORTER_PORT=str(port), MEMEXPORTER_ADDR="127.0.0.1",
               MEMEXPORTER_STRICT="1", MEMEXPORTER_HTTP="1", MEMEXPORTER_CERTFILE="", MEMEXPORTER_KEYFILE="")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class Tail:
    """The last ``TAIL_BYTES`` of a pipe, read by a daemon thread (the child never blocks on a full pipe)."""

    def __init__(self, stream: object) -> None:
        self._buf = bytearray()
        self._lock = threading.Lock()
        self.version = 0
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: object) -> None:
        # The thread owns the pipe and closes it at EOF: closing it from outside while a read is
        # blocked (a grandchild may hold the write end) could hand the fd number to another file.
        if stream is None:
            return
        with cast(BinaryIO, stream) as pipe:
            while chunk := pipe.read1(65536):  # type: ignore[attr-defined]  # a BufferedReader
                with self._lock:
                    self._buf += chunk
                    del self._buf[:-TAIL_BYTES]
                    self.version += 1

    def text(self, wait: float = 0.0) -> str:
        self._thread.join(wait)
        with self._lock:
            return self._buf.decode("utf-8", errors="replace")


@dataclass
class Outcome:
    """What one child did. ``exit_code`` is negative for a signal, as ``Popen.returncode``;
    ``stopped_by`` says why the sweep ended it (``steps``, ``timeout``, ``interrupt``,
    ``exporter``) or is ``None`` when it exited by itself."""

    argv: list[str]
    port: int
    observed: Observed = field(default_factory=Observed)
    step_seconds: float | None = None
    exit_code: int | None = None
    stopped_by: str | None = None
    max_rss: int = 0  # bytes, ru_maxrss of the child and its waited-for descendants (wait4)
    interrupted: bool = False  # Ctrl-C reached the sweep during this run
    stderr: str = ""
    stdout: str = ""
    wall_seconds: float = 0.0


class StepClock:
    """Mean seconds per step from polls: each step count change is placed halfway between the poll
    that last saw the old count and the one that saw the new, so the mean over steps ``a..b`` is
    off by at most ``POLL_SECONDS / (b - a)`` (plus the scrape time)."""

    def __init__(self) -> None:
        self._prev: tuple[float, int] | None = None
        self.first: tuple[float, int] | None = None
        self.last: tuple[float, int] | None = None

    def observe(self, t: float, steps: int) -> None:
        if self._prev is not None and steps > self._prev[1] >= 0 and steps >= 1:
            mark = ((self._prev[0] + t) / 2, steps)
            self.first = self.first or mark
            self.last = mark
        self._prev = (t, steps)

    @property
    def seconds(self) -> float | None:
        if self.first is None or self.last is None or self.last[1] <= self.first[1]:
            return None
        return (self.last[0] - self.first[0]) / (self.last[1] - self.first[1])


class Child:
    """Run ``argv`` until ``steps`` steps, its exit, ``timeout`` seconds, or Ctrl-C (``KeyboardInterrupt``)."""

    def __init__(self, argv: Sequence[str], steps: int, timeout: float, grace: float,
                 on_poll: Callable[[int], None] | None = None, env: Mapping[str, str] | None = None) -> None:
        self.out = Outcome(list(argv), free_port())
        self.steps, self.timeout, self.grace = steps, timeout, grace
        self._on_poll = on_poll or (lambda _steps: None)
        self._env = child_env(self.out.port, env)
        self._clock = StepClock()
        self._proc: subprocess.Popen[bytes] | None = None

    def run(self) -> Outcome:
        started = time.monotonic()
        # A new session: the terminal's Ctrl-C reaches the sweep only, which then ends the child itself.
        self._proc = subprocess.Popen(self.out.argv, env=self._env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, start_new_session=True)
        err, out = Tail(self._proc.stderr), Tail(self._proc.stdout)
        try:
            self._watch(started, err)
        except KeyboardInterrupt:
            self.out.interrupted = True
            self._stop("interrupt")
        finally:
            if self.out.exit_code is None:  # an unexpected error: never leave the child behind
                self._stop(self.out.stopped_by or "error")
            self.out.stderr, self.out.stdout = err.text(wait=2.0), out.text(wait=2.0)
            self.out.wall_seconds = time.monotonic() - started
            self.out.step_seconds = self._clock.seconds
        return self.out

    def _watch(self, started: float, err: Tail) -> None:
        url, seen = f"http://127.0.0.1:{self.out.port}/metrics", -1
        while not self._reap(0.0):
            t0 = time.monotonic()
            with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
                with _OPENER.open(url, timeout=5) as resp:
                    reading = parse(resp.read().decode("utf-8", errors="replace"))
                self.out.observed.add(reading)
                self._clock.observe((t0 + time.monotonic()) / 2, reading.steps)
                self._on_poll(reading.steps)
            if self.out.observed.steps >= self.steps:
                self._stop("steps")
                return
            if err.version != seen:
                seen = err.version
                if BOOTSTRAP_FAILED in err.text():  # the child runs on, but without an exporter to read
                    self._stop("exporter")
                    return
            if time.monotonic() - started > self.timeout:
                self._stop("timeout")
                return
            time.sleep(max(0.0, POLL_SECONDS - (time.monotonic() - t0)))

    def _signal(self, sig: int) -> None:
        assert self._proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    def _stop(self, why: str) -> None:
        """SIGINT, then SIGTERM, then SIGKILL, to the child's process group; a second Ctrl-C goes straight to SIGKILL."""
        self.out.stopped_by = self.out.stopped_by or why

        def kill_now(signum: int, frame: FrameType | None) -> None:
            self.out.interrupted = True
            self._signal(signal.SIGKILL)

        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, kill_now) if main else None
        try:
            for sig, wait in ((signal.SIGINT, self.grace), (signal.SIGTERM, 5.0), (signal.SIGKILL, None)):
                if self.out.exit_code is not None:
                    break
                self._signal(sig)
                self._reap(wait)
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)

    def _reap(self, wait: float | None) -> bool:
        """Wait up to ``wait`` seconds (``None``: for ever) for the child; record its exit and peak RSS."""
        assert self._proc is not None
        if self.out.exit_code is not None:
            return True
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            pid, status, usage = os.wait4(self._proc.pid, 0 if wait is None else os.WNOHANG)
            if pid:
                self.out.exit_code = self._proc.returncode = os.waitstatus_to_exitcode(status)
                self.out.max_rss = int(usage.ru_maxrss) * (1 if sys.platform == "darwin" else 1024)  # KiB on Linux
                # Orphans of the run (workers, a launcher's children) must not hold memory into the next run.
                self._signal(signal.SIGKILL)
                return True
            if deadline is None or time.monotonic() >= deadline:
                return False
            time.sleep(POLL_SECONDS)
