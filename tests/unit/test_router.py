"""The WSGI router: built-in endpoints, extra routes (the debug endpoints plug in here), errors."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from memexporter.server import Route, router


def _call(app: Any, path: str, method: str = "GET", **environ: str) -> tuple[str, bytes]:
    seen: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        seen.append(status)

    body = b"".join(app({"PATH_INFO": path, "REQUEST_METHOD": method, **environ}, start_response))
    return seen[0], body


def _metrics(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"metrics\n"]


def _peer(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [environ.get("REMOTE_ADDR", "?").encode()]


def test_extra_route_is_served_with_the_environ_and_linked_from_the_landing_page() -> None:
    app = router(_metrics, "t", {"/debug/peer": Route(_peer, "who is asking")})
    assert _call(app, "/debug/peer", REMOTE_ADDR="10.1.2.3") == ("200 OK", b"10.1.2.3")
    status, landing = _call(app, "/")
    assert status == "200 OK"
    assert b'<a href="debug/peer">/debug/peer</a>: who is asking' in landing
    assert b'<a href="metrics">' in landing


def test_without_extra_routes_unknown_paths_are_404_and_not_linked() -> None:
    app = router(_metrics, "t")
    assert _call(app, "/debug/peer")[0].startswith("404")
    assert b"debug" not in _call(app, "/")[1]
    assert _call(app, "/metrics") == ("200 OK", b"metrics\n")
    assert _call(app, "/metrics", method="POST")[0].startswith("405")
