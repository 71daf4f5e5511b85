"""One clear log line when OTLP pushes fail, instead of the SDK's retry chatter on every cycle.

``ReportingExporter`` wraps the SDK's OTLP exporter. While it exports, the OTLP exporter's own
log records (a warning per retry, an error per failed batch, with tracebacks) are taken out of
the job's log: they go to memexporter's logger at DEBUG, and the last one becomes the reason in
memexporter's single ERROR line, which names the endpoint and the variable it came from. When a
push succeeds again, one WARNING line says so. Records the SDK logs for other exporters of the
application pass untouched: the filter acts only inside this exporter's calls, on its thread.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Iterator
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

log = logging.getLogger("memexporter")

_local = threading.local()
_PREFIX = "opentelemetry.exporter.otlp"
_filtered: set[str] = set()


class _Capture(logging.Filter):
    """Swallows records logged inside ``ReportingExporter`` calls, keeping their messages."""

    def filter(self, record: logging.LogRecord) -> bool:
        sink: list[str] | None = getattr(_local, "sink", None)
        if sink is None:
            return True
        message = record.getMessage()
        log.debug("memexporter: OTLP exporter said: %s", message)
        if record.levelno >= logging.WARNING:
            sink.append(message.splitlines()[0] if message else record.levelname)
        return False


def _install_filter() -> None:
    # A filter acts on records logged on its own logger only, so it goes on each of the OTLP
    # exporter's loggers (they exist once the exporter's modules are imported).
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(_PREFIX) and name not in _filtered:
            logging.getLogger(name).addFilter(_Capture())
            _filtered.add(name)


def reason(messages: list[str]) -> str:
    """The most telling of the OTLP exporter's messages about one failed export."""
    for m in messages:  # a socket error buried in urllib3's text: "[Errno 111] Connection refused"
        if found := re.search(r"\[Errno -?\d+\][^\"')]*", m):
            return found.group(0).strip()
    specific = [m for m in messages if not m.rstrip(".").endswith("max retries or shutdown")]
    if specific:  # e.g. "Failed to export metrics batch code: 404, reason: Not Found"
        return re.sub(r",? retrying in [\d.]+s\.?", "", specific[0])
    return "no answer within the export timeout (OTEL_EXPORTER_OTLP_TIMEOUT), or the retries ran out"


@contextlib.contextmanager
def _captured() -> Iterator[list[str]]:
    sink: list[str] = []
    _local.sink = sink
    try:
        yield sink
    finally:
        _local.sink = None


class ReportingExporter(MetricExporter):
    """``inner`` (an OTLP metric exporter), reporting failures once per outage. ``target``
    describes the endpoint for the log line, e.g. ``http://c:4318/v1/metrics (OTEL_EXPORTER_OTLP_ENDPOINT='http://c:4318')``."""

    def __init__(self, inner: MetricExporter, target: str) -> None:
        # The periodic reader takes temporality and aggregation from its exporter: pass the
        # inner one's through (they honour OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE).
        super().__init__(
            preferred_temporality=getattr(inner, "_preferred_temporality", None),
            preferred_aggregation=getattr(inner, "_preferred_aggregation", None),
        )
        self._inner, self.target = inner, target
        self.failing = False
        self.pushes = 0
        self._closed = False
        _install_filter()

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        with _captured() as reasons:
            try:
                result = self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
            except Exception as exc:  # never into the SDK's thread, which would log a traceback each cycle
                reasons.append(repr(exc))
                result = MetricExportResult.FAILURE
        if result is MetricExportResult.SUCCESS:
            self.pushes += 1
            if self.failing:
                self.failing = False
                log.warning("memexporter: OTLP push to %s works again", self.target)
        elif not self.failing:
            self.failing = True
            log.error(
                "memexporter: cannot push metrics over OTLP to %s: %s. Training goes on; memexporter retries "
                "every export interval (OTEL_METRIC_EXPORT_INTERVAL) and logs once a push succeeds again.",
                self.target,
                reason(reasons),
            )
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Idempotent. Called early (before the provider's) when pushes fail: it ends the SDK's
        retry wait at once, so ``stop()`` does not wait for a collector that is not there."""
        if self._closed:
            return
        self._closed = True
        with _captured():
            self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)
