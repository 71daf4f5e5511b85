"""The ``/debug`` endpoints, as WSGI apps the job runs when its helper hands it a request.

The helper checks who asks first (``serving/guard.py``: the peer address, then this process's token
from ``token.py``, then the shared rate limit) and forwards only what passes; the job answers on its
publishing thread, never the training thread (``serving/job/link.py``). ``/debug/memory`` answers from the published
findings and never waits on the training loop. ``/debug/snapshot`` returns the CUDA caching
allocator's snapshot (``torch.cuda.memory._snapshot()``) as a pickle that PyTorch's memory_viz
opens; it reads allocator bookkeeping under the allocator's own lock, not a tensor, so it is
taken on the publishing thread (and still answers when the training loop is stuck, which is when
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
from memexporter.diagnose.token import TOKEN_ENV, DebugToken, runtime_dirs
from memexporter.serving.guard import plain as _plain
from memexporter.serving.handler import WSGIApp

StartResponse = Callable[..., Any]

# Networks an allow-list may name without a warning: private and link-local address space.
_LOCAL_NETWORKS = [
    ipaddress.ip_network(n)
    for n in (
        "127.0.0.0/8",
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "169.254.0.0/16",
        "::1/128",
        "fc00::/7",
        "fe80::/10",
    )
]


def public_networks(allow: Sequence[str]) -> list[str]:
    """The networks in ``allow`` that reach beyond private and link-local address space
    (``0.0.0.0/0``, ``::/0``, a public range): the ones worth a warning at start."""
    out = []
    for text in allow:
        net = ipaddress.ip_network(text)
        if not any(net.version == local.version and net.subnet_of(local) for local in _LOCAL_NETWORKS):  # type: ignore[arg-type]
            out.append(text)
    return out


def token_hint(token: DebugToken) -> str:
    """Where the token is, for the 403's one line (the path, never the token)."""
    where = str(token.path) if token.path is not None else f"{runtime_dirs()[0]}/memexporter-<host>-<pid>-<port>.token"
    return (
        f"forbidden: /debug/* needs this process's token. memexporter inspect on the job's node, as the job's "
        f"user, reads it from {where} (or give it with --token or {TOKEN_ENV}); send it as "
        "'Authorization: Bearer <token>' or ?token=<token>\n"
    )


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
            return _plain(
                start_response, "500 Internal Server Error", f"memexporter: {type(exc).__name__}: {exc}\n", head
            )
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
            return _plain(
                start_response, "500 Internal Server Error", f"memexporter: {type(exc).__name__}: {exc}\n", head
            )
        if data is None:
            return _plain(
                start_response,
                "409 Conflict",
                "no CUDA allocator in use in this process (a CPU job, "
                "or CUDA not initialised yet): nothing to snapshot\n",
                head,
            )
        body = pickle.dumps(data, protocol=4)
        start_response(
            "200 OK",
            [
                ("Content-Type", "application/octet-stream"),
                ("Cache-Control", "no-store"),
                ("Content-Disposition", f'attachment; filename="memexporter-snapshot-rank{rank}.pickle"'),
            ],
        )
        return [] if head else [body]

    return app


def routes(diagnosis: Diagnosis, snapshot: Callable[[], dict[str, Any] | None]) -> dict[str, tuple[WSGIApp, str]]:
    """The debug apps by path, with the landing page's line for each. The helper puts each behind the
    peer check and the token, then the shared rate limit (``serving/forward.py``)."""
    rank = diagnosis.sources.rank
    return {
        "/debug/memory": (
            memory_app(diagnosis),
            "tensor census, growing groups and their holders, OOM view (JSON; needs the token)",
        ),
        "/debug/snapshot": (
            snapshot_app(snapshot, rank),
            "CUDA allocator snapshot (pickle for pytorch.org/memory_viz; needs the token)",
        ),
    }
