"""Hostile and bursty HTTP clients for the exporter's port: many sockets, one thread, no sleeps
in the server's process beyond what the clients themselves do."""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import selectors
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from tests.support import heap


@dataclass
class Trickler:
    """One client sending a request a byte at a time; ``closed_at`` is when the server ended it."""

    sock: socket.socket
    opened: float
    sent: int = 0
    closed_at: float | None = None


def trickle(
    port: int,
    count: int,
    interval: float,
    duration: float,
    host: str = "127.0.0.1",
    request: bytes = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: y\r\n" * 10_000,
) -> list[Trickler]:
    """Open ``count`` connections (fewer when the server stops taking them) and send one byte of
    ``request`` on each every ``interval`` seconds, for ``duration`` seconds or until the server
    has closed them all."""
    clients = []
    for _ in range(count):  # one by one, each established (a server may accept slowly)
        try:
            s = socket.create_connection((host, port), timeout=10)
        except OSError:  # refused or timed out: the server no longer takes connections
            break
        s.setblocking(False)
        clients.append(Trickler(s, time.monotonic()))
    sel = selectors.DefaultSelector()
    for c in clients:
        sel.register(c.sock, selectors.EVENT_READ, c)
    end = time.monotonic() + duration
    next_send = time.monotonic()
    try:
        while time.monotonic() < end and any(c.closed_at is None for c in clients):
            now = time.monotonic()
            if now >= next_send:
                for c in clients:
                    if c.closed_at is None and c.sent < len(request):
                        try:
                            c.sent += c.sock.send(request[c.sent : c.sent + 1])
                        except BlockingIOError:
                            pass
                        except OSError:
                            _closed(sel, c)
                next_send = now + interval
            for key, _ in sel.select(max(0.0, min(next_send, end) - time.monotonic())):
                c = key.data
                try:
                    data = c.sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:  # the server closed it (or answered and closed: not expected here)
                    _closed(sel, c)
    finally:
        sel.close()
        for c in clients:
            c.sock.close()
    return clients


def _closed(sel: selectors.BaseSelector, c: Trickler) -> None:
    c.closed_at = time.monotonic()
    with contextlib.suppress(KeyError, ValueError):
        sel.unregister(c.sock)


@dataclass
class BurstResult:
    connect_s: list[float] = field(default_factory=list)  # SYN to established, per connection
    total_s: list[float] = field(default_factory=list)  # to the end of the response
    statuses: list[bytes] = field(default_factory=list)  # b"200", ..., or b"" when none came


def burst(port: int, count: int, path: str = "/healthz", host: str = "127.0.0.1", timeout: float = 20.0) -> BurstResult:
    """Open ``count`` connections at once (non-blocking connects from one thread), send a GET on
    each as soon as it is established, and read every response to its end."""
    request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    sel = selectors.DefaultSelector()
    t0 = time.monotonic()
    state: dict[socket.socket, dict[str, object]] = {}
    for _ in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        err = s.connect_ex((host, port))
        if err not in (0, errno.EINPROGRESS):
            raise OSError(err, os.strerror(err))
        state[s] = {"start": time.monotonic(), "buf": b""}
        sel.register(s, selectors.EVENT_WRITE)
    result = BurstResult()
    deadline = t0 + timeout
    while state and time.monotonic() < deadline:
        for key, events in sel.select(max(0.0, deadline - time.monotonic())):
            s = key.fileobj
            assert isinstance(s, socket.socket)
            st = state[s]
            if events & selectors.EVENT_WRITE:
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    _finish(sel, state, s, result, b"")
                    continue
                st["connected"] = time.monotonic()
                s.sendall(request)
                sel.modify(s, selectors.EVENT_READ)
                continue
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            if data:
                st["buf"] = bytes(st["buf"]) + data  # type: ignore[arg-type]
                continue
            buf = bytes(st["buf"])  # type: ignore[arg-type]
            _finish(sel, state, s, result, buf.split(b" ", 2)[1] if buf.startswith(b"HTTP/") else b"")
    for s in list(state):
        _finish(sel, state, s, result, b"")
    sel.close()
    return result


def _finish(
    sel: selectors.BaseSelector,
    state: dict[socket.socket, dict[str, object]],
    s: socket.socket,
    result: BurstResult,
    status: bytes,
) -> None:
    st = state.pop(s)
    start = float(st["start"])  # type: ignore[arg-type]
    result.connect_s.append(float(st.get("connected", float("inf"))) - start)  # type: ignore[arg-type]
    result.total_s.append(time.monotonic() - start)
    result.statuses.append(status)
    sel.unregister(s)
    s.close()


def reset_connection(port: int, host: str = "127.0.0.1", send: bytes = b"") -> None:
    """Connect, optionally send a partial request, and reset (RST, as a port scanner does)."""
    s = socket.create_connection((host, port), timeout=5)
    if send:
        s.sendall(send)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """The cyclic garbage collected first, then none collected until the block ends: garbage that
    earlier tests of a pytest worker left in reference cycles (an exporter whose strict start failed, in
    a ``pytest.raises`` traceback; a test server's sockets) holds descriptors, and a collection in the
    middle of a count closed one of them (a count that came back one short, issue 40)."""
    heap.settle()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
