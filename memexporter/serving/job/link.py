"""The job's side of its helper: start it, publish snapshots, answer what it sends, stop it.

One thread in the job (``memexporter-publish``), never the training thread: once every ``PUBLISH_EVERY``
seconds it collects the registry and renders it (``render.py``: about 4 ms of CPU on the launch-bound
stand-in) onto the board, whatever the scrapers do; no request makes it render. Between publishes it
waits on the channel: the bind's outcome (``bound``: the "serving" line and the debug token file follow
the port; ``failed``: logged as before, or raised by a strict ``start()``), the helper's dropped-connection
counts (into the ``ConnectionStats`` that ``memexporter_http_dropped_connections_total`` reads), and the
debug requests the helper admitted, answered here by the debug apps within their own bounds.

``start()`` spawns and returns: only ``wait()`` (a strict ``start()``, ``Exporter.port``) waits for the
bind's report, ``REPORT_WAIT`` seconds at most. ``stop()`` sends SIGTERM (the helper exits at once: no grace
period after a deliberate stop) and reaps it, so the port is free when it returns. A helper that cannot be
started or dies is said once; training goes on. In a forked child (a DataLoader worker) ``close_in_child()``
drops the inherited descriptors: the child never talks to the helper, never signals it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import IO, Any

from prometheus_client.registry import Collector

from memexporter.config import Config
from memexporter.serving.board import Board
from memexporter.serving.channel import Channel
from memexporter.serving.conn import ConnectionStats
from memexporter.serving.job.binding import PortAdvice, failed, log_failure
from memexporter.serving.job.debug import Debug, answer
from memexporter.serving.job.render import render
from memexporter.serving.job.spawn import spawn, tail
from memexporter.serving.server import url
from memexporter.tracking.history import History

log = logging.getLogger("memexporter")

PUBLISH_EVERY = 1.0  # seconds between snapshots: a scrape's figures are at most about this old
REPORT_WAIT = 10.0  # seconds a strict start() (or Exporter.port) waits for the helper to say how the bind went
STOP_WAIT = 2.0  # seconds stop() waits for the helper to exit after SIGTERM, before SIGKILL
STOP_REPORT_WAIT = 2.0  # seconds stop() waits for a bind report not yet in: a short run still hears of a taken port


class Link:
    """A started helper. ``port`` is the bound port once reported (``wait()``), ``error`` the bind's failure."""

    def __init__(
        self,
        registry: Collector,
        history: History | None,
        config: Config,
        port: int,
        advice: PortAdvice,
        rank: str,
        stats: ConnectionStats,
        debug: Debug | None = None,
        on_bound: Callable[[int | None], None] | None = None,
        grace: float | None = None,
    ) -> None:
        self.registry, self.history, self.config, self.advice = registry, history, config, advice
        self.requested, self.rank, self.stats, self.debug, self.on_bound = port, rank, stats, debug, on_bound
        self.grace = grace
        self.steps: Callable[[], int] | None = None  # the step count, for the last words
        self.port: int | None = None
        self.error: OSError | None = None
        self.board = Board()
        self.proc: subprocess.Popen[bytes] | None = None
        self.channel: Channel | None = None
        self._errors: IO[bytes] | None = None
        self._reported = threading.Event()
        self._published = threading.Condition()
        self._wake_r, self._wake_w = os.pipe()  # flush() and stop() wake the thread through it
        os.set_blocking(self._wake_w, False)
        self._closing = False
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="memexporter-publish", daemon=True)

    @property
    def url(self) -> str | None:
        return url(self.config.addr, self.port, bool(self.config.certfile)) if self.port is not None else None

    def start(self) -> None:
        """Start the helper and the thread (which publishes the first snapshot at once, while the helper's
        interpreter starts). ``OSError`` when the helper cannot be started (the caller logs it, or raises
        it when strict)."""
        self.proc, self.channel, self._errors = spawn(self.board.fd)
        message: dict[str, Any] = {
            "t": "config",
            "pid": os.getpid(),
            "rank": self.rank,
            "addr": self.config.addr,
            "port": self.requested,
            "certfile": self.config.certfile,
            "keyfile": self.config.keyfile,
        }
        if self.grace is not None:
            message["grace"] = self.grace
        if self.debug is not None:
            message["debug"] = self.debug.settings()
        self.channel.send(message)
        self._thread.start()

    def wait(self, timeout: float = REPORT_WAIT) -> bool:
        """Wait up to ``timeout`` seconds for the bind's report; False when none came."""
        return self._reported.wait(timeout)

    def flush(self, timeout: float = REPORT_WAIT) -> bool:
        """Publish now (on the publishing thread) and wait until that snapshot is on the board: for a
        caller that must see what it just did (the tests, a last publish). False after ``timeout`` s."""
        if not self._thread.is_alive() or self._closing:
            return False
        with self._published:
            target = self.board.generation + 1
            self._wake()
            return self._published.wait_for(lambda: self.board.generation >= target or self._closing, timeout)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe is awake enough
            os.write(self._wake_w, b"w")

    def record_end(self, words: Mapping[str, Any]) -> None:
        """The job's last words, on the board for the helper (``serving/ending.py``)."""
        if os.getpid() == self._pid:
            with contextlib.suppress(Exception):
                self.board.record_end(words)

    def at_exit(self) -> None:
        """At interpreter exit (``atexit``: the interpreter still whole): publish a last snapshot, then stop
        publishing (a collection while the interpreter tears down would overwrite it), and say how it ends,
        naming an uncaught exception (``sys.last_value``)."""
        if os.getpid() != self._pid or self._closing:
            return
        self.flush(1.0)
        self._closing = True
        error = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        words: dict[str, Any] = {"atexit": True}
        if self.steps is not None:
            words["steps"] = self.steps()
        if error is not None:
            words["exception"] = type(error).__name__
        self.record_end(words)

    def _publish(self) -> None:
        try:
            self.board.publish(render(self.registry, self.history))
        except Exception:  # never into training; the last snapshot stays served
            log.debug("memexporter: publishing a snapshot failed", exc_info=True)
        with self._published:
            self._published.notify_all()

    def _run(self) -> None:
        channel = self.channel
        assert channel is not None
        next_publish, sock = time.monotonic(), channel.fileno()
        while not self._closing:
            try:
                ready = select.select([sock, self._wake_r], [], [], max(0.0, next_publish - time.monotonic()))[0]
            except (OSError, ValueError):  # closed by stop()
                return
            if self._closing:
                return
            if self._wake_r in ready:
                with contextlib.suppress(OSError):
                    os.read(self._wake_r, 512)
                next_publish = time.monotonic()
            if sock in ready:
                messages = channel.receive()
                if messages is None:
                    self._gone()
                    return
                for head, body in messages:
                    self._handle(head, body)
            if time.monotonic() >= next_publish:
                self._publish()
                next_publish = time.monotonic() + PUBLISH_EVERY

    def _handle(self, head: dict[str, Any], body: bytes) -> None:
        kind = head.get("t")
        if kind == "bound":
            self.port = int(head["port"])
            if self.on_bound is not None:  # before wait() returns: the "serving" line comes first
                self.on_bound(self.port)
            self._reported.set()
        elif kind == "failed":
            self.error = failed(
                int(head.get("errno") or 0), str(head.get("error")), self.config, self.requested, self.advice
            )
            if not self.config.strict:
                log_failure(str(self.error.strerror))
            if self.on_bound is not None:
                self.on_bound(None)
            self._reported.set()
        elif kind == "stats":
            self.stats.set(head.get("dropped") or {})
        elif kind == "debug":
            self._answer(head)

    def _answer(self, head: dict[str, Any]) -> None:
        apps = self.debug.apps if self.debug is not None else {}
        status, headers, body = answer(apps, str(head.get("path")), str(head.get("query") or ""))
        assert self.channel is not None
        self.channel.send({"t": "answer", "id": head.get("id"), "status": status, "headers": headers}, body)

    def _gone(self) -> None:
        """The channel's EOF: the helper exited. Reap it and say so once (unless stop() did it)."""
        code = self.proc.wait() if self.proc is not None else None
        if self._closing:
            return
        if not self._reported.is_set():
            self.error = OSError(
                0, f"memexporter: the HTTP helper exited with status {code} before serving: {self._tail()}"
            )
            if not self.config.strict:
                log_failure(str(self.error.strerror))
            self._reported.set()
        elif self.error is None:
            log.error(
                "memexporter: the HTTP helper exited with status %s; %s no longer answers. Training continues. %s",
                code,
                self.url,
                self._tail(),
            )

    def _tail(self) -> str:
        return tail(self._errors) if self._errors is not None else ""

    def stop(self) -> None:
        """End the helper (SIGTERM, then SIGKILL after ``STOP_WAIT`` s), so the port is free on return."""
        if os.getpid() != self._pid or (self._closing and self.proc is None):
            return
        if self.proc is not None and not self._reported.is_set() and threading.current_thread() is not self._thread:
            # A run that ends before the helper reported (its start takes ~0.2 s, seconds on a loaded box)
            # would otherwise never say that the port was taken.
            self.wait(STOP_REPORT_WAIT)
        self._closing = True
        proc, self.proc = self.proc, None
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.terminate()
            try:
                proc.wait(STOP_WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._wake()
        if self.channel is not None:
            self.channel.close()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(STOP_WAIT)
        with self._published:
            self._published.notify_all()
        self.board.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self._errors is not None:
            self._errors.close()

    def close_in_child(self) -> None:
        """In a forked child: close the inherited descriptors (no lock: another thread of the parent may
        have held one at the fork); the helper is the parent's alone."""
        self._closing = True
        self.proc = None
        if self.channel is not None:
            with contextlib.suppress(OSError):
                self.channel.sock.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.board.close_in_child()
