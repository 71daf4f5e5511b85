"""``/metrics`` and ``/live.json`` in the helper: the job's latest snapshot, shaped as the client asks.

What prometheus_client's ``make_wsgi_app`` negotiates (text, or OpenMetrics when ``Accept`` asks for
it; gzip when ``Accept-Encoding`` allows; ``?name[]=a&name[]=b`` keeps only the samples named), made
from the text body the job published (``textformat.py``), never by calling into the job: a scrape
runs no Python in the training process. Each variant (format x gzip x names, ``VARIANTS`` of them) is
made once per snapshot and served from a cache until the next one, so a flood costs the helper a copy
per request. The snapshot is at most ``job/link.py``'s ``PUBLISH_EVERY`` old (about a second).
"""

from __future__ import annotations

import gzip
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from prometheus_client.exposition import choose_encoder, gzip_accepted

from memexporter.serving.board import Snapshot
from memexporter.serving.textformat import only, to_openmetrics

VARIANTS = 8  # renders kept per snapshot: format x gzip x name[] filter
OPENMETRICS = "application/openmetrics-text"

Key = tuple[str, bool, frozenset[str] | None]


@dataclass(frozen=True)
class Render:
    """One variant of one snapshot: its headers and its body (gzipped when the variant is)."""

    headers: list[tuple[str, str]]
    body: bytes


class Exposition:
    """The WSGI app of one section of the snapshot that ``current()`` returns: ``text`` (``/metrics``) or
    ``live`` (``/live.json``). ``current()`` returns the same object until something changed."""

    def __init__(self, current: Callable[[], Snapshot | None], section: str = "text") -> None:
        self._current, self._section = current, section
        self._lock = threading.Lock()
        self._for: Snapshot | None = None
        self._renders: OrderedDict[Key, Render] = OrderedDict()
        self.renders = 0  # variants made (for tests and benchmarks)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        snapshot = self._current()
        if snapshot is None or self._section not in snapshot.sections:
            start_response(
                "503 Service Unavailable",
                [("Content-Type", "text/plain"), ("Retry-After", "1")],
            )
            return [b"no snapshot from the training process yet; it publishes within a second of start()\n"]
        if self._section == "text":
            content_type = choose_encoder(str(environ.get("HTTP_ACCEPT") or ""))[1]
            names = parse_qs(str(environ.get("QUERY_STRING") or "")).get("name[]")
        else:
            content_type, names = "application/json", None
        gzipped = gzip_accepted(str(environ.get("HTTP_ACCEPT_ENCODING") or ""))
        key: Key = (content_type, gzipped, frozenset(names) if names is not None else None)
        with self._lock:
            if snapshot is not self._for:
                self._for = snapshot
                self._renders.clear()
            render = self._renders.get(key)
            if render is None:
                render = self._render(snapshot.sections[self._section], key)
                self._renders[key] = render
                while len(self._renders) > VARIANTS:
                    self._renders.popitem(last=False)
            self._renders.move_to_end(key)
        start_response("200 OK", list(render.headers))
        return [render.body]

    def _render(self, body: bytes, key: Key) -> Render:
        content_type, gzipped, names = key
        if names is not None:
            body = only(body, names)
        if content_type.startswith(OPENMETRICS):
            body = to_openmetrics(body)
        headers = [("Content-Type", content_type)]
        if gzipped:
            body = gzip.compress(body, compresslevel=6)
            headers.append(("Content-Encoding", "gzip"))
        headers.append(("Content-Length", str(len(body))))
        self.renders += 1
        return Render(headers, body)
