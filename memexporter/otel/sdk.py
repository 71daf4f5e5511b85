"""A MeterProvider that pushes over OTLP, configured the OpenTelemetry way: by the environment.

Standard variables only: ``OTEL_EXPORTER_OTLP_[METRICS_]PROTOCOL`` (``http/protobuf``, the
default, or ``grpc`` with ``memexporter[otel-grpc]``), ``OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT``,
``_HEADERS``, ``_TIMEOUT``, ``_COMPRESSION``, ``_TEMPORALITY_PREFERENCE`` (read by the SDK's
exporter), ``OTEL_METRIC_EXPORT_INTERVAL``/``_TIMEOUT`` (read by the periodic reader),
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SDK_DISABLED``.

The resource names the process: ``service.name`` defaults to ``memexporter`` (the shipped rules
select ``job="memexporter"``, and Prometheus' OTLP receiver makes ``job`` from it),
``service.instance.id`` to ``<host>/<pid>`` (Prometheus' ``instance``), plus ``host.name``,
``process.pid`` and ``memexporter.{rank,local_rank,world_size}``. What the environment sets wins.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memexporter.collectors.scrape import Identity

# protocol -> (the module holding its OTLPMetricExporter, the pip package, memexporter's extra)
PROTOCOLS = {
    "http/protobuf": (
        "opentelemetry.exporter.otlp.proto.http.metric_exporter",
        "opentelemetry-exporter-otlp-proto-http",
        "otel",
    ),
    "grpc": (
        "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
        "opentelemetry-exporter-otlp-proto-grpc",
        "otel-grpc",
    ),
}
DEFAULT_ENDPOINTS = {"http/protobuf": "http://localhost:4318", "grpc": "http://localhost:4317"}


class OtelSetupError(RuntimeError):
    """OTLP push cannot be set up; the message names the variable, its value and the fix."""


@dataclass(frozen=True)
class Push:
    """A provider memexporter created, and what the log lines say about it."""

    provider: Any
    exporter: Any  # the ReportingExporter inside it
    protocol: str
    target: str
    interval_s: float


def _setting(environ: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """The first of ``names`` set to a non-empty value, as ``(name, value)``."""
    return next(((n, environ[n].strip()) for n in names if environ.get(n, "").strip()), None)


def protocol(environ: Mapping[str, str]) -> str:
    """The OTLP protocol for metrics; ``OtelSetupError`` names the variable of a value we cannot use."""
    found = _setting(environ, "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
    if found is None:
        return "http/protobuf"
    name, value = found
    if value not in PROTOCOLS:
        raise OtelSetupError(
            f"{name}={value!r} is not an OTLP protocol memexporter can push with "
            f"(one of {', '.join(PROTOCOLS)}; the Python SDK has no http/json exporter)"
        )
    return value


def target(environ: Mapping[str, str], proto: str) -> str:
    """Where the SDK's exporter will push, and which variable said so (for log lines)."""
    found = _setting(environ, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
    if found is None:
        base = DEFAULT_ENDPOINTS[proto]
        return (
            f"{base}/v1/metrics (the default; set OTEL_EXPORTER_OTLP_ENDPOINT)"
            if proto != "grpc"
            else f"{base} (the default; set OTEL_EXPORTER_OTLP_ENDPOINT)"
        )
    name, value = found
    # The signal-specific variable is used as given; the generic one gets /v1/metrics over HTTP.
    url = value if name.endswith("METRICS_ENDPOINT") or proto == "grpc" else f"{value.removesuffix('/')}/v1/metrics"
    return f"{url} ({name}={value!r})"


def resource_attributes(ident: Identity, given: Mapping[str, object]) -> dict[str, str | int]:
    """memexporter's defaults for the resource, less what the environment (``given``) sets."""
    ours: dict[str, str | int] = {
        "service.name": "memexporter",
        "service.instance.id": f"{ident.hostname}/{os.getpid()}",
        "host.name": ident.hostname,
        "process.pid": os.getpid(),
        "memexporter.rank": ident.rank,
        "memexporter.local_rank": ident.local_rank,
        "memexporter.world_size": ident.world_size,
    }
    return {k: v for k, v in ours.items() if k not in given}


def disabled(environ: Mapping[str, str]) -> bool:
    """Whether ``OTEL_SDK_DISABLED`` is ``true`` (any case) in ``environ``: the OpenTelemetry SDK's off switch."""
    return environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def push_from_environment(ident: Identity, environ: Mapping[str, str] | None = None) -> Push:
    """A new MeterProvider with a periodic OTLP exporter, or ``OtelSetupError`` saying why not."""
    env = os.environ if environ is None else environ
    proto = protocol(env)
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import OTELResourceDetector, Resource

        from memexporter.otel.reporting import ReportingExporter
    except ImportError as exc:
        raise OtelSetupError(
            f"MEMEXPORTER_OTEL=1 needs the OpenTelemetry SDK ({exc.name or exc} is missing): "
            "pip install 'memexporter[otel]'"
        ) from None
    module, package, extra = PROTOCOLS[proto]
    try:
        exporter_class = importlib.import_module(module).OTLPMetricExporter
    except ImportError as exc:
        name = next(
            (n for n in ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL") if env.get(n)),
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        )
        raise OtelSetupError(
            f"{name}={proto!r} needs {package} ({exc.name or exc} is missing): pip install 'memexporter[{extra}]'"
        ) from None
    where = target(env, proto)
    try:
        inner = exporter_class()  # reads the OTEL_EXPORTER_OTLP_* variables itself
        exporter = ReportingExporter(inner, where)
        reader = PeriodicExportingMetricReader(exporter)
        given = OTELResourceDetector().detect().attributes
        resource = Resource.create(resource_attributes(ident, given))
        # Not shutdown_on_exit: memexporter's own exit hook bounds the final push (OtelHandle).
        provider = MeterProvider(metric_readers=[reader], resource=resource, shutdown_on_exit=False)
    except Exception as exc:  # a malformed OTEL_* value the SDK refuses
        raise OtelSetupError(f"the OpenTelemetry SDK refused the OTLP settings for {where}: {exc}") from None
    return Push(provider, exporter, proto, where, interval_s(env))


def interval_s(environ: Mapping[str, str]) -> float:
    """The export interval the periodic reader uses (``OTEL_METRIC_EXPORT_INTERVAL``, ms; 60 s by default)."""
    try:
        return float(environ.get("OTEL_METRIC_EXPORT_INTERVAL", "") or 60_000) / 1000
    except ValueError:  # the SDK warns and uses its default
        return 60.0
