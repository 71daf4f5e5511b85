"""OTLP push set up from the environment (otel/sdk.py), in-process: every set-up error a user can
make is one log line and /metrics keeps serving. Pushes to a real gRPC receiver and to an endpoint
nobody listens on: tests/integration/test_otlp_push_in_process.py."""

from __future__ import annotations

import logging
import sys

import pytest

import memexporter
from memexporter.exporter import running

pytest.importorskip(
    "opentelemetry.sdk.metrics", reason="opentelemetry-sdk is not installed (pip install memexporter[otel])"
)

from memexporter.otel import sdk
from tests.support.web import get_text

pytestmark = pytest.mark.usefixtures("otel_push_environment")  # tests/support/fixtures.py


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


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
    assert "memexporter_steps_total" in get_text(exp.url, 5)  # /metrics keeps serving


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
