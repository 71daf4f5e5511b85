"""The public functions. ``memexporter/__init__.py`` re-exports them and nothing else."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from memexporter import exporter as _exporter
from memexporter.backends.torchcheck import require_torch
from memexporter.config import KNOBS
from memexporter.exporter import Exporter
from memexporter.tracking import boundaries as _boundaries
from memexporter.tracking import phases as _phases

__all__ = ["Exporter", "Phase", "on_oom_risk", "phase", "start", "step", "step_input", "stop", "track"]

F = TypeVar("F", bound=Callable[..., Any])

if TYPE_CHECKING:
    from memexporter.oom.risk import OomRisk, RiskHandle
    from memexporter.tracking.modules import TrackHandle


def start(
    port: int | None = None,
    *,
    addr: str | None = None,
    strict: bool | None = None,
    certfile: str | None = None,
    keyfile: str | None = None,
    memory_limit_bytes: int | str | None = None,
    leak_window: int | None = None,
    warmup_steps: int | None = None,
    max_input_elements: int | None = None,
    auto_step: bool | None = None,
    module_depth: int | None = None,
    max_modules: int | None = None,
    auto_track: bool | None = None,
    otel: bool | None = None,
    http: bool | None = None,
    end_grace: int | None = None,
    debug: bool | None = None,
    debug_allow: str | list[str] | None = None,
    record_history: bool | None = None,
    oom_dump_dir: str | None = None,
    census_every: int | None = None,
    census_budget: float | None = None,
    run_id: str | None = None,
    log_level: str | None = None,
    detail_ranks: str | None = None,
    model: Any = None,
    optimizer: Any = None,
    meter_provider: Any = None,
) -> Exporter:
    """Start serving this process's memory state on ``http://<addr>:<port + LOCAL_RANK>/metrics``.

    Non-blocking and idempotent: a second call warns and returns the running exporter. Every
    keyword except ``model``/``optimizer`` also reads ``MEMEXPORTER_<NAME>`` from the environment;
    an explicit argument wins. Defaults: port 9400, all interfaces. See the configuration
    table of docs/configuration.md for each knob.

    ``model=`` (and ``optimizer=``) also starts per-module tracking, as ``track(model, optimizer)``,
    with ``module_depth`` and ``max_modules``. ``auto_track=True`` finds the model by itself.

    OpenTelemetry: ``otel=True`` pushes the same metrics over OTLP, configured by the standard
    ``OTEL_*`` variables; ``meter_provider=`` publishes them on the application's
    ``MeterProvider`` instead (memexporter never sets the global one). ``http=False`` opens no port.

    HTTP is served by a helper process that ``start()`` spawns (a fresh interpreter that never imports
    torch): the job publishes a snapshot a second, and no scrape runs Python in the training process.
    When the job ends, the helper serves the last snapshot and how the job ended for ``end_grace`` seconds.

    ``debug=True`` adds ``/debug/memory`` and ``/debug/snapshot`` (see docs/debugging.md); ``oom_dump_dir=`` writes a pre-mortem there before an OOM.

    Raises ``TypeError``/``ValueError`` naming a bad value, and ``ImportError`` saying what to do
    when torch is missing or older than ``memexporter.backends.torchcheck.MIN_TORCH``. A port that is taken
    is logged and training goes on (``Exporter.port`` is ``None``), unless ``strict=True``, which
    raises ``OSError``.
    """
    require_torch()
    given = locals()  # the keywords, named as the knobs: built from KNOBS, so none is forgotten
    settings: dict[str, Any] = {knob.name: given[knob.name] for knob in KNOBS}
    return _exporter.start(model=model, optimizer=optimizer, meter_provider=meter_provider, **settings)


def stop() -> None:
    """Stop the running exporter (free the port, remove its hooks). A no-op when none runs."""
    _exporter.stop()


def step(count: int | None = None) -> None:
    """Mark a training-step boundary by hand.

    Optional: every ``optimizer.step()`` is detected. Call it when one optimizer step is not one
    step of yours; from the first call on, optimizer steps no longer count. ``count`` is your own
    step number (a trainer's global step): ``memexporter_steps_total`` takes it when it is ahead
    (it never goes back). Cheap; never raises.
    """
    _boundaries.step(count)


def step_input(batch: Any = None, *, elements: int | None = None, length: int | None = None) -> None:
    """Report what this training step was given, for a loop whose model is not tracked.

    A tracked model measures its own input (its outermost training forward's tensors); call this when
    none is tracked, or when the model is fed something else than tensors. Either ``batch``: a tensor,
    or a tuple, list or dict of them (one level deep, as ``model(**batch)`` takes them), measured from
    shapes only; or ``elements`` (and ``length``, the sequence length) as numbers. A step's input is
    the largest reported in it. From these and the step peaks the exporter learns the largest input
    that fits (``memexporter_input_capacity_elements``). Cheap (shapes only, no device sync); a no-op
    while no exporter runs. Raises ``TypeError``/``ValueError`` for bad numbers only.
    """
    for name, value in (("elements", elements), ("length", length)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"memexporter.step_input: {name} must be an int, got {value!r}")
        if value is not None and value < 0:
            raise ValueError(f"memexporter.step_input: {name} must be >= 0, got {value!r}")
    from memexporter.tracking import inputs

    log = inputs.active()
    if log is None:
        return
    if elements is not None:
        log.note(elements, length or 0, 0)
    elif batch is not None:
        inputs.note_call((batch,), None)


class Phase:
    """A named phase of the run: ``with memexporter.phase("eval"): ...`` or ``@memexporter.phase("eval")``.

    Each occurrence gets its peak per device, duration and count on ``/metrics``
    (``memexporter_phase_*``). Nesting is allowed (each open phase counts); one object may be
    entered on several threads at once. ``eval``, ``validation``, ``test``, ``predict`` and
    ``checkpoint`` happen between training steps: their memory is kept out of the step peak.
    A no-op while no exporter runs. Costs one memory reading (a few microseconds on CPU) at each end.
    """

    __slots__ = ("_open", "name")

    def __init__(self, name: str) -> None:
        if not isinstance(name, str):
            raise TypeError(f"memexporter.phase: the name must be a str, got {type(name).__name__}")
        if not name.strip():
            raise ValueError("memexporter.phase: the name must not be empty")
        self.name = name
        self._open: dict[int, list[Any]] = {}  # thread id -> occurrences this object opened, innermost last

    def __enter__(self) -> Phase:
        tracker = _phases.active()
        token = tracker.enter(self.name) if tracker is not None else None
        self._open.setdefault(threading.get_ident(), []).append((tracker, token))
        return self

    def __exit__(self, *exc: object) -> None:
        opened = self._open.get(threading.get_ident())
        if opened:
            tracker, token = opened.pop()
            if tracker is not None and token is not None:
                tracker.exit(token)
            if not opened:
                self._open.pop(threading.get_ident(), None)

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"memexporter.phase({self.name!r})"


def phase(name: str) -> Phase:
    """A phase of the run named ``name``: a context manager and a decorator (see ``Phase``)."""
    return Phase(name)


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


def on_oom_risk(fn: Callable[[OomRisk], None]) -> RiskHandle:
    """Call ``fn(risk)`` when an OOM is minutes away: once per risk episode, on the training thread
    at a step boundary (save a checkpoint, lower the batch size, dump state).

    The judgement is the critical alert's (``MemexporterOOMImminent`` with its default
    thresholds): the recent step peak, or an evaluation's peak, above 97% of the limit; or above
    80% with the in-process ETA under 30 minutes. It is made off the training thread once a
    second; a scrape or a client never triggers it. ``risk`` is a ``memexporter.oom.risk.OomRisk``
    (device, used/peak/limit bytes, ETA seconds, reason, phase, step, and ``levers``: what would make
    it fit, largest first, each a ``memexporter.oom.levers.Lever`` estimate). Register before or after
    ``start()``; returns a handle to ``remove()``. A callback that raises is logged and counted,
    never raised into training.
    """
    from memexporter.oom import risk

    handle = risk.register(fn)
    with _exporter._lock:
        running = _exporter.running()
        if running is not None:
            _exporter.watch_oom_risk(running)
    return handle
