"""The HTTP endpoint, on prometheus_client's WSGI machinery (no hand-written HTTP parsing).

prometheus_client's ``ThreadingWSGIServer`` (one thread per request) and ``make_wsgi_app`` (text,
or OpenMetrics when the scraper's ``Accept`` asks for it) behind a small router: ``/metrics``,
``/`` (a landing page), ``/healthz``; anything else is a 404. Malformed requests get a 400 and
the server keeps serving.

Why not ``start_wsgi_server`` itself: it wraps the *listening* socket in TLS, so the handshake
runs inside ``accept()`` on the one serving thread with no timeout, and one idle TCP connection
(a port scanner, a load balancer's pre-connect) blocks every scrape and makes ``stop()`` hang.
Here the handshake runs per connection, in that connection's thread, with a timeout.
"""

from __future__ import annotations

import html
import socket
import ssl
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

# Seconds a connection may take for its TLS handshake or sit idle before it is dropped, so idle
# clients cannot pin request threads forever.
CONNECTION_TIMEOUT = 10.0

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


@dataclass(frozen=True)
class Route:
    """An extra endpoint (``/debug/memory``, say): its WSGI app and the landing page's line for it."""

    app: WSGIApp
    description: str


def _landing(title: str, routes: Mapping[str, Route]) -> bytes:
    t = html.escape(title)
    links = [("metrics", "Prometheus metrics"), ("healthz", "liveness")]
    links += [(path.lstrip("/"), route.description) for path, route in routes.items()]
    items = "".join(f'<li><a href="{html.escape(href)}">/{html.escape(href)}</a>: {html.escape(text)}</li>'
                    for href, text in links)
    return (
        f"<!doctype html><html><head><title>{t}</title></head><body><h1>{t}</h1>"
        f"<p>In-process memory exporter for PyTorch training.</p><ul>{items}</ul>"
        '<p>Docs: <a href="https://github.com/memexporter/memexporter">memexporter</a></p>'
        "</body></html>\n"
    ).encode()


def router(metrics_app: WSGIApp, title: str, routes: Mapping[str, Route] | None = None) -> WSGIApp:
    """Route ``/``, ``/healthz``, ``/metrics`` and ``routes`` (exact paths); 404 elsewhere, 405 for
    methods other than GET/HEAD. An extra route's app sees the WSGI environ as is (``REMOTE_ADDR``
    is the peer's address) and answers HEAD itself."""
    routes = dict(routes or {})
    landing = _landing(title, routes)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"), ("Content-Type", "text/plain")])
            return [b"method not allowed\n"]
        head = method == "HEAD"
        if path == "/metrics":
            if head:  # prometheus_client answers HEAD with 405: ask it for GET, send no body
                list(metrics_app({**environ, "REQUEST_METHOD": "GET"}, start_response))
                return []
            return metrics_app(environ, start_response)
        if path == "/healthz":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [] if head else [b"ok\n"]
        if path in ("", "/"):
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [] if head else [landing]
        if path in routes:
            return routes[path].app(environ, start_response)
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
        timeout = CONNECTION_TIMEOUT

        def log_message(self, format: str, *args: Any) -> None:
            pass  # an access log line per scrape would flood the training job's stderr

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


def _tls_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2  # Prometheus' own floor
    context.load_cert_chain(certfile, keyfile)
    return context


def _server_class(addr: str, port: int, context: ssl.SSLContext | None) -> type[ThreadingWSGIServer]:
    family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

    class Server(ThreadingWSGIServer):
        address_family = family

        def finish_request(self, request: Any, client_address: Any) -> None:
            # Runs in the connection's own thread (ThreadingMixIn), so a slow or silent client
            # only ever blocks itself.
            if context is not None:
                request.settimeout(CONNECTION_TIMEOUT)
                try:
                    request = context.wrap_socket(request, server_side=True)
                except (OSError, ValueError):
                    return  # failed or timed-out handshake: drop this connection only
            super().finish_request(request, client_address)

    return Server


def serve(registry: CollectorRegistry, port: int, addr: str, certfile: str | None = None,
          keyfile: str | None = None, title: str = "memexporter", routes: Mapping[str, Route] | None = None) -> Server:
    """Bind and serve in a daemon thread. Raises ``OSError`` when the port is taken."""
    context = _tls_context(certfile, keyfile) if certfile and keyfile else None
    app = router(make_wsgi_app(registry), title, routes)
    handler = _strict_handler(WSGIRequestHandler)
    httpd = make_server(addr, port, app, _server_class(addr, port, context), handler_class=handler)
    thread = threading.Thread(target=httpd.serve_forever, name="memexporter-http", daemon=True)
    thread.start()
    return Server(httpd=httpd, thread=thread, addr=addr, port=int(httpd.server_port))
