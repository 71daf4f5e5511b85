"""OTLP push set up from the environment, in-process: a real gRPC receiver, an endpoint nobody
listens on, and every set-up error a user can make (each one log line, training unaffected)."""

from __future__ import annotations

import logging
import sys
import time
import urllib.request

import pytest

import memexporter
from memexporter.exporter import running

pytest.importorskip(
    "opentelemetry.sdk.metrics", reason="opentelemetry-sdk is not installed (pip install memexporter[otel])"
)
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

from memexporter.otel import sdk
from memexporter.otel.reporting import ReportingExporter
from tests.support.otlp import metrics, points, resource
from tests.support.ports import closed_port
from tests.support.web import get_text

pytestmark = pytest.mark.usefixtures("otel_push_environment")  # tests/support/fixtures.py


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_grpc_push_with_headers_and_resource_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("grpc", reason="grpcio is not installed (pip install memexporter[otel-grpc])")
    from tests.support.otlp import grpc_receiver

    with grpc_receiver() as (endpoint, store):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=team-a")
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=ci,service.instance.id=trainer-7")
        exp = memexporter.start(otel=True, http=False)
        assert exp.otel is not None and exp.otel.push is not None and exp.otel.push.protocol == "grpc"
        got = store.wait_for(lambda rs: len(rs) >= 2, 20, "two gRPC pushes")
        exp.stop()
    assert got[0].headers["x-tenant"] == "team-a"
    res = resource(got[-1])
    assert res["service.name"] == "memexporter"  # the default: Prometheus makes job="memexporter" of it
    assert res["service.instance.id"] == "trainer-7"  # the environment wins over memexporter's default
    assert res["deployment.environment.name"] == "ci"
    assert res["memexporter.rank"] == "0" and res["process.pid"] > 0
    (info,) = points(metrics(got[-1])["memexporter.build.info"])
    assert info[0]["version"] == memexporter.__version__ and info[1] == 1.0


def test_unreachable_endpoint_is_one_line_and_stop_does_not_wait(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")  # seconds: one retry, then the batch is given up
    with caplog.at_level(logging.DEBUG):
        exp = memexporter.start(port=0, addr="127.0.0.1", otel=True)
        assert exp.otel is not None and exp.otel.push is not None
        deadline = time.monotonic() + 20
        while not exp.otel.push.exporter.failing and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # several more failing cycles
        body = get_text(exp.url, 5)
        started = time.monotonic()
        exp.stop()
        took = time.monotonic() - started
    assert "memexporter_steps_total" in body  # /metrics keeps serving
    (line,) = errors(caplog)
    assert f"OTEL_EXPORTER_OTLP_ENDPOINT={url!r}" in line and "Connection refused" in line, line
    assert took < 2.0, f"stop() waited {took:.1f} s for a collector that is not there"


@pytest.mark.parametrize(
    ("env", "blocked", "named"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, None, "OTEL_EXPORTER_OTLP_PROTOCOL='http/json'"),
        (
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "udp"},
            None,
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL='udp'",
        ),
        ({}, "opentelemetry.sdk.metrics", "pip install 'memexporter[otel]'"),
        (
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
            "OTEL_EXPORTER_OTLP_PROTOCOL='grpc' needs opentelemetry-exporter-otlp-proto-grpc",
        ),
    ],
)
def test_setup_errors_are_one_line_and_http_keeps_serving(
    env: dict[str, str],
    blocked: str | None,
    named: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if blocked:  # as if the package were not installed: importing it raises ImportError
        monkeypatch.setitem(sys.modules, blocked, None)
    with caplog.at_level(logging.INFO):
        exp = memexporter.start(port=0, addr="127.0.0.1", otel=True)
    (line,) = errors(caplog)
    assert named in line, line
    assert exp.otel is None
    assert urllib.request.urlopen(exp.url, timeout=5).status == 200


def test_strict_raises_on_setup_errors_and_frees_the_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(sdk.OtelSetupError, match="http/json"):
        memexporter.start(port=0, addr="127.0.0.1", otel=True, strict=True)
    assert running() is None


def test_sdk_disabled_is_respected(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    with caplog.at_level(logging.INFO):
        exp = memexporter.start(port=0, addr="127.0.0.1", otel=True)
    assert exp.otel is None
    assert ["OTEL_SDK_DISABLED" in m for m in errors(caplog)] == [True]


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
