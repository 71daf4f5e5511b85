"""The OTLP exporter's wrapper (otel/reporting.py): one log line when pushes start failing, one when
they work again, whatever the SDK's own client logs in between."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip(
    "opentelemetry.sdk.metrics", reason="opentelemetry-sdk is not installed (pip install memexporter[otel])"
)
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

from memexporter.otel.reporting import ReportingExporter


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# The SDK's exporter module creates its logger at import, before any exporter is wrapped (it
# exists here even when this test runs alone, with the real module never imported).
SDK_LOG = logging.getLogger("opentelemetry.exporter.otlp.proto.http.metric_exporter")


class ScriptedExporter(MetricExporter):
    """An OTLP exporter stand-in that fails, then succeeds, logging as the SDK's HTTP client does."""

    def __init__(self, results: list[MetricExportResult]) -> None:
        super().__init__()
        self.results = results

    def export(self, metrics_data: object, timeout_millis: float = 10_000, **kwargs: object) -> MetricExportResult:
        result = self.results.pop(0)
        if result is MetricExportResult.FAILURE:
            SDK_LOG.error("Failed to export metrics batch code: 404, reason: Not Found")
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        pass


def test_one_line_per_outage_then_one_when_it_recovers(caplog: pytest.LogCaptureFixture) -> None:
    ok, bad = MetricExportResult.SUCCESS, MetricExportResult.FAILURE
    exporter = ReportingExporter(ScriptedExporter([ok, bad, bad, bad, ok, ok, bad]), "http://c:4318/v1/metrics (test)")
    with caplog.at_level(logging.INFO):
        results = [exporter.export(None) for _ in range(7)]  # type: ignore[arg-type]
    assert results == [ok, bad, bad, bad, ok, ok, bad]
    lines = errors(caplog)
    assert len(lines) == 3, lines
    assert "404, reason: Not Found" in lines[0] and "works again" in lines[1] and "cannot push" in lines[2]
    assert exporter.pushes == 3
