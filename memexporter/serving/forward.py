"""The debug routes in the helper: each admitted request is handed to the job over the channel.

``/debug/memory`` and ``/debug/snapshot`` compute on demand in the job (the census, the allocator's
snapshot), so they are the one kind of request that reaches it. The helper checks the peer and the token
and takes the rate limit's turn first (``guard.py``); the job answers on its own thread, never the training
thread (``job/link.py``), within ``ANSWER_WAIT`` seconds, else the client gets 504; once the job is gone, 503.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

from memexporter.serving.channel import Channel
from memexporter.serving.guard import accepts, guarded, plain
from memexporter.serving.handler import WSGIApp
from memexporter.serving.router import Route

ANSWER_WAIT = 8.0  # seconds the job has to answer a debug request (below the connection's 10 s deadline)


@dataclass
class _Slot:
    done: threading.Event = field(default_factory=threading.Event)
    head: dict[str, Any] = field(default_factory=dict)
    body: bytes = b""


class Forwarder:
    """Requests out (``app(path)``), answers in (``answered``, from the helper's channel loop)."""

    def __init__(self, channel: Channel | None, wait: float = ANSWER_WAIT) -> None:
        self._channel, self._wait = channel, wait
        self._lock = threading.Lock()
        self._pending: dict[int, _Slot] = {}
        self._ids = itertools.count(1)
        self.gone = channel is None

    def answered(self, head: dict[str, Any], body: bytes) -> None:
        with self._lock:
            slot = self._pending.pop(int(head.get("id", 0)), None)
        if slot is not None:
            slot.head, slot.body = head, body
            slot.done.set()

    def job_gone(self) -> None:
        """The job has ended: every waiting request and every later one gets 503."""
        with self._lock:
            self.gone = True
            pending, self._pending = list(self._pending.values()), {}
        for slot in pending:
            slot.done.set()

    def app(self, path: str) -> WSGIApp:
        """The WSGI app that asks the job for ``path`` (the query without the token)."""

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            query = urlencode([(k, v) for k, v in parse_qsl(str(environ.get("QUERY_STRING", ""))) if k != "token"])
            head = environ.get("REQUEST_METHOD") == "HEAD"
            slot, ident = _Slot(), next(self._ids)
            with self._lock:
                gone = self.gone
                if not gone:
                    self._pending[ident] = slot
            if (
                gone
                or self._channel is None
                or not self._channel.send({"t": "debug", "id": ident, "path": path, "query": query})
            ):
                return plain(start_response, "503 Service Unavailable", "the training process has ended\n", head)
            if not slot.done.wait(self._wait) or not slot.head:
                with self._lock:
                    self._pending.pop(ident, None)
                if self.gone:
                    return plain(start_response, "503 Service Unavailable", "the training process has ended\n", head)
                return plain(
                    start_response,
                    "504 Gateway Timeout",
                    f"the training process did not answer within {self._wait:g} s\n",
                    head,
                )
            headers = [(str(k), str(v)) for k, v in slot.head.get("headers", [])]
            start_response(str(slot.head.get("status", "500 Internal Server Error")), headers)
            return [] if head else [slot.body]

        return app


def debug_routes(
    described: Mapping[str, str], forwarder: Forwarder, allow: Sequence[str], token: str | None, hint: str
) -> dict[str, Route]:
    """The debug routes (``path: description``), each behind the peer check and the token, then the shared
    rate limit, then forwarded to the job."""
    check = accepts(token)
    return {
        path: Route(guarded(forwarder.app(path), allow, check, hint), description, admits=True)
        for path, description in described.items()
    }
