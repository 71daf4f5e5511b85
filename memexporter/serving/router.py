"""The helper's routes as one WSGI app: ``/metrics``, ``/`` (the live page), ``/live.json``,
``/healthz`` and extra ``Route``s (the debug routes, ``forward.py``).

- ``/healthz`` and ``/`` are bytes made once; anything else is a 404, methods other than GET
  and HEAD a 405.
- **HEAD** is answered for every route as its GET (run by the app, which a HEAD costs as much
  as a GET), with the GET's ``Content-Length`` and no body.
- **429** with ``Retry-After``: an extra route (the ``/debug`` endpoints, whose answers are
  large) above ``EXTRA_RATE`` requests a second (``EXTRA_BURST`` at once); and while the
  server's CPU budget is in debt, every route but ``/metrics`` and ``/live.json`` (their cached
  variants cost a copy) and ``/healthz`` (a liveness probe must not fail because of someone else's
  flood).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from memexporter.serving.budget import Budget, RateLimit, retry_after
from memexporter.serving.handler import WSGIApp
from memexporter.serving.page import LIVE_PATH, page

ADMIT = "memexporter.admit"
"""WSGI environ key: ``take()`` of the extra routes' rate limit, seconds to wait (0: go ahead)."""
EXTRA_RATE = 1.0  # requests a second to the extra routes (/debug/*), all clients together
EXTRA_BURST = 5.0

StartResponse = Callable[..., Any]


@dataclass(frozen=True)
class Route:
    """An extra endpoint (``/debug/memory``, say): its WSGI app and the landing page's line for it.

    Extra routes share one request-rate limit. The router takes the turn before calling ``app``,
    unless ``admits`` says the app takes it itself (``environ[ADMIT]()``) once it has checked who
    asks: then a client that is refused spends no turn of the one that is not."""

    app: WSGIApp
    description: str
    admits: bool = False


def landing(title: str, routes: Mapping[str, Route]) -> bytes:
    """The live page (``serving/page.py``) with a link to every endpoint."""
    links = [
        ("metrics", "Prometheus metrics"),
        (LIVE_PATH.lstrip("/"), "this page's data (JSON)"),
        ("healthz", "liveness"),
    ]
    links += [(path.lstrip("/"), route.description) for path, route in routes.items()]
    return page(title, links)


def _static(status: str, content_type: str, body: bytes, extra: tuple[tuple[str, str], ...] = ()) -> WSGIApp:
    headers = [("Content-Type", content_type), *extra]

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        start_response(status, list(headers))
        return [body]

    return app


def too_many(wait: float) -> WSGIApp:
    """A ``429 Too Many Requests`` app whose ``Retry-After`` is ``wait`` seconds rounded up (at least 1)."""
    after = retry_after(wait)
    return _static(
        "429 Too Many Requests",
        "text/plain",
        f"too many requests; retry after {after} s\n".encode(),
        (("Retry-After", after),),
    )


def head(app: WSGIApp) -> WSGIApp:
    """HEAD as ``app``'s GET: its status and headers, its body's ``Content-Length``, no body."""

    def wrapper(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        seen: list[tuple[str, list[tuple[str, str]]]] = []

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
            seen.append((status, headers))
            return lambda data: None

        result = app({**environ, "REQUEST_METHOD": "GET"}, capture)
        try:
            length = sum(len(chunk) for chunk in result)
        finally:
            if (close := getattr(result, "close", None)) is not None:
                close()
        status, headers = seen[-1]
        start_response(
            status, [(k, v) for k, v in headers if k.lower() != "content-length"] + [("Content-Length", str(length))]
        )
        return []

    return wrapper


def router(
    metrics_app: WSGIApp,
    title: str,
    routes: Mapping[str, Route] | None = None,
    budget: Budget | None = None,
    live_app: WSGIApp | None = None,
) -> WSGIApp:
    """Route ``/``, ``/healthz``, ``/metrics``, ``/live.json`` (``live_app``, cached like
    ``/metrics``) and ``routes`` (exact paths). An extra route's app sees the WSGI environ as is
    (``REMOTE_ADDR`` is the peer's address); HEAD reaches it as a GET."""
    routes = dict(routes or {})
    budget = budget or Budget()
    extra = RateLimit(EXTRA_RATE, EXTRA_BURST)
    home = _static("200 OK", "text/html; charset=utf-8", landing(title, routes))
    healthz = _static("200 OK", "text/plain", b"ok\n")
    missing = _static("404 Not Found", "text/plain", b"not found; try /metrics\n")
    not_allowed = _static("405 Method Not Allowed", "text/plain", b"method not allowed\n", (("Allow", "GET, HEAD"),))

    def pick(path: str) -> WSGIApp:
        if path == "/metrics":
            return metrics_app
        if path == LIVE_PATH and live_app is not None:  # its cache serves a busy server, as /metrics'
            return live_app
        if path == "/healthz":
            return healthz
        if (wait := budget.wait()) > 0:
            return too_many(wait)
        if path in ("", "/"):
            return home
        if path in routes:
            route = routes[path]
            wait = 0.0 if route.admits else extra.take()
            return route.app if wait == 0 else too_many(wait)
        return missing

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            return not_allowed(environ, start_response)
        environ[ADMIT] = extra.take  # for the routes that take their turn themselves (Route.admits)
        chosen = pick(str(environ.get("PATH_INFO") or "/"))
        return (head(chosen) if method == "HEAD" else chosen)(environ, start_response)

    return app
