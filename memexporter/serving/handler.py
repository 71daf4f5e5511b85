"""Answer one request on a connection with the standard library's HTTP parsing and wsgiref.

No hand-written HTTP parsing: ``http.server`` parses the request line and headers and wsgiref
runs the WSGI app. What changes: reads and writes go through the connection's deadline (the
answer in one ``send()``), every unparseable request gets a real 400, an absolute-form target
(``GET http://host:9400/metrics``, RFC 9112 3.2.2) is served as its path, ``REMOTE_ADDR`` is the
peer's address (IPv4-mapped IPv6 given as IPv4, so a loopback check sees ``127.0.0.1``), the
app's environ carries no copy of ``os.environ``, and nothing is written to the job's stderr: no
access log, and a failure is logged at debug level.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler

from memexporter.serving.conn import Conn

log = logging.getLogger("memexporter")

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _DebugStream:
    """``wsgi.errors``: what an app or wsgiref writes there goes to the debug log, not stderr."""

    def write(self, text: str) -> int:
        if text.strip():
            log.debug("memexporter: HTTP: %s", text.rstrip())
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pass


class _QuietServerHandler(ServerHandler):
    multithread = True
    os_environ = {}  # noqa: RUF012  # wsgiref copies the process's environment into each request's

    def log_exception(self, exc_info: Any) -> None:
        # wsgiref prints the traceback on stderr; one per failing request would flood the job's.
        log.debug("memexporter: HTTP app failed", exc_info=exc_info)


def peer_address(address: str) -> str:
    """``::ffff:127.0.0.1`` (a dual-stack socket's IPv4 peer) as ``127.0.0.1``; others as they are."""
    try:
        mapped = ipaddress.ip_address(address.split("%", maxsplit=1)[0])
    except ValueError:
        return address
    if isinstance(mapped, ipaddress.IPv6Address) and mapped.ipv4_mapped is not None:
        return str(mapped.ipv4_mapped)
    return address


class _Server:
    """What ``WSGIRequestHandler`` asks of its server: the app and the base environ."""

    def __init__(self, app: WSGIApp, port: int) -> None:
        self.app = app
        # wsgiref's WSGIServer puts socket.getfqdn() here, a DNS lookup; the host name will do.
        self.base_environ = {
            "SERVER_NAME": socket.gethostname(),
            "GATEWAY_INTERFACE": "CGI/1.1",
            "SERVER_PORT": str(port),
            "REMOTE_HOST": "",
            "CONTENT_LENGTH": "",
            "SCRIPT_NAME": "",
        }

    def get_app(self) -> WSGIApp:
        return self.app


class Handler(WSGIRequestHandler):
    """One request on a ``Conn`` (``request``); the listener closes the connection afterwards."""

    default_request_version = "HTTP/1.0"
    request: Conn

    def setup(self) -> None:
        self.connection = self.request.sock
        self.rfile = self.request.reader()
        self.out = self.request.writer()
        self.wfile = self.out

    def finish(self) -> None:
        self.out.drain()

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        if self.path[:1] != "/" and "://" in self.path[:10]:  # absolute-form: keep the path and query
            parts = urlsplit(self.path)
            self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return True

    def handle(self) -> None:
        # WSGIRequestHandler.handle, with our quiet wsgiref handler and errors stream.
        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536:
            self.requestline, self.request_version, self.command = "", "", ""
            self.send_error(414)
            return
        if not self.parse_request():
            return
        handler = _QuietServerHandler(
            self.rfile,
            self.wfile,  # type: ignore[arg-type]  # our Writer is a BufferedIOBase; wsgiref asks for IO[bytes]
            _DebugStream(),
            self.get_environ(),
            multithread=True,
        )
        handler.request_handler = self  # type: ignore[attr-defined]  # wsgiref's back-pointer, for its access log
        handler.run(self.server.get_app())  # type: ignore[attr-defined]

    def get_environ(self) -> dict[str, Any]:
        environ: dict[str, Any] = super().get_environ()
        environ["REMOTE_ADDR"] = peer_address(self.client_address[0])
        return environ

    def log_message(self, format: str, *args: Any) -> None:
        pass  # an access log line per scrape would flood the training job's stderr

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # The stdlib answers an unknown HTTP version with 505 and a two-word request line as
        # HTTP/0.9 (no status line). A scraper or a port scanner should see a 4xx on the wire.
        if self.command is None:  # still parsing the request line: the client's fault
            code = 400
        super().send_error(code, message, explain)


def answerer(app: WSGIApp, port: int) -> Callable[[Conn], None]:
    """``serve(conn)`` for the listener: answer one request on ``conn`` with ``app``."""
    server = _Server(app, port)

    def serve(conn: Conn) -> None:
        Handler(conn, conn.peer, server)  # type: ignore[arg-type]

    return serve
