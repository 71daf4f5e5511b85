"""Binding the metrics port: serve, or say why not and how to move the port (the caller's way).

A taken port is the usual failure (another job, or dcgm-exporter, on 9400). The advice must work
for the code at hand: a port passed as an argument wins over ``MEMEXPORTER_PORT``, so for that
port the variable is no advice, the argument is.
"""

from __future__ import annotations

import errno
import logging
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from memexporter.config import DEFAULT_PORT, Config
from memexporter.serving.conn import ConnectionStats
from memexporter.serving.server import Route, Server, serve
from memexporter.tracking.history import History

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


def bind(
    registry: CollectorRegistry,
    config: Config,
    port: int,
    stats: ConnectionStats,
    advice: PortAdvice,
    routes: dict[str, Route] | None = None,
    history: History | None = None,
) -> Server | None:
    """Serve, or log why not and go on (``strict``: raise). A bad address or bad TLS files
    raise ``ValueError`` either way: they are bad arguments, not a busy machine."""
    try:
        return serve(
            registry, port, config.addr, config.certfile, config.keyfile, routes=routes, stats=stats, history=history
        )
    except OSError as exc:
        where = f"{config.addr}:{port}"
        rank_port = f" (base port {advice.base} + LOCAL_RANK)" if port != advice.base else ""
        if exc.errno == errno.EADDRINUSE:
            cause = (
                f"port {port}{rank_port} is already in use; {advice.where()}. Each rank binds port + LOCAL_RANK; "
                f"NVIDIA dcgm-exporter also defaults to {DEFAULT_PORT}"
            )
        elif exc.errno == errno.EACCES:
            cause = (
                f"no permission to bind port {port}{rank_port} (ports below 1024 need privileges); "
                f"use a port above 1023: {advice.where()}"
            )
        else:
            cause = f"{exc.strerror or exc}"
        if config.strict:
            raise OSError(exc.errno, f"memexporter: cannot serve metrics on {where}: {cause}") from exc
        log.error(
            "memexporter: cannot serve metrics on %s: %s. Training continues without the /metrics endpoint.",
            where,
            cause,
        )
        return None
