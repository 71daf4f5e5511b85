"""Lifecycle: ``start()`` builds the sources, the collectors and the server; ``stop()`` undoes it.

``start()`` is idempotent (a second call warns and returns the running exporter), non-blocking
(the server runs in a daemon thread), and never takes the training job down: a taken port is
logged loudly and training goes on, unless ``strict=True``. In a forked child (a DataLoader
worker) it does nothing.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from memexporter._version import __version__
from memexporter.collectors import fleet
from memexporter.collectors.registry import GuardedCatalogue, catalogue
from memexporter.collectors.scrape import Identity, Sources
from memexporter.config import Config, logs, origin
from memexporter.serving.binding import PortAdvice, bind
from memexporter.serving.conn import ConnectionStats
from memexporter.serving.server import Server
from memexporter.tracking import boundaries, phases, steps

if TYPE_CHECKING:
    from memexporter.diagnose.wiring import Diagnostics
    from memexporter.oom.risk import RiskWatch
    from memexporter.otel import OtelHandle

log = logging.getLogger("memexporter")


class Exporter:
    """A running exporter. ``port`` is the bound port, or ``None`` when the server could not bind."""

    def __init__(self, config: Config, sources: Sources, registry: CollectorRegistry, server: Server | None) -> None:
        self.config, self.sources, self.registry, self._server = config, sources, registry, server
        self.pid = os.getpid()
        self.tracked: list[Any] = []  # handles from start(model=...), removed on stop()
        self.otel: OtelHandle | None = None  # the OpenTelemetry side (memexporter/otel/), shut down on stop()
        self.diagnostics: Diagnostics | None = None  # debug / oom_dump_dir (memexporter/diagnose)
        self.risk: RiskWatch | None = None  # on_oom_risk's judge, once a callback is registered

    @property
    def port(self) -> int | None:
        return self._server.port if self._server is not None else None

    @property
    def url(self) -> str | None:
        """The metrics URL, with a host a browser can open (``https`` with TLS, IPv6 in brackets)."""
        return self._server.url if self._server is not None else None

    def stop(self) -> None:
        """Stop serving, free the port, and remove every hook this exporter installed."""
        global _running
        if os.getpid() != self.pid:
            return
        with _lock:
            if self.otel is not None:  # a last push first, while every collector still answers
                self.otel.shutdown()
                self.otel = None
            if _running is self:
                from memexporter.tracking import discover

                discover.stop()
            for handle in self.tracked:
                handle.remove()
            self.tracked.clear()
            if self.diagnostics is not None:
                self.diagnostics.close()
            if self.risk is not None:
                self.risk.stop()
                self.risk = None
            if self._server is not None:
                self._server.stop()
                self._server = None
            if _running is self:
                self.sources.host.close()
            if _running is self:
                _running = None
                boundaries.activate(None, auto_step=False)
                phases.activate(None)

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


def _port_for_rank(config: Config, ident: Identity) -> int:
    """``port + LOCAL_RANK`` (0 stays 0: a free port), validated with errors that name the inputs."""
    try:
        local_rank = int(ident.local_rank)
    except ValueError:
        raise ValueError(f"memexporter: LOCAL_RANK must be an integer, got {ident.local_rank!r}") from None
    if local_rank < 0:
        raise ValueError(f"memexporter: LOCAL_RANK must be >= 0, got {local_rank}")
    if not config.port:
        return 0
    if config.port + local_rank > 65535:
        raise ValueError(
            f"memexporter: port {config.port} + LOCAL_RANK {local_rank} is above 65535; lower the base port"
        )
    return config.port + local_rank


def start(
    model: Any = None,
    optimizer: Any = None,
    meter_provider: Any = None,
    *,
    port_hint: str = "start(port=...) or MEMEXPORTER_PORT",
    **settings: Any,
) -> Exporter:
    """See ``memexporter.start``. ``port_hint`` says how the caller's user sets the port (the
    commands say ``--port``, the bootstrap only has the variable), for the message when the port
    cannot be bound; the message also says where the port in use came from."""
    global _running
    config = Config.resolve(settings)  # bad values raise before anything starts
    logs.set_level(config.log_level)
    port_from = origin("port", settings.get("port"))
    if meter_provider is not None and not callable(getattr(meter_provider, "get_meter", None)):
        raise TypeError(f"memexporter: meter_provider must be an OpenTelemetry MeterProvider, got {meter_provider!r}")
    if _running is not None and _running.pid != os.getpid():
        # A forked child inherited the parent's exporter: it must not serve or hook anything.
        return Exporter(config, _running.sources, _running.registry, None)
    with _lock:
        if _running is not None:
            log.warning("memexporter: already running at %s; start() returns the running exporter", _running.url)
            exporter = _running
            if meter_provider is not None and exporter.otel is None:
                _attach_otel(exporter, meter_provider)  # asked for explicitly: honoured, as model= is
        else:
            exporter = _start_locked(config, meter_provider, PortAdvice(config.port, port_from, port_hint))
            _running = exporter
        if model is not None:
            # Also on an exporter that already runs (MEMEXPORTER_AUTOSTART, `memexporter run`):
            # the model asked for must be tracked. Under the lock, so a concurrent stop() removes it.
            # The depth and row cap: this call's, else the running exporter's (`run --max-modules`).
            from memexporter.tracking import discover
            from memexporter.tracking.modules import track

            discover.stop()  # a model named by hand: nothing to look for
            depth = config.module_depth if settings.get("module_depth") is not None else exporter.config.module_depth
            cap = config.max_modules if settings.get("max_modules") is not None else exporter.config.max_modules
            exporter.tracked.append(track(model, optimizer, depth=depth, max_modules=cap))
    return exporter


def _start_locked(config: Config, meter_provider: Any, advice: PortAdvice) -> Exporter:
    from memexporter.backends import select
    from memexporter.backends.cuda import TorchBackend
    from memexporter.backends.host import HostBackend
    from memexporter.diagnose.wiring import attach as attach_diagnostics
    from memexporter.tracking.history import History

    ident = fleet.identity(run_id=config.run_id, detail_ranks=config.detail_ranks)
    port = _port_for_rank(config, ident)
    (allocator, driver), host = select.backends(), HostBackend()
    # The diagnosis hooks (snapshots, the OOM observer) are CUDA's; elsewhere they stay idle.
    cuda = allocator if isinstance(allocator, TorchBackend) else TorchBackend()
    tracker = steps.StepTracker(
        allocator,
        host,
        window=config.leak_window,
        warmup_steps=config.warmup_steps,
        detail=steps.Detail(steps.DETAIL_EVERY, steps.DETAIL_INTERVAL_S),
    )
    history = History(tracker) if config.http else None  # the live page's last half hour: no page, no record
    if history is not None:
        tracker.add_boundary_callback(history.on_boundary)
    http_stats = ConnectionStats()
    phase_tracker = phases.PhaseTracker(tracker)
    sources = Sources(ident, config, allocator, driver, host, tracker, __version__, http_stats, phase_tracker)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GuardedCatalogue(catalogue(), sources))
    diagnostics = attach_diagnostics(config, sources, cuda)
    routes = diagnostics.routes if diagnostics is not None else None
    try:
        server = bind(registry, config, port, http_stats, advice, routes, history) if config.http else None
    except Exception:  # a bad addr or TLS file (ValueError), or strict: nothing may stay attached
        if diagnostics is not None:
            diagnostics.close()
        raise
    exporter = Exporter(config, sources, registry, server)
    exporter.diagnostics = diagnostics
    if diagnostics is not None and config.http:  # the debug token file is named by the bound port
        diagnostics.served(server.port if server is not None else None)
    try:
        _attach_otel(exporter, meter_provider)
    except Exception:  # strict=True and OTLP push cannot be set up: free the port before raising
        exporter.stop()
        raise
    boundaries.activate(tracker, auto_step=config.auto_step)
    phases.activate(phase_tracker)
    watch_oom_risk(exporter)
    if config.auto_track:
        _auto_track(exporter)
    if server is not None:
        _say_serving(exporter.url, ident.rank)
    elif not config.http and exporter.otel is None:
        log.warning(
            "memexporter: http=False and no OpenTelemetry push: nothing publishes the metrics "
            "(turn on the OTLP push: otel=True, --otel under memexporter run, or MEMEXPORTER_OTEL=1 where otel is "
            "not set explicitly; or pass meter_provider=)"
        )
    return exporter


def _say_serving(url: str | None, rank: str) -> None:
    """Where the metrics are, once per start: logged at INFO when the application set up logging,
    else one line on stderr, since a script that never configures logging would see nothing and not
    know where to look. Nothing else of memexporter's reaches stderr unasked."""
    line = f"memexporter: serving {url} (rank {rank})"
    if log.hasHandlers():
        log.info("%s", line)
    else:
        print(line, file=sys.stderr, flush=True)


