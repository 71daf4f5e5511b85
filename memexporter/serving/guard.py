"""Who may read ``/debug/*``: the checks the helper makes before a debug request reaches the job.

Two checks, both needed. The peer address (``REMOTE_ADDR``; no forwarded-for header is trusted):
loopback, or a network named in ``debug_allow``, else 403. Then the job's token (``diagnose/token.py``
makes it and writes its file; the helper gets the value over the channel, never on its command line):
loopback is every local user, not the job's, so the request must carry the secret that only the job's
user can read, else 403 with where to find it. Only then does the request take a turn of the debug
routes' shared rate limit (``router.ADMIT``), so a refused client spends none of the owner's turns.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import parse_qs

from memexporter.serving.handler import WSGIApp
from memexporter.serving.router import ADMIT, too_many

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


def presented(environ: dict[str, Any]) -> str | None:
    """The token a request carries: ``Authorization: Bearer <token>``, else ``?token=<token>``."""
    scheme, _, value = str(environ.get("HTTP_AUTHORIZATION", "")).strip().partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    values = parse_qs(str(environ.get("QUERY_STRING", ""))).get("token", [])
    return values[-1] if values else None


def accepts(token: str | None) -> Callable[[str | None], bool]:
    """Whether a presented token is ``token``, compared in constant time (``None``: no token asked)."""

    def check(given: str | None) -> bool:
        if token is None:
            return True
        return given is not None and hmac.compare_digest(given.encode("utf-8", "replace"), token.encode())

    return check


def plain(
    start_response: StartResponse, status: str, text: str, head: bool, headers: Sequence[tuple[str, str]] = ()
) -> Iterable[bytes]:
    """A one-line ``text/plain`` answer (no body for HEAD)."""
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"), *headers])
    return [] if head else [text.encode()]


def guarded(app: WSGIApp, allow: Sequence[str], check: Callable[[str | None], bool], hint: str) -> WSGIApp:
    """``app`` for allowed peers whose token ``check`` accepts; 403 with the knob to change, or with
    ``hint`` (where the token is), for everyone else."""
    networks = [ipaddress.ip_network(n) for n in allow]

    def wrapper(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        head = environ.get("REQUEST_METHOD") == "HEAD"
        if not is_allowed(str(environ.get("REMOTE_ADDR", "")), networks):
            return plain(
                start_response,
                "403 Forbidden",
                "forbidden: the debug endpoints answer loopback "
                "clients only; name more networks with debug_allow= or MEMEXPORTER_DEBUG_ALLOW\n",
                head,
            )
        if not check(presented(environ)):
            return plain(
                start_response, "403 Forbidden", hint, head, [("WWW-Authenticate", 'Bearer realm="memexporter /debug"')]
            )
        # The shared rate limit (serving/router.py), only now: a refused client spent no turn.
        admit = environ.get(ADMIT)
        if callable(admit) and (wait := float(admit())) > 0:
            return too_many(wait)(environ, start_response)
        return app(environ, start_response)

    return wrapper
