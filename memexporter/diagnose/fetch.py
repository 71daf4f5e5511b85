"""One bounded HTTP GET for ``memexporter inspect``, which runs on the node it diagnoses.

Bounded in time and in size: ``timeout`` is the whole operation's (name lookup, connect, TLS,
headers, body), enforced by running the request on a helper thread and giving up on it at the
deadline, so a server that trickles a byte a second cannot hold the command; the body is read in
chunks and refused past ``MAX_BYTES``, so an endless answer cannot fill the node's memory. No
proxy (the token must not travel through one) and no redirect is followed. Every failure is a
``FetchError`` with a one-line message.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_BYTES = 32 * 2**20
_CHUNK = 1 << 16


class FetchError(RuntimeError):
    """Why the answer could not be read, in one line; ``unreachable``: nobody answered at all."""

    def __init__(self, message: str, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


@dataclass(frozen=True)
class Answer:
    """The answer as ``get`` read it: status, reason phrase, headers (names lower-cased) and the whole body."""

    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes


def one_line(text: str, limit: int = 200) -> str:
    """``text`` as one printable line of at most ``limit`` characters (a server's words are untrusted)."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def too_large(cap: int) -> str:
    """The end of the message refusing a document over ``cap`` bytes (an answer or a dump file), ``cap`` in MiB."""
    return f"larger than {cap >> 20} MiB, the most inspect reads: not a memexporter document"


class _Request:
    def __init__(self, url: str, headers: Mapping[str, str], timeout: float, cap: int) -> None:
        self.url, self.headers, self.timeout, self.cap = url, headers, timeout, cap
        self.conn: http.client.HTTPConnection | None = None
        self.result: Answer | BaseException | None = None
        self.cancelled = False

    def run(self) -> None:
        try:
            self.result = self._get()
        except BaseException as exc:  # handed to the waiting thread
            self.result = exc
        finally:
            if self.conn is not None:
                self.conn.close()

    def _get(self) -> Answer:
        parts = urlsplit(self.url)
        host, port = parts.hostname or "", parts.port
        if parts.scheme == "https":
            self.conn = http.client.HTTPSConnection(
                host, port, timeout=self.timeout, context=ssl.create_default_context()
            )
        else:
            self.conn = http.client.HTTPConnection(host, port, timeout=self.timeout)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.conn.request("GET", target, headers={"Accept": "application/json", **self.headers})
        resp = self.conn.getresponse()
        length = resp.getheader("Content-Length")
        if length is not None and length.isdigit() and int(length) > self.cap:
            raise FetchError(f"the answer is {int(length) >> 20} MiB, {too_large(self.cap)}")
        body = bytearray()
        while not self.cancelled:
            chunk = resp.read(_CHUNK)
            if not chunk:
                break
            body += chunk
            if len(body) > self.cap:
                raise FetchError(f"the answer is {too_large(self.cap)}")
        if length is not None and length.isdigit() and len(body) < int(length) and not self.cancelled:
            raise http.client.IncompleteRead(bytes(body[-16:]), int(length) - len(body))
        return Answer(resp.status, resp.reason, {k.lower(): v for k, v in resp.getheaders()}, bytes(body))

    def cancel(self) -> None:
        self.cancelled = True
        sock = self.conn.sock if self.conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # a blocked read returns now


def get(
    url: str, headers: Mapping[str, str], timeout: float, cap: int = MAX_BYTES, budget: float | None = None
) -> Answer:
    """GET ``url`` (http or https) within ``timeout`` seconds in all; ``FetchError`` otherwise.
    ``budget``: the deadline the user gave (``--timeout``), for the message, when ``timeout`` is
    what is left of it."""
    said = f"{timeout if budget is None else budget:g} s (--timeout)"
    request = _Request(url, headers, timeout, cap)
    worker = threading.Thread(target=request.run, name="memexporter-inspect-get", daemon=True)
    started = time.monotonic()
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        request.cancel()
        raise FetchError(
            f"no complete answer within {said}: is something else on that port, or is the node overloaded?"
        )
    result = request.result
    if isinstance(result, Answer):
        return result
    if isinstance(result, FetchError):
        raise result
    if isinstance(result, (TimeoutError, socket.timeout)):
        raise FetchError(f"no complete answer within {said}")
    if isinstance(result, ConnectionRefusedError):
        raise FetchError("connection refused", unreachable=True)
    if isinstance(result, socket.gaierror):
        raise FetchError(f"cannot resolve the host name: {one_line(str(result.strerror or result))}", unreachable=True)
    if isinstance(result, ssl.SSLError):
        raise FetchError(f"TLS failed ({one_line(str(result.reason or result))})")
    if isinstance(result, http.client.IncompleteRead):
        raise FetchError("the answer was cut short")
    if isinstance(result, (http.client.HTTPException, ConnectionError)):
        raise FetchError(f"not an HTTP answer ({type(result).__name__}: {one_line(str(result))})")
    if isinstance(result, OSError):
        raise FetchError(one_line(str(result.strerror or result)), unreachable=True)
    raise FetchError(f"{type(result).__name__}: {one_line(str(result))} after {time.monotonic() - started:.1f} s")
