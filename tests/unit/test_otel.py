"""The OpenTelemetry adapter, read through the SDK's InMemoryMetricReader, over the real
exporter on CPU with a real torch training loop."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import memexporter
from memexporter.metrics import SPECS

otel_sdk = pytest.importorskip("opentelemetry.sdk.metrics", reason="opentelemetry-sdk is not installed (pip install memexporter[otel])")
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402

from memexporter import otel  # noqa: E402


@pytest.fixture
def exp() -> Iterator[memexporter.Exporter]:
    memexporter.stop()
    e = memexporter.start(port=0, addr="127.0.0.1", warmup_steps=0)
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        model(torch.randn(4, 16)).sum().backward()
        opt.step()
    yield e
    e.stop()


def read(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, object], float]]]:
    data = reader.get_metrics_data()
    out: dict[str, list[tuple[dict[str, object], float]]] = {}
    if data is None:  # nothing observed at all
        return out
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            assert sm.scope.name == "memexporter"
            for m in sm.metrics:
                out[m.name] = [(dict(p.attributes or {}), float(p.value)) for p in m.data.data_points]
    return out


def test_instruments_come_from_the_spec_table_and_report_values(exp: memexporter.Exporter) -> None:
    reader = InMemoryMetricReader()
    provider = otel_sdk.MeterProvider(metric_readers=[reader])
    bridge = otel.instrument(exp, meter_provider=provider)
    # On a CPU box, exactly the non-CUDA rows of the table become instruments.
    assert set(bridge.instruments) == {s.otel_name for s in SPECS if not s.cuda_only}
    got = read(reader)
    (used,) = [v for attrs, v in got["memexporter.memory.used"] if attrs == {"rank": "0", "device": "cpu"}]
    assert used > 10 << 20
    assert got["memexporter.steps"] == [({"rank": "0"}, 5.0)]
    assert got["process.memory.usage"][0][1] > 0
    assert "memexporter.oom.eta" not in got or all(v < float("inf") for _, v in got["memexporter.oom.eta"])
    bridge.close()
    assert read(reader).get("memexporter.steps", []) == []


def test_units_are_ucum() -> None:
    assert {otel.UCUM[s.unit] for s in SPECS} <= {"By", "s", "1", "By/s", "By/{step}"}


def test_needs_an_exporter() -> None:
    memexporter.stop()
    with pytest.raises(ValueError, match="start"):
        otel.instrument()
