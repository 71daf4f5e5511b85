"""The threads that answer requests whose head has arrived: at most ``WORKERS`` at once, the rest
in a queue. A thread waits ``LINGER`` seconds for the next request before it ends (a flood does
not pay a thread start per request; an idle exporter holds no worker). Each answer's CPU time is
charged to the server's budget. ``close()`` cuts every connection they hold, so a client cannot
keep one past stop."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from memexporter.serving.budget import Budget, Meter
from memexporter.serving.conn import Conn, ConnectionStats

log = logging.getLogger("memexporter")

WORKERS = 4  # requests answered at once (a scrape holds the GIL: more threads buy nothing)
LINGER = 2.0  # seconds an idle worker waits for the next request before it ends


class Workers:
    """``answer(conn)`` runs in a worker thread; the connection is closed afterwards, a failure
    is counted, and ``done()`` is called (the acceptor may accept again)."""

    def __init__(
        self,
        answer: Callable[[Conn], None],
        stats: ConnectionStats,
        done: Callable[[], None],
        budget: Budget | None = None,
    ) -> None:
        self._answer, self._stats, self._done = answer, stats, done
        self._budget = budget or Budget()
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._held: set[Conn] = set()  # answering or queued
        self._queue: deque[Conn] = deque()
        self._threads: list[threading.Thread] = []
        self._running = 0  # threads that have not decided to end
        self._idle = 0  # of which waiting for a request
        self._closing = False

    def held(self) -> int:
        """Connections answering or waiting for a worker."""
        with self._lock:
            return len(self._held)

    def submit(self, conn: Conn) -> None:
        with self._lock:
            if self._closing:
                conn.close()
                return
            self._held.add(conn)
            self._queue.append(conn)
            if self._idle >= len(self._queue):  # one of them takes it
                self._ready.notify()
                return
            if self._running >= WORKERS:
                return
            self._running += 1
            thread = threading.Thread(target=self._work, name="memexporter-http-worker", daemon=True)
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _next(self) -> Conn | None:
        """The next queued connection, waiting up to ``LINGER`` s; None: end this thread."""
        with self._lock:
            end = time.monotonic() + LINGER
            while not self._queue and not self._closing and (left := end - time.monotonic()) > 0:
                self._idle += 1
                self._ready.wait(left)
                self._idle -= 1
            if self._closing or not self._queue:
                self._running -= 1  # under the lock: submit() starts another if work comes now
                return None
            return self._queue.popleft()

    def _work(self) -> None:
        meter = Meter(self._budget)
        while (conn := self._next()) is not None:
            exc: Exception | None = None
            try:
                self._answer(conn)
            except Exception as e:
                exc = e
            finally:
                conn.close()
            if (reason := conn.reason(exc)) is not None:
                self._stats.count(reason)
                log.debug("memexporter: dropped a connection from %s (%s)", conn.peer, reason, exc_info=exc)
            meter.tick()
            with self._lock:
                self._held.discard(conn)
                if not self._closing:  # under the lock: the owner of done() tears it down after close()
                    self._done()

    def close(self, timeout: float) -> None:
        """Cut every connection held (a worker blocked on its client wakes at once) and wait up
        to ``timeout`` seconds for the threads (one may be inside the app, collecting)."""
        with self._lock:
            self._closing = True
            held, threads = list(self._held), list(self._threads)
            queued = list(self._queue)
            self._queue.clear()
            self._ready.notify_all()
        for conn in queued:
            conn.close()
        for conn in held:
            conn.cut()
        end = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, end - time.monotonic()))

    def close_in_child(self) -> None:
        """In a forked child (no worker runs there): close the inherited sockets."""
        for conn in [*self._held, *self._queue]:
            with contextlib.suppress(OSError):
                conn.sock.close()
