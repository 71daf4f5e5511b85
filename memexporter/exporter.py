"""Lifecycle: ``start()`` builds the sources, the collectors and the helper; ``stop()`` undoes it.

``start()`` is idempotent (a second call warns and returns the running exporter), non-blocking
(the helper process binds and serves; the job publishes a snapshot a second from a daemon thread:
``serving/job/link.py``), and never takes the training job down: a taken port is logged loudly and
training goes on, unless ``strict=True``, which waits for the helper's report and raises. In a forked
child (a DataLoader worker) it does nothing.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from memexporter._version import __version__
from memexporter.collectors import fleet, levers
from memexporter.collectors.registry import GuardedCatalogue, catalogue
from memexporter.collectors.scrape import Sources
from memexporter.config import Config, logs, origin
from memexporter.serving.conn import ConnectionStats
from memexporter.serving.job.binding import PortAdvice, check, port_for_rank
from memexporter.serving.job.link import Link
from memexporter.serving.job.starting import start_helper
from memexporter.tracking import boundaries, inputs, phases, steps

if TYPE_CHECKING:
    from memexporter.diagnose.wiring import Diagnostics
    from memexporter.oom.risk import RiskWatch
    from memexporter.otel import OtelHandle

log = logging.getLogger("memexporter")


class Exporter:
    """A running exporter. ``port`` is the bound port, or ``None`` when the helper could not bind."""

    def __init__(self, config: Config, sources: Sources, registry: CollectorRegistry, link: Link | None) -> None:
        self.config, self.sources, self.registry, self._link = config, sources, registry, link
        self.pid = os.getpid()
        self.tracked: list[Any] = []  # handles from start(model=...), removed on stop()
        self.otel: OtelHandle | None = None  # the OpenTelemetry side (memexporter/otel/), shut down on stop()
        self.diagnostics: Diagnostics | None = None  # debug / oom_dump_dir (memexporter/diagnose)
        self.risk: RiskWatch | None = None  # on_oom_risk's judge, once a callback is registered

    @property
    def port(self) -> int | None:
        """The port the helper bound: waits for its report (``REPORT_WAIT`` s at most; ``start()`` does not)."""
        link = self._link
        if link is None:
            return None
        link.wait()
        return link.port

    @property
    def url(self) -> str | None:
        """The metrics URL, with a host a browser can open (``https`` with TLS, IPv6 in brackets); waits as ``port``."""
        link = self._link
        if link is None or self.port is None:
            return None
        return link.url

    def flush(self) -> bool:
        """Publish a snapshot now and wait until the helper serves it (``REPORT_WAIT`` s at most): for a
        caller that must find what it just did on ``/metrics`` (a test, a script's last step). Snapshots
        are otherwise published once a second. False when no helper runs."""
        link = self._link
        return link.flush() if link is not None and os.getpid() == self.pid else False

    @property
    def helper_pid(self) -> int | None:
        """The helper process's id (None: none runs)."""
        link = self._link
        return link.proc.pid if link is not None and link.proc is not None else None

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
            if self._link is not None:
                atexit.unregister(self._link.at_exit)
                self._link.stop()
                self._link = None
            self.sources.close()  # also after a strict start() that failed, which never became the running one
            if _running is self:
                _running = None
                boundaries.activate(None, auto_step=False)
                phases.activate(None)
                inputs.activate(None)

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        link = self._link
        return f"<memexporter.Exporter url={link.url if link else None} rank={self.sources.rank}>"


_lock = threading.RLock()
_running: Exporter | None = None


def running() -> Exporter | None:
    """The exporter started in this process, if any (never the parent's, in a forked child)."""
    r = _running
    return r if r is not None and r.pid == os.getpid() else None


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
            log.warning(
                "memexporter: already running at %s; start() returns the running exporter",
                _running._link.url if _running._link else None,
            )
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
    port = port_for_rank(config.port, ident.local_rank)
    if config.http:
        check(config)  # a bad addr or TLS file (ValueError), before anything is attached
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
    link = None
    if config.http:
        debug = diagnostics.debug() if diagnostics is not None else None
        link = Link(registry, history, config, port, advice, ident.rank, http_stats, debug, grace=config.end_grace)
        link.levers = levers.for_the_page(sources, levers.findings_of(diagnostics))  # the live page's top three
    exporter = Exporter(config, sources, registry, link)
    exporter.diagnostics = diagnostics
    try:
        if link is not None and not start_helper(link, config.strict, diagnostics, ident.rank, lambda: tracker.steps):
            exporter._link = None
        _attach_otel(exporter, meter_provider)
    except Exception:  # strict: the helper did not start or bind, or the OTLP push cannot be set up: free all first
        exporter.stop()
        raise
    boundaries.activate(tracker, auto_step=config.auto_step)
    phases.activate(phase_tracker)
    inputs.activate(tracker.inputs)
    watch_oom_risk(exporter)
    if config.auto_track:
        _auto_track(exporter)
    if not config.http and exporter.otel is None:
        log.warning(
            "memexporter: http=False and no OpenTelemetry push: nothing publishes the metrics "
            "(turn on the OTLP push: otel=True, --otel under memexporter run, or MEMEXPORTER_OTEL=1 where otel is "
            "not set explicitly; or pass meter_provider=)"
        )
    return exporter


def _auto_track(exporter: Exporter) -> None:
    """Look for the model (``auto_track``) and track it once found, unless one is tracked by then."""
    from memexporter.tracking import discover
    from memexporter.tracking.modules import active_handles

    def found(models: list[Any]) -> None:
        with _lock:
            if running() is not exporter or active_handles():
                return  # stopped meanwhile, or the script tracks a model itself
            discover.track_found(models, exporter.tracked, exporter.config.module_depth, exporter.config.max_modules)

    discover.start(found)


def watch_oom_risk(exporter: Exporter) -> None:
    """Start judging the OOM risk (tracking/risk.py) once an ``on_oom_risk`` callback exists."""
    from memexporter.oom import risk

    if exporter.risk is None and risk.registered():
        exporter.risk = risk.RiskWatch(exporter.sources, callbacks=risk.registered)
        exporter.risk.findings = levers.findings_of(exporter.diagnostics)  # a census names a leak's holder


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
    # The publishing thread does not survive fork, but its channel to the helper and the board do: a
    # DataLoader worker holding the channel would hide the job's end from the helper (no EOF while the
    # worker lives) and could talk to it. Close the child's copies (the parent's stay open); the child
    # never signals the helper. A lock another thread held at fork time would never be released in the
    # child: make a new one.
    global _lock
    _lock = threading.RLock()
    r = _running
    if r is not None and r._link is not None:
        r._link.close_in_child()
    boundaries.activate(None, auto_step=False)
    phases.activate(None)
    inputs.activate(None)


os.register_at_fork(after_in_child=_after_fork_in_child)
