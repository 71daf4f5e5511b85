"""The threads that answer requests whose head has arrived: at most ``WORKERS`` at once, the rest
in a queue. ``close()`` cuts every connection they hold, so a client cannot keep one past stop."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from memexporter.serving.conn import Conn, ConnectionStats

log = logging.getLogger("memexporter")

WORKERS = 4  # requests answered at once (a scrape holds the GIL: more threads buy nothing)


class Workers:
    """``answer(conn)`` runs in a worker thread; the connection is closed afterwards, what it
    raised is counted, and ``done()`` is called (the acceptor may accept again)."""

    def __init__(self, answer: Callable[[Conn], None], stats: ConnectionStats, done: Callable[[], None]) -> None:
        self._answer, self._stats, self._done = answer, stats, done
        self._lock = threading.Lock()
        self._held: set[Conn] = set()  # answering or queued
        self._queue: deque[Conn] = deque()
        self._threads: list[threading.Thread] = []
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
            self._threads = [t for t in self._threads if t.is_alive()]
            if len(self._threads) >= WORKERS:
                self._queue.append(conn)
                return
            thread = threading.Thread(target=self._work, args=(conn,), name="memexporter-http-worker", daemon=True)
            self._threads.append(thread)
        thread.start()

    def _work(self, conn: Conn | None) -> None:
        while conn is not None:
            try:
                self._answer(conn)
            except Exception as exc:
                if (reason := conn.reason(exc)) is not None:
                    self._stats.count(reason)
                    log.debug("memexporter: dropped a connection from %s (%s)", conn.peer, reason, exc_info=True)
            finally:
                conn.close()
            with self._lock:
                self._held.discard(conn)
                conn = None if self._closing or not self._queue else self._queue.popleft()
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
