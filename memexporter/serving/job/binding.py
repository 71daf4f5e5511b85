"""Binding the metrics port, seen from the job: the checks ``start()`` makes itself, and what to say when
the helper reports that it could not bind, with how to move the port (the caller's way).

The helper binds (``serving/helper.py``); the job checks first what is a bad argument rather than a busy
machine (the TLS files, the address), so those still raise ``ValueError`` in ``start()``. A taken port is the
usual failure (another job, or dcgm-exporter, on 9400). The advice must work for the code at hand: a port
passed as an argument wins over ``MEMEXPORTER_PORT``, so for that port the variable is no advice, the
argument is.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from dataclasses import dataclass

from memexporter.config import DEFAULT_PORT, Config
from memexporter.serving.server import listening_socket, tls_context

log = logging.getLogger("memexporter")


@dataclass(frozen=True)
class PortAdvice:
    """How the user at hand moves the port: where the base port came from (``argument``,
    ``environment`` or ``default``) and how this caller's user sets it (``port_hint``)."""

    base: int
    origin: str
    hint: str

    def where(self) -> str:
        """Which change moves the port. An argument wins over ``MEMEXPORTER_PORT``, so for a port
        passed in the code the variable is no advice: the argument is."""
        if self.origin == "argument":
            if self.hint.startswith("--"):  # `memexporter run --port`, the demo
                return f"it comes from {self.hint.split()[0]} {self.base}: pass another base port there"
            return (
                f"it comes from the argument port={self.base} in the code (start(), or a callback's port=), which "
                f"MEMEXPORTER_PORT does not override: change it there, or pass port=None to let MEMEXPORTER_PORT "
                f"choose (default {DEFAULT_PORT})"
            )
        if self.origin == "environment":
            return f"it comes from MEMEXPORTER_PORT={self.base}: set MEMEXPORTER_PORT to another base port"
        return f"{self.base} is the default base port: choose another with {self.hint}"


def port_for_rank(port: int, local_rank: str) -> int:
    """``port + LOCAL_RANK`` (0 stays 0: a free port), validated with errors that name the inputs."""
    try:
        rank = int(local_rank)
    except ValueError:
        raise ValueError(f"memexporter: LOCAL_RANK must be an integer, got {local_rank!r}") from None
    if rank < 0:
        raise ValueError(f"memexporter: LOCAL_RANK must be >= 0, got {rank}")
    if not port:
        return 0
    if port + rank > 65535:
        raise ValueError(f"memexporter: port {port} + LOCAL_RANK {rank} is above 65535; lower the base port")
    return port + rank


def check(config: Config) -> None:
    """What ``start()`` refuses before the helper binds, as before: ``ValueError`` for TLS files that do
    not load and for an address that is not an IP literal or not one of this host's (a bind to a free
    port on it, closed at once: no listening socket stays in the job)."""
    if config.certfile and config.keyfile:
        tls_context(config.certfile, config.keyfile)
    with contextlib.suppress(OSError):  # not a bad argument (no IPv6 stack...): the helper's bind will say
        listening_socket(config.addr, 0, listen=False).close()


def cannot_serve(code: int, error: str, config: Config, port: int, advice: PortAdvice) -> str:
    """Why the helper could not bind ``port`` (``code``: its errno), with the way to move the port."""
    where = f"{config.addr}:{port}"
    rank_port = f" (base port {advice.base} + LOCAL_RANK)" if port != advice.base else ""
    if code == errno.EADDRINUSE:
        cause = (
            f"port {port}{rank_port} is already in use; {advice.where()}. Each rank binds port + LOCAL_RANK; "
            f"NVIDIA dcgm-exporter also defaults to {DEFAULT_PORT}"
        )
    elif code == errno.EACCES:
        cause = (
            f"no permission to bind port {port}{rank_port} (ports below 1024 need privileges); "
            f"use a port above 1023: {advice.where()}"
        )
    else:
        cause = error
    return f"memexporter: cannot serve metrics on {where}: {cause}"


def failed(code: int, error: str, config: Config, port: int, advice: PortAdvice) -> OSError:
    """The bind failure as ``strict=True`` raises it; otherwise it is logged (``log_failure``)."""
    return OSError(code, cannot_serve(code, error, config, port, advice))


def log_failure(message: str) -> None:
    """A failed bind, said loudly once: training goes on."""
    log.error("%s. Training continues without the /metrics endpoint.", message)
