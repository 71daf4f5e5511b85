"""The WSGI router: built-in endpoints, extra routes (the debug endpoints plug in here), errors."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest

from memexporter.serving.budget import Budget
from memexporter.serving.router import EXTRA_BURST
from memexporter.serving.server import Route, router


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


def _full(app: Any, path: str, method: str = "GET") -> tuple[str, dict[str, str], bytes]:
    seen: list[tuple[str, list[tuple[str, str]]]] = []
    body = b"".join(
        app({"PATH_INFO": path, "REQUEST_METHOD": method}, lambda status, headers: seen.append((status, headers)))
    )
    return seen[0][0], dict(seen[0][1]), body


@pytest.mark.parametrize("path", ["/", "/healthz", "/metrics", "/debug/peer", "/nope"])
def test_head_is_the_get_with_its_content_length_and_no_body(path: str) -> None:
    app = router(_metrics, "t", {"/debug/peer": Route(_peer, "who is asking")})
    status, headers, body = _full(app, path, "HEAD")
    got = _full(app, path)
    assert (status, body) == (got[0], b"")
    assert headers["Content-Length"] == str(len(got[2])) != "0"
    assert headers["Content-Type"] == got[1]["Content-Type"]


def test_extra_routes_above_their_rate_get_429_with_retry_after() -> None:
    app = router(_metrics, "t", {"/debug/peer": Route(_peer, "who is asking")})
    statuses = [_full(app, "/debug/peer")[0] for _ in range(int(EXTRA_BURST))]
    assert statuses == ["200 OK"] * int(EXTRA_BURST)
    status, headers, body = _full(app, "/debug/peer")
    assert status == "429 Too Many Requests" and headers["Retry-After"] == "1" and b"retry after 1 s" in body
    assert _full(app, "/metrics")[0] == "200 OK"  # the rest is not limited by it


def test_while_the_cpu_budget_is_spent_only_metrics_and_healthz_are_answered() -> None:
    budget = Budget(share=0.02, burst=0.1)
    app = router(_metrics, "t", {"/debug/peer": Route(_peer, "who is asking")}, budget)
    budget.charge(0.14)  # 40 ms in debt: 2 s at 2 % of a core
    for path in ("/", "/nope", "/debug/peer"):
        status, headers, _ = _full(app, path)
        assert status == "429 Too Many Requests" and headers["Retry-After"] == "2", path
    assert _full(app, "/metrics") == ("200 OK", {"Content-Type": "text/plain"}, b"metrics\n")
    assert _full(app, "/healthz")[:1] == ("200 OK",)
