"""OTLP push set up from the environment, in-process, against what waits on the network: a real gRPC
receiver gets the headers and the resource the environment names, and an endpoint nobody listens
on is one log line while /metrics keeps serving and ``stop()`` does not wait for it (the set-up
errors: tests/unit/otel/test_sdk.py; ``memexporter run`` and the bootstrap pushing:
test_otlp_push.py)."""

from __future__ import annotations

import logging
import time

import pytest

import memexporter

pytest.importorskip(
    "opentelemetry.sdk.metrics", reason="opentelemetry-sdk is not installed (pip install memexporter[otel])"
)

from tests.support.otlp import metrics, points, resource
from tests.support.ports import closed_port
from tests.support.web import get_text

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("otel_push_environment")]


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
