"""One accepted connection: its deadline, its streams (``stream.py``), and the counts of
dropped ones.

A connection has one total deadline from accept. Every read and write the worker makes sets the
socket's timeout to what is left of it, so a client that trickles a byte a second still hits the
deadline (a plain socket timeout would restart on every byte).
"""

from __future__ import annotations

import contextlib
import io
import re
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from typing import Any

from memexporter.metrics import REASONS
from memexporter.serving.stream import Reader, Writer

try:
    import resource
except ImportError:  # not on Windows; the descriptor reserve is then off
    resource = None  # type: ignore[assignment]


READY = "ready"  # Conn.advance(): the request head has arrived
MAX_HEAD = 65536 + 8192  # stop buffering here: the worker answers 414/431 (the stdlib's own limits)
_HEAD_END = re.compile(rb"\r?\n\r?\n")


def fd_limit() -> int:
    """The soft ``RLIMIT_NOFILE`` of this process, read now (the job may raise it); -1: no limit."""
    if resource is None:
        return -1
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return -1 if soft == resource.RLIM_INFINITY else int(soft)


class ConnectionStats:
    """Thread-safe counts of dropped connections by reason (one of ``REASONS``); in the job, also the helper's
    restarts (``memexporter_helper_restarts_total``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(REASONS, 0)
        self._base = dict.fromkeys(REASONS, 0)  # what the helpers before the current one counted
        self._restarts = 0

    def count(self, reason: str) -> None:
        with self._lock:
            self._counts[reason] += 1

    def set(self, counts: Mapping[str, int]) -> None:
        """Take the totals another process counted (the helper's, sent over the channel; in the job
        they feed ``memexporter_http_dropped_connections_total``). Unknown reasons are ignored."""
        with self._lock:
            for reason, n in counts.items():
                if reason in self._counts:
                    self._counts[reason] = self._base[reason] + int(n)

    def restarted(self) -> None:
        """The job started a new helper, which counts from 0: keep its predecessors' counts under its own,
        so that the counters never go down."""
        with self._lock:
            self._base = dict(self._counts)
            self._restarts += 1

    def restarts(self) -> int:
        """Helpers started after the first (in the job)."""
        with self._lock:
            return self._restarts

    def dropped(self) -> dict[str, int]:
        """``{reason: connections}`` for every reason in ``REASONS``."""
        with self._lock:
            return dict(self._counts)


class Conn:
    """An accepted connection. The acceptor reads its request head without blocking
    (``advance()``); then a worker answers it through ``reader()``/``writer()``, which start
    with the bytes already read, and ``close()`` ends it."""

    def __init__(self, sock: socket.socket, peer: Any, accepted: float, deadline: float) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.peer = peer
        self.accepted = accepted
        self.deadline = accepted + deadline
        self.head = b""  # bytes read before the worker took over
        self.handshaking = False  # TLS handshake not done yet
        self.failure: str | None = None  # the ``REASONS`` value writing the answer failed with
        self._lock = threading.Lock()
        self._closed = False
        self._cut = False

    def advance(self) -> str | int:
        """Read more of the request head without blocking (after the TLS handshake). Returns
        ``READY`` once the head is in, the ``selectors`` event to wait for, or the ``REASONS``
        value the connection failed with."""
        sock = self.sock
        try:
            if self.handshaking:
                assert isinstance(sock, ssl.SSLSocket)
                sock.do_handshake()
                self.handshaking = False
            while True:
                data = sock.recv(8192)
                if not data:  # closed before a whole request: a port scan, a health probe
                    return "reset"
                self.head += data
                if _HEAD_END.search(self.head) or len(self.head) > MAX_HEAD:
                    return READY
                if not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                    return selectors.EVENT_READ
        except (ssl.SSLWantReadError, BlockingIOError):
            return selectors.EVENT_READ
        except ssl.SSLWantWriteError:
            return selectors.EVENT_WRITE
        except ssl.SSLError:
            return "tls"
        except OSError:
            return "reset"

    def remaining(self) -> float:
        """Seconds left before the deadline; ``TimeoutError`` once it has passed."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("memexporter: connection deadline passed")
        return left

    def reader(self) -> io.BufferedReader:
        return io.BufferedReader(Reader(self))

    def writer(self) -> Writer:
        return Writer(self)

    def cut(self) -> None:
        """From another thread (``stop()``): wake a worker blocked on this client, at once.

        ``shutdown()``, not ``close()``: the descriptor stays ours until the worker closes it, so
        it can never be reused by the job's ``open()`` while the worker still uses the number.
        The base class's method, because ``SSLSocket.shutdown`` also tears down TLS state that
        the worker may be using.
        """
        with self._lock:
            if self._closed:
                return
            self._cut = True
            with contextlib.suppress(OSError):
                socket.socket.shutdown(self.sock, socket.SHUT_RDWR)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            with contextlib.suppress(OSError):
                self.sock.close()

    def reason(self, exc: BaseException | None) -> str | None:
        """Why an answer failed (``exc``: what it raised, None: nothing), as a ``REASONS``
        value; None when it did not fail, or when ``stop()`` cut it."""
        if self._cut:
            return None
        if self.failure is not None or exc is None:  # wsgiref swallows a reset while writing: read it here
            return self.failure
        if isinstance(exc, TimeoutError):
            return "timeout"
        if isinstance(exc, ssl.SSLError):
            return "tls"
        if isinstance(exc, OSError):
            return "reset"
        return "error"
