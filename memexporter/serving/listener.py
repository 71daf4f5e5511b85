"""Accept connections and read their requests: bounded, with deadlines, quiet, stopped for sure.

One acceptor thread owns the listening socket and every connection still sending its request
(non-blocking, in a selector: a silent or trickling client costs a descriptor, never a thread).
A connection whose request head has arrived goes to the workers (``workers.Workers``).

- **A CPU budget** (``budget.Budget``): the acceptor's and the workers' CPU time is charged to
  it, and while it is in debt nothing is accepted: a flood waits in the kernel's listen queue
  (FIFO, so a scraper's connection still comes in its turn), whose limit pushes back on it.
- **Bounded.** At most ``cap`` connections are open. At the cap the acceptor stops accepting:
  new connections wait in the kernel's listen queue, which holds no descriptor of ours. When one
  waits there, the oldest connection that has been sending its request for ``EVICT_AFTER``
  seconds is dropped to make room, so slow clients cannot starve Prometheus.
- **Never the job's descriptors.** ``cap`` shrinks with ``RLIMIT_NOFILE``; a connection that
  lands in the last ``reserve`` descriptors below the limit is closed at once and accepting
  pauses, so the job's own ``open()`` never fails because of the exporter.
- **One total deadline** per connection, from accept to the last byte of the response.
- **Quiet.** Drops are counted by reason (``ConnectionStats``) and logged at debug level.
- **Stopped for sure.** ``close()`` wakes the acceptor through a pipe (no polling), closes the
  listening socket and every connection accepted, and returns without waiting on a client.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable

from memexporter.serving.budget import RESUME, Budget, Meter
from memexporter.serving.conn import READY, Conn, ConnectionStats, fd_limit
from memexporter.serving.workers import WORKERS, Workers

log = logging.getLogger("memexporter")

__all__ = ["BACKLOG", "DEADLINE", "EVICT_AFTER", "MAX_CONNECTIONS", "WORKERS", "Listener", "limits"]

MAX_CONNECTIONS = 64  # open connections in every phase; fewer under a low descriptor limit
DEADLINE = 10.0  # seconds per connection, accept to last byte: Prometheus' default scrape_timeout
EVICT_AFTER = 1.0  # a client still sending its request after this long may make room for another
BACKLOG = 1024  # the kernel's listen queue (capped by net.core.somaxconn): a burst drops no SYN
PAUSE = 0.25  # seconds without accepting after accept() failed or hit the descriptor reserve


def limits(soft: int | None = None) -> tuple[int, int]:
    """``(cap, reserve)`` for a soft ``RLIMIT_NOFILE`` (``None``: this process's; -1: none).

    The exporter holds at most ``cap`` connections plus three descriptors (the listening socket
    and a wake-up pipe), and never takes one of the last ``reserve`` below the limit.
    """
    soft = fd_limit() if soft is None else soft
    if soft < 0:
        return MAX_CONNECTIONS, 64
    return max(2, min(MAX_CONNECTIONS, soft // 16)), max(16, soft // 16)


class Listener:
    """Serves ``sock`` (bound, listening): ``answer(conn)`` answers one request in a worker."""

    def __init__(
        self,
        sock: socket.socket,
        answer: Callable[[Conn], None],
        stats: ConnectionStats,
        context: ssl.SSLContext | None = None,
        *,
        deadline: float = DEADLINE,
        budget: Budget | None = None,
    ) -> None:
        self.sock, self.stats, self._context, self.deadline = sock, stats, context, deadline
        self.budget = budget or Budget()
        self.cap, self.reserve = limits()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self.workers = Workers(answer, stats, self._wake, self.budget)
        self._reading: dict[int, Conn] = {}  # fd -> connection; the acceptor thread's alone
        self._closing = False
        self._resume_at = 0.0
        self.thread = threading.Thread(target=self._run, name="memexporter-http", daemon=True)

    def start(self) -> None:
        self.sock.setblocking(False)
        self.thread.start()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe is awake enough
            os.write(self._wake_w, b"w")

    def _run(self) -> None:
        # poll(2), not epoll: no descriptor of its own; at most cap + 2 are watched.
        sel = selectors.PollSelector() if hasattr(selectors, "PollSelector") else selectors.DefaultSelector()
        sel.register(self._wake_r, selectors.EVENT_READ)
        listening = False
        meter = Meter(self.budget)
        try:
            while not self._closing:
                meter.tick()
                if (want := self._listen_wanted()) != listening:
                    if want:
                        sel.register(self.sock, selectors.EVENT_READ)
                    else:
                        sel.unregister(self.sock)
                    listening = want
                for key, _ in sel.select(self._timeout()):
                    if key.fileobj is self.sock:
                        self._make_room(sel)
                        self._accept(sel)
                    elif key.fileobj is self._wake_r:
                        with contextlib.suppress(OSError):
                            os.read(self._wake_r, 4096)
                    else:
                        self._advance(sel, key.data)
                now = time.monotonic()
                for conn in [c for c in self._reading.values() if c.deadline <= now]:
                    self._drop(sel, conn, "timeout")
        except Exception:  # not expected; the job must not see it, and close() must still work
            log.debug("memexporter: the HTTP acceptor failed", exc_info=True)
        finally:
            for conn in list(self._reading.values()):
                self._drop(sel, conn, None)
            sel.close()

    def _open(self) -> int:
        return len(self._reading) + self.workers.held()

    def _listen_wanted(self) -> bool:
        """Watch the listening socket unless paused (the budget in debt, or a failed accept), or
        at the cap with no slow reader to evict."""
        now = time.monotonic()
        if (wait := self.budget.wait(RESUME)) > 0:
            self._resume_at = max(self._resume_at, now + wait)
        if now < self._resume_at:
            return False
        return self._open() < self.cap or any(now - c.accepted >= EVICT_AFTER for c in self._reading.values())

    def _make_room(self, sel: selectors.BaseSelector) -> None:
        """At the cap, with a connection waiting in the listen queue: drop the oldest slow reader."""
        if self._open() < self.cap:
            return
        now = time.monotonic()
        slow = [c for c in self._reading.values() if now - c.accepted >= EVICT_AFTER]
        if slow:
            self._drop(sel, min(slow, key=lambda c: c.accepted), "evicted")

    def _timeout(self) -> float | None:
        """Seconds until a reading deadline, an eviction age or the end of a pause; None: none."""
        now = time.monotonic()
        times = [c.deadline for c in self._reading.values()]
        if self._open() >= self.cap:
            times += [t for c in self._reading.values() if (t := c.accepted + EVICT_AFTER) > now]
        if self._resume_at > now:
            times.append(self._resume_at)
        return max(0.0, min(times) - now) if times else None

    def _accept(self, sel: selectors.BaseSelector) -> None:
        if self._open() >= self.cap:
            return
        try:
            sock, peer = self.sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        except OSError as exc:  # EMFILE, ENFILE, ENOBUFS: the process or the system ran out
            self.stats.count("fd_limit" if exc.errno in (errno.EMFILE, errno.ENFILE) else "error")
            log.debug("memexporter: accept() failed: %s", exc)
            self._resume_at = time.monotonic() + PAUSE
            return
        soft = fd_limit()
        if soft >= 0 and sock.fileno() >= soft - self.reserve:
            sock.close()  # one of the job's last descriptors: give it back at once, and wait
            self.stats.count("fd_limit")
            self._resume_at = time.monotonic() + PAUSE
            return
        sock.setblocking(False)
        conn = Conn(sock, peer, time.monotonic(), self.deadline)
        if self._context is not None:
            try:
                conn.sock = self._context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except (OSError, ValueError):
                conn.close()
                self.stats.count("tls")
                return
            conn.handshaking = True
        self._reading[conn.fd] = conn
        sel.register(conn.fd, selectors.EVENT_READ, conn)
        self._advance(sel, conn)  # the request may have arrived with the handshake's last ACK

    def _advance(self, sel: selectors.BaseSelector, conn: Conn) -> None:
        outcome = conn.advance()
        if outcome == READY:
            del self._reading[conn.fd]
            sel.unregister(conn.fd)
            conn.sock.setblocking(True)  # the worker's reads and writes time out with the deadline
            self.workers.submit(conn)
        elif isinstance(outcome, int):
            sel.modify(conn.fd, outcome, conn)
        else:
            self._drop(sel, conn, outcome)

    def _drop(self, sel: selectors.BaseSelector, conn: Conn, reason: str | None) -> None:
        self._reading.pop(conn.fd, None)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(conn.fd)
        conn.close()
        if reason is not None:
            self.stats.count(reason)
            log.debug("memexporter: dropped a connection from %s (%s)", conn.peer, reason)

    def close(self, timeout: float = 2.0) -> None:
        """Stop accepting, close the listening socket and every open connection. Returns when the
        threads are done, or after ``timeout`` seconds for a worker still inside the app."""
        if self._closing:
            return
        self._closing = True
        self._wake()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout)
        self.sock.close()
        self.workers.close(timeout)  # from here on no worker writes to the pipe
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def close_in_child(self) -> None:
        """In a forked child (no thread of ours runs there): close the inherited descriptors."""
        for conn in self._reading.values():
            with contextlib.suppress(OSError):
                conn.sock.close()
        self.workers.close_in_child()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(OSError):
            self.sock.close()
