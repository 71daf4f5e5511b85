"""The HTTP endpoint, on prometheus_client's WSGI server (no hand-written HTTP parsing).

``start_wsgi_server`` brings the threaded WSGI server, IPv6 and TLS. Its app serves metrics on
every path, so we swap in a small router: ``/metrics`` (text, or OpenMetrics when the scraper's
``Accept`` asks for it, negotiated by prometheus_client), ``/`` (a landing page) and
``/healthz``; anything else is a 404. Malformed requests are answered 400 by wsgiref, and the
server keeps serving.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app, start_wsgi_server

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _landing(title: str) -> bytes:
    t = html.escape(title)
    return (
        f"<!doctype html><html><head><title>{t}</title></head><body><h1>{t}</h1>"
        "<p>In-process memory exporter for PyTorch training.</p><ul>"
        '<li><a href="metrics">/metrics</a>: Prometheus metrics</li>'
        '<li><a href="healthz">/healthz</a>: liveness</li>'
        '</ul><p>Docs: <a href="https://github.com/memexporter/memexporter">memexporter</a></p>'
        "</body></html>\n"
    ).encode()


def router(metrics_app: WSGIApp, title: str) -> WSGIApp:
    """Route ``/``, ``/healthz`` and ``/metrics``; 404 elsewhere, 405 for methods other than GET/HEAD."""
    landing = _landing(title)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"), ("Content-Type", "text/plain")])
            return [b"method not allowed\n"]
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if path == "/healthz":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok\n"]
        if path in ("", "/"):
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [landing]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found; try /metrics\n"]

    return app


def _strict_handler(base: type[WSGIRequestHandler]) -> type[WSGIRequestHandler]:
    """A request handler that answers every unparseable request with a real ``400``.

    The stdlib treats a two-word request line as HTTP/0.9 and replies with a bare HTML body (no
    status line), and an unknown HTTP version with ``505``. A scraper or a port scanner should
    see a 4xx on the wire, and the server must keep serving either way.
    """

    class StrictHandler(base):  # type: ignore[valid-type,misc]
        default_request_version = "HTTP/1.0"

        def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
            if self.command is None:  # still parsing the request line: the client's fault
                code = 400
            super().send_error(code, message, explain)

    return StrictHandler


@dataclass
class Server:
    """A running HTTP server. ``port`` is the bound port (useful with port 0)."""

    httpd: WSGIServer
    thread: threading.Thread
    addr: str
    port: int

    def stop(self) -> None:
        """Stop serving and free the port."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def serve(registry: CollectorRegistry, port: int, addr: str, certfile: str | None = None,
          keyfile: str | None = None, title: str = "memexporter") -> Server:
    """Bind and serve in a daemon thread. Raises ``OSError`` when the port is taken."""
    httpd, thread = start_wsgi_server(port, addr=addr, registry=registry, certfile=certfile, keyfile=keyfile)
    httpd.RequestHandlerClass = _strict_handler(httpd.RequestHandlerClass)  # type: ignore[arg-type]
    httpd.set_app(router(make_wsgi_app(registry), title))
    return Server(httpd=httpd, thread=thread, addr=addr, port=int(httpd.server_port))
