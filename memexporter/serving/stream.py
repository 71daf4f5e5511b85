"""A connection's deadline-bound streams: what the worker reads the request from and writes the
answer to. Every ``recv`` and ``send`` gets what is left of the connection's one deadline as its
timeout, so a client that trickles a byte a second still hits the deadline."""

from __future__ import annotations

import io
import socket
from typing import Any, Protocol

SEND_AT = 256 * 1024  # the answer goes out in one send() up to this size (a packet, not one per header)


class Conn(Protocol):
    """What the streams use of a connection (``serving.conn.Conn``)."""

    sock: socket.socket
    head: bytes  # what the acceptor read before the worker took over
    failure: str | None  # set when writing the answer failed

    def remaining(self) -> float:
        """Seconds left of the connection's deadline."""
        ...


class Reader(io.RawIOBase):
    """The rest of the request: first what the acceptor buffered, then the socket, each
    ``recv`` bounded by what is left of the deadline."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        conn = self._conn
        if conn.head:
            n = min(len(view), len(conn.head))
            view[:n] = conn.head[:n]
            conn.head = conn.head[n:]
            return n
        conn.sock.settimeout(conn.remaining())
        return conn.sock.recv_into(view)


class Writer(io.BufferedIOBase):
    """The response, sent within what is left of the deadline (``sendall`` takes the timeout as
    a total, not per chunk). Buffered up to ``SEND_AT`` bytes, so a small answer is one
    ``send()`` (``drain()`` sends the rest). A failed send is recorded on the connection
    (``failure``): wsgiref swallows a reset while writing, and the connection must still count."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn
        self._buffer = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self._conn.failure is None:
            self._buffer += data
        return len(data)

    def flush(self) -> None:
        if len(self._buffer) >= SEND_AT:
            self.drain()

    def drain(self) -> None:
        """Send everything buffered."""
        conn = self._conn
        if not self._buffer or conn.failure is not None:
            self._buffer.clear()
            return
        try:
            conn.sock.settimeout(conn.remaining())
            conn.sock.sendall(self._buffer)
        except OSError as exc:
            conn.failure = "timeout" if isinstance(exc, TimeoutError) else "write"
            raise
        finally:
            self._buffer.clear()
