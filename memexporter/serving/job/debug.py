"""The debug requests in the job: what the helper needs to guard them, and the answer to one it admitted.

The helper checks the peer, the token and the rate limit (``serving/guard.py``, ``serving/forward.py``);
what reaches the job is a path and a query, answered here by the app that ``diagnose/endpoints.py`` made
for that path, on the publishing thread (``link.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memexporter.serving.handler import WSGIApp


@dataclass(frozen=True)
class Debug:
    """The debug routes the job answers behind the helper's checks: ``apps`` (path: app, description),
    the peer allow-list, the token's value (None: none asked) and the 403's hint (where the token is)."""

    apps: Mapping[str, tuple[WSGIApp, str]]
    allow: Sequence[str]
    token: str | None
    hint: str

    def settings(self) -> dict[str, Any]:
        """What the helper is told (over the channel, never on its command line)."""
        return {
            "routes": {path: description for path, (_, description) in self.apps.items()},
            "allow": list(self.allow),
            "token": self.token,
            "hint": self.hint,
        }


def answer(apps: Mapping[str, tuple[WSGIApp, str]], path: str, query: str) -> tuple[str, list[tuple[str, str]], bytes]:
    """``(status, headers, body)`` of the GET of ``path?query``; 404 for a path with no app, 500 (saying why,
    in one line) for an app that raised."""
    if path not in apps:
        return "404 Not Found", [("Content-Type", "text/plain")], b"not found\n"
    seen: list[tuple[str, list[tuple[str, str]]]] = []
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": query}
    try:
        body = b"".join(apps[path][0](environ, lambda status, headers, exc_info=None: seen.append((status, headers))))
    except Exception as exc:
        return (
            "500 Internal Server Error",
            [("Content-Type", "text/plain")],
            f"memexporter: {type(exc).__name__}: {exc}\n".encode(),
        )
    status, headers = seen[-1]
    return status, [(str(k), str(v)) for k, v in headers], body