def _auto_track(exporter: Exporter) -> None:
    """Look for the model (``auto_track``) and track it once found, unless one is tracked by then."""
    from memexporter.tracking import discover
    from memexporter.tracking.modules import active_handles, track

    def found(models: list[Any]) -> None:
        with _lock:
            if running() is not exporter or active_handles():
                return  # stopped meanwhile, or the script tracks a model itself
            for model in models:
                handle = track(model, None, depth=exporter.config.module_depth, max_modules=exporter.config.max_modules)
                handle.automatic = True
                exporter.tracked.append(handle)
        log.info(
            "memexporter: auto_track: tracking %s (%d module rows at most each)",
            ", ".join(type(m).__name__ for m in models),
            exporter.config.max_modules,
        )

    discover.start(found)


def watch_oom_risk(exporter: Exporter) -> None:
    """Start judging the OOM risk (tracking/risk.py) once an ``on_oom_risk`` callback exists."""
    from memexporter.oom import risk

    if exporter.risk is None and risk.registered():
        exporter.risk = risk.RiskWatch(exporter.sources, callbacks=risk.registered)


def _attach_otel(exporter: Exporter, meter_provider: Any) -> None:
    """The OpenTelemetry side, when asked for (the logic is in memexporter/otel/)."""
    if meter_provider is None and not exporter.config.otel:
        return
    from memexporter.otel import attach

    exporter.otel = attach(
        exporter.registry,
        exporter.sources.identity,
        push=exporter.config.otel,
        meter_provider=meter_provider,
        strict=exporter.config.strict,
    )


def stop() -> None:
    """Stop the running exporter, if any."""
    r = running()
    if r is not None:
        r.stop()


def _after_fork_in_child() -> None:
    # The server thread does not survive fork, but its listening socket does: a DataLoader worker
    # holding it would keep the port bound after the parent's stop(), and new connections would
    # queue unanswered. Close the child's copy (the parent's stays open). A lock another thread
    # held at fork time would never be released in the child: make a new one.
    global _lock
    _lock = threading.RLock()
    r = _running
    if r is not None and r._server is not None:
        r._server.close_in_child()
    boundaries.activate(None, auto_step=False)
    phases.activate(None)


os.register_at_fork(after_in_child=_after_fork_in_child)
