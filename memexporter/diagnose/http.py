"""The ``/debug`` endpoints, as WSGI apps for ``server.Route``.

Only the peer address counts (``REMOTE_ADDR``; no forwarded-for header is trusted): loopback,
or a network named in ``debug_allow``, else 403. ``/debug/memory`` answers from the published
findings and never waits on the training loop. ``/debug/snapshot`` returns the CUDA caching
allocator's snapshot (``torch.cuda.memory._snapshot()``) as a pickle that PyTorch's memory_viz
opens; it reads allocator bookkeeping under the allocator's own lock, not a tensor, so it is
taken on the request thread (and still answers when the training loop is stuck, which is when
it is wanted most). 409 when this process has not initialised CUDA.
"""

from __future__ import annotations

import ipaddress
import json
import pickle
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import parse_qs

from memexporter.diagnose.engine import Diagnosis
from memexporter.diagnose.report import DEFAULT_TOP, document
from memexporter.server import Route, WSGIApp

StartResponse = Callable[..., Any]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def is_allowed(peer: str, networks: Sequence[Network]) -> bool:
    """Whether ``peer`` (an IP address string) is loopback or inside one of ``networks``."""
    try:
        ip = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # a dual-stack socket reports IPv4 peers as ::ffff:a.b.c.d
    return ip.is_loopback or any(ip in net for net in networks)


def _plain(start_response: StartResponse, status: str, text: str, head: bool) -> Iterable[bytes]:
    start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
    return [] if head else [text.encode()]


def guarded(app: WSGIApp, allow: Sequence[str]) -> WSGIApp:
    """``app`` for allowed peers; 403 with the knob to change it for everyone else."""
    networks = [ipaddress.ip_network(n) for n in allow]

    def wrapper(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if not is_allowed(str(environ.get("REMOTE_ADDR", "")), networks):
            return _plain(start_response, "403 Forbidden", "forbidden: the debug endpoints answer loopback "
                          "clients only; name more networks with debug_allow= or MEMEXPORTER_DEBUG_ALLOW\n",
                          environ.get("REQUEST_METHOD") == "HEAD")
        return app(environ, start_response)

    return wrapper


def _top(environ: dict[str, Any]) -> int:
    values = parse_qs(str(environ.get("QUERY_STRING", ""))).get("top", [])
    try:
        return max(1, min(int(values[-1]), 1000)) if values else DEFAULT_TOP
    except ValueError:
        return DEFAULT_TOP


def memory_app(diagnosis: Diagnosis) -> WSGIApp:
    """``/debug/memory``: the census, the growing groups and their holders, graphs, the OOM view."""

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        head = environ.get("REQUEST_METHOD") == "HEAD"
        try:
            body = json.dumps(document(diagnosis, _top(environ)), allow_nan=False).encode()
        except Exception as exc:  # a 500 that says why; wsgiref would print a traceback per request
            diagnosis.errors += 1
            return _plain(start_response, "500 Internal Server Error", f"memexporter: {type(exc).__name__}: {exc}\n", head)
        start_response("200 OK", [("Content-Type", "application/json"), ("Cache-Control", "no-store")])
        return [] if head else [body]

    return app


def snapshot_app(snapshot: Callable[[], dict[str, Any] | None], rank: str) -> WSGIApp:
    """``/debug/snapshot``: ``snapshot()`` pickled (protocol 4, as ``_dump_snapshot`` writes it)."""

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        head = environ.get("REQUEST_METHOD") == "HEAD"
        try:
            data = snapshot()
        except Exception as exc:
            return _plain(start_response, "500 Internal Server Error", f"memexporter: {type(exc).__name__}: {exc}\n", head)
        if data is None:
            return _plain(start_response, "409 Conflict", "no CUDA allocator in use in this process (a CPU job, "
                          "or CUDA not initialised yet): nothing to snapshot\n", head)
        body = pickle.dumps(data, protocol=4)
        start_response("200 OK", [
            ("Content-Type", "application/octet-stream"), ("Cache-Control", "no-store"),
            ("Content-Disposition", f'attachment; filename="memexporter-snapshot-rank{rank}.pickle"'),
        ])
        return [] if head else [body]

    return app


def routes(diagnosis: Diagnosis, snapshot: Callable[[], dict[str, Any] | None], allow: Sequence[str]) -> dict[str, Route]:
    """The debug routes, each behind the peer check."""
    rank = diagnosis.sources.rank
    return {
        "/debug/memory": Route(guarded(memory_app(diagnosis), allow),
                               "tensor census, growing groups and their holders, OOM view (JSON)"),
        "/debug/snapshot": Route(guarded(snapshot_app(snapshot, rank), allow),
                                 "CUDA allocator snapshot (pickle for pytorch.org/memory_viz)"),
    }
