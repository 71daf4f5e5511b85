"""The job's side of its helper: start it, publish snapshots, answer what it sends, supervise it, stop it.

One thread in the job (``memexporter-publish``), never the training thread: once every ``PUBLISH_EVERY``
seconds it collects the registry and renders it (``render.py``: about 4 ms of CPU on the launch-bound
stand-in) onto the board, whatever the scrapers do; no request makes it render. Between publishes it
waits on the channel: the bind's outcome (``bound``: the "serving" line and the debug token file follow
the port; ``failed``: logged as before, or raised by a strict ``start()``), the helper's dropped-connection
counts (into the ``ConnectionStats`` that ``memexporter_http_dropped_connections_total`` reads), and the
debug requests the helper admitted, answered here by the debug apps within their own bounds. It never blocks
on the helper: what it sends is queued (``Channel.post``) and written when the socket takes it.

``start()`` spawns and returns: only ``wait()`` (a strict ``start()``, ``Exporter.port``) waits for the
bind's report, ``REPORT_WAIT`` seconds at most. Once a helper has served, the thread (its loop: ``loop.py``)
supervises it (``supervise.py``; one helper: ``running.py``): a helper that exits, or does not answer the heartbeat's pings for ``Policy.heartbeat``
seconds (killed), is said in one line and started again on the same port after a backoff, with the same
settings (the debug token too) and the board as it is, so the new helper serves the latest snapshot at once;
``memexporter_helper_restarts_total`` counts them. ``stop()`` sends SIGTERM (the helper exits at once: no
grace period after a deliberate stop) and reaps it, so the port is free when it returns. In a forked child
(a DataLoader worker) ``close_in_child()`` drops the inherited descriptors: the child never talks to the
helper, never signals or restarts it, and has no publishing thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client.registry import Collector

from memexporter.config import Config
from memexporter.serving.board import Board
from memexporter.serving.conn import ConnectionStats
from memexporter.serving.job import supervise
from memexporter.serving.job.binding import PortAdvice, log_failure
from memexporter.serving.job.debug import Debug
from memexporter.serving.job.loop import STOP_WAIT, Loop
from memexporter.serving.job.render import render
from memexporter.serving.job.running import Running, settings
from memexporter.serving.server import url
from memexporter.tracking.history import History

log = logging.getLogger("memexporter")

REPORT_WAIT = 10.0  # seconds a strict start() (or Exporter.port) waits for the helper to say how the bind went
STOP_REPORT_WAIT = 2.0  # seconds stop() waits for a bind report not yet in: a short run still hears of a taken port


class Link(Loop):
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
        self.levers: Callable[[], list[dict[str, Any]]] = list  # what would fit, for the live page
        self.port: int | None = None
        self.error: OSError | None = None
        self.board: Board | None = None  # made by start(): the memory may not be there (ENOSPC, EPERM)
        self.helper: Running | None = None  # the helper running now (None between a helper's exit and the next)
        self.supervisor = supervise.Supervisor(supervise.POLICY)
        self._reported = threading.Event()
        self._published = threading.Condition()
        self._asked = self._answered = 0  # flush() tickets: the last asked, the last a finished publish answered
        self._wake_r, self._wake_w = os.pipe()  # flush() and stop() wake the thread through it
        os.set_blocking(self._wake_w, False)
        self._lock = threading.Lock()  # who starts or ends a helper: the thread (restarts) or stop()
        self._closing = False  # no helper is started or answered any more
        self._stopped = False
        self._served = False  # a helper has bound: from then on, one that exits is started again
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="memexporter-publish", daemon=True)

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        """The helper process running now."""
        helper = self.helper
        return helper.proc if helper is not None else None

    @property
    def url(self) -> str | None:
        return url(self.config.addr, self.port, bool(self.config.certfile)) if self.port is not None else None

    def start(self) -> None:
        """Make the board, start the helper and the thread (which publishes the first snapshot at once, while
        the helper's interpreter starts). ``OSError`` when either cannot be had (the caller logs it, or raises
        it when strict)."""
        try:
            self.board = Board()
        except OSError as exc:
            raise OSError(
                exc.errno, f"memexporter: cannot make the snapshot board (the memory the HTTP helper reads): {exc}"
            ) from exc
        self._spawn()
        self._thread.start()

    def _spawn(self) -> None:
        """Start a helper with this job's settings (a restarted one: on the port the first one bound, with the
        same debug token, so the token file stays right)."""
        assert self.board is not None
        port = self.port if self.port is not None else self.requested
        message = settings(self.config, self.rank, port, self.grace, self.debug)
        with self._lock:
            if self._closing:
                return
            helper = Running(self.board.fd)
            helper.channel.post(message)
            self.helper = helper

    def wait(self, timeout: float = REPORT_WAIT) -> bool:
        """Wait up to ``timeout`` seconds for the bind's report; False when none came."""
        return self._reported.wait(timeout)

    def flush(self, timeout: float = REPORT_WAIT) -> bool:
        """Publish now (on the publishing thread) and wait until that snapshot is on the board: for a
        caller that must see what it just did (the tests, a last publish). False after ``timeout`` s."""
        board = self.board
        if board is None or not self._thread.is_alive() or self._closing:
            return False
        with self._published:
            # A ticket, not the board's generation: a publish already rendering when flush() was called ends
            # with generation + 1 but shows the state from before the call (a test read step 9 after step 10).
            self._asked += 1
            ticket = self._asked
            self._wake()
            return self._published.wait_for(lambda: self._answered >= ticket or self._closing, timeout)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe is awake enough
            os.write(self._wake_w, b"w")

    def record_end(self, words: Mapping[str, Any]) -> None:
        """The job's last words, on the board for the helper (``serving/ending.py``)."""
        if os.getpid() == self._pid and self.board is not None:
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
        with self._published:
            asked = self._asked  # the flush() calls this publish answers: made before its render starts
        try:
            assert self.board is not None
            self.board.publish(render(self.registry, self.history, self.levers()))
        except OSError as exc:  # the board cannot grow (ENOSPC, EPERM, EFBIG): no HTTP from here on, said once
            log_failure(f"memexporter: the snapshot board cannot grow: {exc}")
            self._end_helper()
        except Exception:  # never into training; the last snapshot stays served
            log.debug("memexporter: publishing a snapshot failed", exc_info=True)
        with self._published:
            self._answered = max(self._answered, asked)
            self._published.notify_all()

    def stop(self) -> None:
        """End the helper (SIGTERM, then SIGKILL after ``STOP_WAIT`` s), so the port is free on return."""
        if os.getpid() != self._pid or self._stopped:
            return
        self._stopped = True
        if self.helper is not None and not self._reported.is_set() and threading.current_thread() is not self._thread:
            # A run that ends before the helper reported (its start takes ~0.2 s, seconds on a loaded box)
            # would otherwise never say that the port was taken.
            self.wait(STOP_REPORT_WAIT)
        self._end_helper()
        self._wake()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(STOP_WAIT)
        with self._published:
            self._published.notify_all()
        if self.board is not None:
            self.board.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _end_helper(self) -> None:
        """No helper from now on: the running one ended and reaped, none started again."""
        with self._lock:
            self._closing = True
            helper, self.helper = self.helper, None
        if helper is not None:
            helper.end(STOP_WAIT)

    def close_in_child(self) -> None:
        """In a forked child: close the inherited descriptors (no lock: another thread of the parent may
        have held one at the fork); the helper is the parent's alone."""
        self._closing = self._stopped = True
        helper, self.helper = self.helper, None
        if helper is not None:
            helper.close_in_child()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.board is not None:
            self.board.close_in_child()
