"""The HTTP endpoint the helper runs: the snapshots behind a router, on a hardened server with a CPU budget.

``/metrics`` and ``/live.json`` (``serving.exposition``: the latest snapshot, text or OpenMetrics as
the scraper's ``Accept`` asks, each variant made once per snapshot), ``/`` (a landing page),
``/healthz`` and any extra ``Route`` (``serving.router``); anything else is a 404. The server
under it is ``memexporter.serving``: a CPU budget for everything clients trigger, a bounded
number of connections, one deadline per connection, TLS handshakes that cannot block the
acceptor, nothing on anyone's stderr, and a ``stop()`` that closes every connection at once.

Why not prometheus_client's ``start_wsgi_server``: one thread per connection with no cap, an idle
timeout that restarts on every byte (a trickling client holds a thread forever), a traceback on
stderr per reset connection, ``socket.getfqdn()`` (DNS) in ``bind``, a listen backlog of 5, and
TLS on the listening socket, so one silent client blocks every handshake.
"""

from __future__ import annotations

import errno
import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from memexporter.serving.board import Snapshot
from memexporter.serving.budget import Budget
from memexporter.serving.conn import ConnectionStats
from memexporter.serving.exposition import Exposition
from memexporter.serving.handler import WSGIApp, answerer
from memexporter.serving.listener import BACKLOG, DEADLINE, Listener
from memexporter.serving.router import Route, router

__all__ = ["Route", "Server", "WSGIApp", "listening_socket", "router", "serve", "tls_context", "url"]


@dataclass
class Server:
    """A running HTTP server. ``port`` is the bound port (useful with port 0)."""

    listener: Listener
    addr: str
    port: int
    tls: bool
    exposition: Exposition | None = None  # /metrics (``renders`` counts its variants)

    @property
    def stats(self) -> ConnectionStats:
        return self.listener.stats

    @property
    def budget(self) -> Budget:
        return self.listener.budget

    @property
    def url(self) -> str:
        return url(self.addr, self.port, self.tls)

    def stop(self) -> None:
        """Stop serving, close every connection accepted so far, and free the port."""
        self.listener.close()

    def close_in_child(self) -> None:
        """In a forked child: close the inherited sockets, so the port and the clients are the parent's alone."""
        self.listener.close_in_child()


def url(addr: str, port: int, tls: bool, path: str = "/metrics") -> str:
    """A URL a browser or ``curl`` can open: ``https`` with TLS, IPv6 in brackets (RFC 3986) with
    a zone as ``%25``, and ``localhost`` for the all-interfaces addresses."""
    host = "localhost" if addr in ("0.0.0.0", "::", "") else addr
    if ":" in host:
        host = "[" + host.replace("%", "%25") + "]"
    return f"{'https' if tls else 'http'}://{host}:{port}{path}"


def tls_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    """A server context from PEM files. ``ValueError`` names the setting and the file when a
    file holds no certificate, the key is not a PEM key, does not match, or is encrypted (OpenSSL
    would otherwise ask for a passphrase on the terminal and block ``start()``)."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=certfile)
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(f"memexporter: certfile {certfile!r} holds no readable PEM certificate ({exc})") from None

    def no_passphrase() -> str:
        raise ValueError(f"memexporter: keyfile {keyfile!r} is encrypted; give an unencrypted PEM key")

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2  # Prometheus' own floor
    try:
        context.load_cert_chain(certfile, keyfile, password=no_passphrase)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise ValueError(f"memexporter: keyfile {keyfile!r} does not match certfile {certfile!r}") from None
        raise ValueError(f"memexporter: keyfile {keyfile!r} holds no readable PEM private key ({exc})") from None
    except OSError as exc:
        raise ValueError(f"memexporter: keyfile {keyfile!r} cannot be read ({exc})") from None
    return context


def listening_socket(addr: str, port: int, listen: bool = True) -> socket.socket:
    """Bound and listening (``listen``), with no name resolution: ``addr`` must be an IP literal.

    ``ValueError`` for an address that is not one, or not one of this host's; ``OSError`` for
    the rest (a port that is taken, a privileged port).
    """
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE | socket.AI_NUMERICHOST
        )[0]
    except socket.gaierror:
        raise ValueError(f"memexporter: addr must be an IP address (0.0.0.0, 127.0.0.1, ::...), got {addr!r}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart while TIME_WAITs linger
        sock.bind(sockaddr)
        if listen:
            sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRNOTAVAIL:
            raise ValueError(
                f"memexporter: addr {addr!r} is not an address of this host; "
                "use 0.0.0.0 (all interfaces), 127.0.0.1, or one of its addresses"
            ) from None
        raise
    return sock


def serve(
    current: Callable[[], Snapshot | None],
    port: int,
    addr: str,
    certfile: str | None = None,
    keyfile: str | None = None,
    title: str = "memexporter",
    routes: Mapping[str, Route] | None = None,
    stats: ConnectionStats | None = None,
    deadline: float = DEADLINE,
    budget: Budget | None = None,
    sock: socket.socket | None = None,
) -> Server:
    """Bind (or take ``sock``, bound and listening) and serve ``current()``'s snapshots in daemon threads,
    without blocking on DNS or on any client.

    Raises ``ValueError`` for a bad address or bad TLS files, ``OSError`` when binding fails
    otherwise (the port is taken, say).
    """
    context = tls_context(certfile, keyfile) if certfile and keyfile else None
    budget = budget or Budget()
    exposition = Exposition(current, "text")
    live = Exposition(current, "live")  # the live page's data
    app = router(exposition, title, routes, budget, live)
    sock = sock if sock is not None else listening_socket(addr, port)
    bound = int(sock.getsockname()[1])
    listener = Listener(
        sock, answerer(app, bound), stats or ConnectionStats(), context, deadline=deadline, budget=budget
    )
    listener.start()
    return Server(listener=listener, addr=addr, port=bound, tls=context is not None, exposition=exposition)
