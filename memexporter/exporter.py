"""Lifecycle: ``start()`` builds the sources, the collectors and the server; ``stop()`` undoes it.

``start()`` is idempotent (a second call warns and returns the running exporter), non-blocking
(the server runs in a daemon thread), and never takes the training job down: a taken port is
logged loudly and training goes on, unless ``strict=True``. In a forked child (a DataLoader
worker) it does nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

from prometheus_client import CollectorRegistry

from memexporter import __version__
from memexporter.config import Config
from memexporter.registry import MemexporterCollector, catalogue
from memexporter.scrape import Identity, Sources
from memexporter.server import Server, serve
from memexporter.tracking import steps

log = logging.getLogger("memexporter")


def identity(environ: dict[str, str] | None = None) -> Identity:
    """Rank, local rank and world size from torchrun's variables, falling back to Slurm and Open MPI."""
    env = dict(os.environ if environ is None else environ)

    def first(*names: str, default: str) -> str:
        return next((env[n] for n in names if env.get(n)), default)

    return Identity(
        rank=first("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", default="0"),
        local_rank=first("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", default="0"),
        world_size=first("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", default="1"),
        hostname=socket.gethostname(),
    )


class Exporter:
    """A running exporter. ``port`` is the bound port, or ``None`` when the server could not bind."""

    def __init__(self, config: Config, sources: Sources, registry: CollectorRegistry, server: Server | None) -> None:
        self.config, self.sources, self.registry, self._server = config, sources, registry, server
        self.pid = os.getpid()
        self.tracked: list[Any] = []  # handles from start(model=...), removed on stop()

    @property
    def port(self) -> int | None:
        return self._server.port if self._server is not None else None

    @property
    def url(self) -> str | None:
        """The metrics URL, with a host a browser can open."""
        if self._server is None:
            return None
        host = "localhost" if self._server.addr in ("0.0.0.0", "::", "") else self._server.addr
        return f"http://{host}:{self._server.port}/metrics"

    def stop(self) -> None:
        """Stop serving, free the port, and remove every hook this exporter installed."""
        global _running
        with _lock:
            if os.getpid() != self.pid:
                return
            for handle in self.tracked:
                handle.remove()
            self.tracked.clear()
            if self._server is not None:
                self._server.stop()
                self._server = None
            if _running is self:
                _running = None
                steps.activate(None, auto_step=False)

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<memexporter.Exporter url={self.url} rank={self.sources.rank}>"


_lock = threading.RLock()
_running: Exporter | None = None


def running() -> Exporter | None:
    """The exporter started in this process, if any (never the parent's, in a forked child)."""
    r = _running
    return r if r is not None and r.pid == os.getpid() else None


def start(model: Any = None, optimizer: Any = None, **settings: Any) -> Exporter:
    """See ``memexporter.start``."""
    global _running
    config = Config.resolve(settings)  # bad values raise before anything starts
    with _lock:
        if _running is not None and _running.pid != os.getpid():
            # A forked child inherited the parent's exporter: it must not serve or hook anything.
            return Exporter(config, _running.sources, _running.registry, None)
        if _running is not None:
            log.warning("memexporter: already running at %s; start() returns the running exporter", _running.url)
            return _running
        from memexporter.backends.host import HostBackend
        from memexporter.backends.nvml import NvmlBackend
        from memexporter.backends.torch import TorchBackend

        ident = identity()
        cuda, host = TorchBackend(), HostBackend()
        tracker = steps.StepTracker(cuda, host, window=config.leak_window, warmup_steps=config.warmup_steps)
        sources = Sources(ident, config, cuda, NvmlBackend(), host, tracker, __version__)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(MemexporterCollector(catalogue(), sources))
        port = config.port + int(ident.local_rank) if config.port else 0
        server = _bind(registry, config, port)
        exporter = Exporter(config, sources, registry, server)
        steps.activate(tracker, auto_step=config.auto_step)
        _running = exporter
    if model is not None:
        from memexporter.tracking.modules import track

        exporter.tracked.append(track(model, optimizer))
    if server is not None:
        log.info("memexporter: serving %s (rank %s)", exporter.url, ident.rank)
    return exporter


def _bind(registry: CollectorRegistry, config: Config, port: int) -> Server | None:
    try:
        return serve(registry, port, config.addr, config.certfile, config.keyfile)
    except OSError as exc:
        if config.strict:
            raise
        log.error(
            "memexporter: cannot serve metrics on %s:%d (%s). Training continues without the "
            "/metrics endpoint. Pick another base port with start(port=...) or MEMEXPORTER_PORT "
            "(each rank binds port + LOCAL_RANK); note that NVIDIA dcgm-exporter also defaults to 9400.",
            config.addr, port, exc,
        )
        return None


def stop() -> None:
    """Stop the running exporter, if any."""
    r = running()
    if r is not None:
        r.stop()


def _after_fork_in_child() -> None:
    # The server thread does not survive fork; make sure nothing in the child believes it runs.
    # (running() and the hooks also compare pids, for forks that bypass os.fork.)
    steps.activate(None, auto_step=False)


os.register_at_fork(after_in_child=_after_fork_in_child)
