"""The OpenTelemetry side of start(): the bridge read through the SDK's InMemoryMetricReader, over
the real exporter on CPU (a real torch loop) or fake backends (SYNTHETIC GPU numbers, fakes.py)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

import memexporter
from memexporter.exporter import running
from memexporter.metrics import SPECS

otel_sdk = pytest.importorskip(
    "opentelemetry.sdk.metrics", reason="opentelemetry-sdk is not installed (pip install memexporter[otel])"
)
from opentelemetry import metrics as otel_api  # noqa: E402
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader, Sum  # noqa: E402

from memexporter.otel import names  # noqa: E402
from memexporter.otel.bridge import OtelBridge  # noqa: E402
from tests.support.fakes import FakeCuda, FakeNvml, GiB, MiB, one_gpu, registry_for, sources  # noqa: E402

Points = dict[str, list[tuple[dict[str, Any], float]]]


def read(reader: InMemoryMetricReader) -> tuple[Points, dict[str, Any]]:
    """``({instrument: [(attributes, value)]}, {instrument: data})`` of one collection."""
    data = reader.get_metrics_data()
    points: Points = {}
    kinds: dict[str, Any] = {}
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            assert sm.scope.name == "memexporter"
            for m in sm.metrics:
                points[m.name] = [(dict(p.attributes or {}), float(p.value)) for p in m.data.data_points]
                kinds[m.name] = m.data
    return points, kinds


def train(steps: int) -> None:
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.randn(4, 16)).sum().backward()
        opt.step()


@pytest.fixture
def reader(no_exporter: None) -> InMemoryMetricReader:
    return InMemoryMetricReader()


def test_start_with_the_applications_provider(reader: InMemoryMetricReader) -> None:
    global_before = otel_api.get_meter_provider()
    provider = otel_sdk.MeterProvider(metric_readers=[reader])
    exp = memexporter.start(port=0, addr="127.0.0.1", warmup_steps=0, meter_provider=provider)
    train(5)
    got, kinds = read(reader)
    (used,) = [v for attrs, v in got["memexporter.memory.used"] if attrs == {"rank": "0", "device": "cpu"}]
    assert used > 10 << 20
    assert got["memexporter.steps"] == [({"rank": "0"}, 5.0)]
    # One registry walk per collection: the semantic-convention twin reads the very same sample.
    assert got["process.memory.usage"] == [({}, got["memexporter.host.rss"][0][1])]
    # Counters are cumulative monotonic sums; the conventions' UpDownCounters non-monotonic sums.
    steps, rss = kinds["memexporter.steps"], kinds["process.memory.usage"]
    assert (
        isinstance(steps, Sum)
        and steps.is_monotonic
        and steps.aggregation_temporality is AggregationTemporality.CUMULATIVE
    )
    assert isinstance(rss, Sum) and not rss.is_monotonic
    assert otel_api.get_meter_provider() is global_before, "memexporter must never set the global provider"
    assert exp.otel is not None and exp.otel.push is None  # nothing of its own to push with
    exp.stop()
    assert read(reader)[0] == {}, "stop() must silence the instruments on the application's provider"


def test_start_again_on_the_same_provider_reports_again(reader: InMemoryMetricReader) -> None:
    provider = otel_sdk.MeterProvider(metric_readers=[reader])
    memexporter.start(port=0, addr="127.0.0.1", meter_provider=provider).stop()
    assert read(reader)[0] == {}
    memexporter.start(port=0, addr="127.0.0.1", meter_provider=provider)
    assert read(reader)[0]["memexporter.build.info"], "the second start() must report through the same instruments"


def test_infinite_eta_is_no_point_and_no_sdk_warning(
    reader: InMemoryMetricReader, caplog: pytest.LogCaptureFixture
) -> None:
    exp = memexporter.start(
        port=0,
        addr="127.0.0.1",
        warmup_steps=0,
        leak_window=8,
        meter_provider=otel_sdk.MeterProvider(metric_readers=[reader]),
    )
    train(12)
    scraped = {
        s.labels["device"]: s.value
        for f in exp.registry.collect()
        for s in f.samples
        if s.name == "memexporter_oom_eta_seconds"
    }
    assert scraped == {"cpu": float("inf")}  # a flat CPU loop: not growing
    with caplog.at_level(logging.WARNING):
        got, _ = read(reader)
    assert "memexporter.oom.eta" not in got
    assert got["memexporter.leak.bytes_per_step"]  # the trend rows themselves are there
    assert not [r for r in caplog.records if "non-finite" in r.getMessage()]


def test_cuda_instruments_exist_up_front_and_report_once_a_device_is_in_use() -> None:
    cuda, nvml = FakeCuda(), FakeNvml()
    reader = InMemoryMetricReader()
    bridge = OtelBridge(
        registry_for(sources(cuda, nvml)), otel_sdk.MeterProvider(metric_readers=[reader]).get_meter("memexporter")
    )
    assert set(bridge.instruments) == {i.name for i in names.instruments()}
    got, _ = read(reader)
    assert "memexporter.allocator.allocated" not in got and "hw.gpu.memory.usage" not in got
    # model.cuda() happens after start(): the same instruments now report the device.
    gpu_cuda, gpu_nvml = one_gpu()
    cuda.stats, cuda.uuids, nvml.devices = gpu_cuda.stats, gpu_cuda.uuids, gpu_nvml.devices
    got, kinds = read(reader)
    assert got["memexporter.allocator.allocated"] == [({"rank": "3", "device": "cuda:0"}, 3.0 * GiB)]
    assert got["memexporter.allocator.ooms"] == [({"rank": "3", "device": "cuda:0"}, 1.0)]
    gpu = {"hw.id": "GPU-synthetic-0", "hw.type": "gpu", "hw.name": "Synthetic GPU", "hw.vendor": "nvidia"}
    used = 10.0 * GiB - 512 * MiB  # NVML v2: the driver's 512 MiB reservation apart
    assert got["hw.gpu.memory.usage"] == [(gpu, used)]
    assert got["hw.gpu.memory.limit"] == [(gpu, 80.0 * GiB)]
    assert got["memexporter.device.used"] == [({"rank": "3", "device": "cuda:0"}, used)]
    assert got["memexporter.device.reserved"] == [({"rank": "3", "device": "cuda:0"}, 512.0 * MiB)]
    assert not kinds["hw.gpu.memory.usage"].is_monotonic


def test_one_registry_walk_per_collection() -> None:
    reg = registry_for(sources())
    walks = 0

    class Counting:
        def collect(self) -> Any:
            nonlocal walks
            walks += 1
            return reg.collect()

    reader = InMemoryMetricReader()
    OtelBridge(Counting(), otel_sdk.MeterProvider(metric_readers=[reader]).get_meter("memexporter"))
    for _ in range(3):
        read(reader)
    assert walks == 3, f"{len(SPECS)} instruments must share one walk per collection, got {walks} walks for 3"


def _listening_ports() -> set[int]:
    import psutil

    return {c.laddr.port for c in psutil.Process().net_connections("inet") if c.status == psutil.CONN_LISTEN}


def test_push_only_opens_no_port(reader: InMemoryMetricReader, caplog: pytest.LogCaptureFixture) -> None:
    before = _listening_ports()
    exp = memexporter.start(http=False, meter_provider=otel_sdk.MeterProvider(metric_readers=[reader]))
    assert (exp.port, exp.url) == (None, None)
    assert _listening_ports() == before
    assert read(reader)[0]["memexporter.build.info"]
    exp.stop()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="memexporter"):
        memexporter.start(http=False)  # neither HTTP nor OpenTelemetry: said once, loudly
    assert ["nothing publishes the metrics" in r.getMessage() for r in caplog.records] == [True]


@pytest.mark.parametrize(
    ("settings", "env", "error", "named"),
    [
        ({}, {"MEMEXPORTER_OTEL": "maybe"}, ValueError, "MEMEXPORTER_OTEL"),
        ({}, {"MEMEXPORTER_HTTP": "2"}, ValueError, "MEMEXPORTER_HTTP"),
        ({"otel": "yes please"}, {}, ValueError, "'yes please'"),
        ({"meter_provider": object()}, {}, TypeError, "meter_provider"),
    ],
)
def test_bad_values_fail_fast_naming_the_knob(
    settings: dict[str, Any], env: dict[str, str], error: type, named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    memexporter.stop()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(error, match=named):
        memexporter.start(port=0, **settings)
    assert running() is None
