"""The public functions. ``memexporter/__init__.py`` re-exports them and nothing else."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memexporter import exporter as _exporter
from memexporter.exporter import Exporter
from memexporter.torchcheck import require_torch

__all__ = ["Exporter", "start", "step", "stop", "track"]
from memexporter.tracking import steps as _steps

if TYPE_CHECKING:
    from memexporter.tracking.modules import TrackHandle


def start(
    port: int | None = None,
    *,
    addr: str | None = None,
    strict: bool | None = None,
    certfile: str | None = None,
    keyfile: str | None = None,
    memory_limit_bytes: int | None = None,
    leak_window: int | None = None,
    warmup_steps: int | None = None,
    auto_step: bool | None = None,
    module_depth: int | None = None,
    max_modules: int | None = None,
    auto_track: bool | None = None,
    otel: bool | None = None,
    http: bool | None = None,
    debug: bool | None = None,
    debug_allow: str | list[str] | None = None,
    record_history: bool | None = None,
    oom_dump_dir: str | None = None,
    census_every: int | None = None,
    census_budget: float | None = None,
    model: Any = None,
    optimizer: Any = None,
    meter_provider: Any = None,
) -> Exporter:
    """Start serving this process's memory state on ``http://<addr>:<port + LOCAL_RANK>/metrics``.

    Non-blocking and idempotent: a second call warns and returns the running exporter. Every
    keyword except ``model``/``optimizer`` also reads ``MEMEXPORTER_<NAME>`` from the environment;
    an explicit argument wins. Defaults: port 9400, all interfaces. See the README's configuration
    table for each knob.

    ``model=`` (and ``optimizer=``) also starts per-module tracking, as ``track(model, optimizer)``,
    with ``module_depth`` and ``max_modules``. ``auto_track=True`` finds the model by itself.

    OpenTelemetry: ``otel=True`` pushes the same metrics over OTLP, configured by the standard
    ``OTEL_*`` variables; ``meter_provider=`` publishes them on the application's
    ``MeterProvider`` instead (memexporter never sets the global one). ``http=False`` opens no port.

    ``debug=True`` adds ``/debug/memory`` and ``/debug/snapshot`` (see the README's "When the page
    comes"); ``oom_dump_dir=`` writes a pre-mortem there before an OOM.

    Raises ``TypeError``/``ValueError`` naming a bad value, and ``ImportError`` saying what to do
    when torch is missing or older than ``memexporter.torchcheck.MIN_TORCH``. A port that is taken
    is logged and training goes on (``Exporter.port`` is ``None``), unless ``strict=True``, which
    raises ``OSError``.
    """
    require_torch()
    settings: dict[str, Any] = {
        "port": port, "addr": addr, "strict": strict, "certfile": certfile, "keyfile": keyfile,
        "memory_limit_bytes": memory_limit_bytes, "leak_window": leak_window,
        "warmup_steps": warmup_steps, "auto_step": auto_step, "module_depth": module_depth,
        "max_modules": max_modules, "auto_track": auto_track, "otel": otel, "http": http,
        "debug": debug, "debug_allow": debug_allow, "record_history": record_history,
        "oom_dump_dir": oom_dump_dir, "census_every": census_every, "census_budget": census_budget,
    }
    return _exporter.start(model=model, optimizer=optimizer, meter_provider=meter_provider, **settings)


def stop() -> None:
    """Stop the running exporter (free the port, remove its hooks). A no-op when none runs."""
    _exporter.stop()


def step() -> None:
    """Mark a training-step boundary by hand.

    Optional: every ``optimizer.step()`` is detected. Call it when one optimizer step is not one
    step of yours; from the first call on, optimizer steps no longer count. Cheap; never raises.
    """
    _steps.step()


def track(model: Any, optimizer: Any = None, **options: Any) -> TrackHandle:
    """Report per-module parameter, gradient, optimizer-state and activation bytes for ``model``.

    Returns a handle: ``handle.remove()``, or use it as a context manager. Options (``depth``,
    ``max_modules``, ``prefix``...) are documented in ``docs/modules.md``; ``depth`` and
    ``max_modules`` default to the running exporter's ``module_depth`` and ``max_modules`` (so
    ``memexporter run --max-modules 20`` applies to a script's own ``track()``). ``optimizer`` may
    be a framework's wrapper (accelerate, Lightning). Raises only for bad arguments.
    """
    require_torch()
    from memexporter.tracking.modules import track as _track

    running = _exporter.running()
    if running is not None:
        options.setdefault("depth", running.config.module_depth)
        options.setdefault("max_modules", running.config.max_modules)
    return _track(model, optimizer, **options)
