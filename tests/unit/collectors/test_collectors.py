"""Collectors over fake backends: the mapping from backend answers to contract series.
All inputs are SYNTHETIC (see fakes.py)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from memexporter.collectors.allocator import KEYS, AllocatorCollector, fragmentation
from memexporter.collectors.device import DeviceCollector
from memexporter.collectors.registry import GuardedCatalogue, catalogue
from memexporter.collectors.scrape import Scrape
from tests.support.fakes import (
    SYNTHETIC_STATS,
    FakeCuda,
    FakeHost,
    FakeNvml,
    GiB,
    MiB,
    one_gpu,
    registry_for,
    sources,
    with_host,
)


def value(reg: CollectorRegistry, metric: str, **labels: str) -> float | None:
    return reg.get_sample_value(metric, labels)


def test_allocator_maps_every_contract_key() -> None:
    cuda, nvml = one_gpu()
    reg = registry_for(sources(cuda, nvml))
    for metric, key in KEYS.items():
        assert value(reg, metric, rank="3", device="cuda:0") == SYNTHETIC_STATS[key], metric
    assert value(reg, "memexporter_allocator_fragmentation_ratio", rank="3", device="cuda:0") == pytest.approx(0.125)


def test_one_memory_stats_call_per_device_per_scrape() -> None:
    cuda, nvml = one_gpu()
    reg = registry_for(sources(cuda, nvml))
    list(reg.collect())
    # allocator, memory view and device collectors all read the same per-scrape copy
    assert cuda.calls == 1


def test_missing_keys_give_no_series_not_zero() -> None:
    # An older torch without requested_bytes: that series is absent, the others are there.
    stats = {k: v for k, v in SYNTHETIC_STATS.items() if not k.startswith("requested_bytes")}
    reg = registry_for(sources(FakeCuda(stats={0: stats})))
    assert value(reg, "memexporter_allocator_requested_bytes", rank="3", device="cuda:0") is None
    assert value(reg, "memexporter_allocator_reserved_bytes", rank="3", device="cuda:0") == 4 * GiB


@pytest.mark.parametrize(
    ("split", "reserved", "expected"),
    [(0, 0, 0.0), (512, 1024, 0.5), (0, 1024, 0.0), (1024, 1024, 1.0)],
)
def test_fragmentation_ratio(split: int, reserved: int, expected: float) -> None:
    stats = {"inactive_split_bytes.all.current": split, "reserved_bytes.all.current": reserved}
    assert fragmentation(stats) == expected


def test_fragmentation_unknown_without_keys() -> None:
    assert fragmentation({}) is None


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu only", "one gpu"])
def test_every_collector_succeeds_without_a_step_tracker(gpu: bool) -> None:
    # Before a step tracker exists the step figures are absent, and no collector fails over it:
    # a failure would only show as collector_success 0, which no series-level check notices.
    reg = registry_for(sources(*one_gpu()) if gpu else sources())
    for name in (c.name for c in catalogue()):
        assert value(reg, "memexporter_collector_success", rank="3", collector=name) == 1, name
    assert value(reg, "memexporter_steps_total", rank="3") is None


def test_no_cuda_means_no_allocator_or_device_series() -> None:
    scrape = Scrape(sources())
    assert list(AllocatorCollector().collect(scrape)) == []
    assert list(DeviceCollector().collect(scrape)) == []


def test_device_matched_by_uuid_not_index() -> None:
    # cuda:0 inside the process is the NVML device with the same UUID, whatever its NVML index.
    cuda, nvml = one_gpu()
    reg = registry_for(sources(cuda, nvml))
    assert value(reg, "memexporter_device_total_bytes", rank="3", device="cuda:0") == 80 * GiB
    assert value(reg, "memexporter_device_used_bytes", rank="3", device="cuda:0") == 10 * GiB - 512 * MiB
    assert value(reg, "memexporter_device_reserved_bytes", rank="3", device="cuda:0") == 512 * MiB
    assert (
        value(
            reg,
            "memexporter_device_info",
            rank="3",
            device="cuda:0",
            uuid="GPU-synthetic-0",
            name="Synthetic GPU",
            pci_bus_id="00000000:01:00.0",
            gpu_uuid="GPU-synthetic-0",
            gpu_instance_id="",
            vendor="nvidia",
        )
        == 1
    )


def test_nvml_none_means_no_device_series_and_success() -> None:
    cuda, _ = one_gpu()
    reg = registry_for(sources(cuda, FakeNvml()))
    assert value(reg, "memexporter_device_total_bytes", rank="3", device="cuda:0") is None
    assert value(reg, "memexporter_collector_success", rank="3", collector="device") == 1


def test_cuda_limit_is_reserved_plus_free() -> None:
    cuda, nvml = one_gpu()
    reg = registry_for(sources(cuda, nvml))
    assert value(reg, "memexporter_memory_used_bytes", rank="3", device="cuda:0") == 3 * GiB
    assert value(reg, "memexporter_memory_limit_bytes", rank="3", device="cuda:0") == 4 * GiB + 70 * GiB


def test_cuda_limit_capped_by_memory_fraction() -> None:
    cuda, nvml = one_gpu()
    cuda.fraction = 0.25  # 20 GiB of an 80 GiB device
    reg = registry_for(sources(cuda, nvml))
    assert value(reg, "memexporter_memory_limit_bytes", rank="3", device="cuda:0") == 20 * GiB


def test_cuda_limit_without_nvml_falls_back_to_mem_get_info() -> None:
    cuda, _ = one_gpu()
    cuda.free = 30 * GiB
    reg = registry_for(sources(cuda, FakeNvml()))
    assert value(reg, "memexporter_memory_limit_bytes", rank="3", device="cuda:0") == 34 * GiB


def test_cpu_view_is_rss_and_rss_plus_available() -> None:
    reg = registry_for(sources(host=with_host(rss=3 * GiB, available=5 * GiB)))
    assert value(reg, "memexporter_memory_used_bytes", rank="3", device="cpu") == 3 * GiB
    assert value(reg, "memexporter_memory_limit_bytes", rank="3", device="cpu") == 8 * GiB


def test_budget_replaces_limit_of_training_devices() -> None:
    cuda, nvml = one_gpu()
    reg = registry_for(sources(cuda, nvml, memory_limit_bytes=12 * GiB))
    assert value(reg, "memexporter_memory_limit_bytes", rank="3", device="cuda:0") == 12 * GiB
    assert value(reg, "memexporter_memory_limit_bytes", rank="3", device="cpu") == 2 * GiB + 10 * GiB  # untouched
    reg = registry_for(sources(memory_limit_bytes=4 * GiB))  # CPU-only job: the budget is the cpu's
    assert value(reg, "memexporter_memory_limit_bytes", rank="3", device="cpu") == 4 * GiB


def test_host_series() -> None:
    reg = registry_for(sources(host=with_host(children_rss=700 * MiB, limit=8 * GiB)))
    assert value(reg, "memexporter_host_rss_bytes", rank="3") == 2 * GiB
    assert value(reg, "memexporter_host_children_rss_bytes", rank="3") == 700 * MiB
    assert value(reg, "memexporter_host_available_bytes", rank="3") == 10 * GiB
    assert value(reg, "memexporter_host_limit_bytes", rank="3") == 8 * GiB


def test_exporter_identity_series() -> None:
    reg = registry_for(sources())
    assert (
        value(
            reg,
            "memexporter_build_info",
            rank="3",
            version="0.0.test",
            torch_version="2.13.0+synthetic",
            cuda_version="13.0",
        )
        == 1
    )
    assert value(reg, "memexporter_process_info", rank="3", local_rank="1", world_size="8", hostname="node17") == 1


class Exploding:
    name = "exploding"

    def collect(self, scrape: Scrape) -> list[Metric]:
        raise RuntimeError("synthetic failure")


def test_raising_collector_costs_only_its_own_series(caplog: pytest.LogCaptureFixture) -> None:
    from memexporter.collectors.host import HostCollector

    reg = CollectorRegistry(auto_describe=False)
    reg.register(GuardedCatalogue([Exploding(), HostCollector()], sources()))
    for _ in range(3):
        assert value(reg, "memexporter_collector_success", rank="3", collector="exploding") == 0
        assert value(reg, "memexporter_collector_success", rank="3", collector="host") == 1
        assert value(reg, "memexporter_host_rss_bytes", rank="3") == 2 * GiB
    # logged once with its traceback, not once per scrape
    assert sum("exploding" in r.getMessage() for r in caplog.records if r.levelname == "ERROR") == 1


def test_collector_duration_is_recorded() -> None:
    # A clock that advances 0.25 s per reading: each collector is timed by one pair of readings.
    ticks = iter(0.25 * i for i in range(10**6))
    reg = CollectorRegistry(auto_describe=False)
    reg.register(GuardedCatalogue(catalogue(), sources(), clock=lambda: next(ticks)))
    for name in (c.name for c in catalogue()):
        assert value(reg, "memexporter_collector_duration_seconds", rank="3", collector=name) == 0.25, name


def test_budget_above_the_real_limit_does_not_hide_the_oom() -> None:
    cuda, nvml = one_gpu()  # real limit: 4 GiB reserved + 70 GiB free
    reg = registry_for(sources(cuda, nvml, memory_limit_bytes=200 * GiB))
    assert value(reg, "memexporter_memory_limit_bytes", rank="3", device="cuda:0") == 74 * GiB


def test_failing_host_backend_keeps_cuda_views_and_says_the_cpu_view_failed() -> None:
    class BrokenHost(FakeHost):
        def sample(self):  # type: ignore[no-untyped-def]
            raise OSError("synthetic /proc failure")

    cuda, nvml = one_gpu()
    reg = registry_for(sources(cuda, nvml, BrokenHost()))
    assert value(reg, "memexporter_collector_success", rank="3", collector="host") == 0
    # The cpu view is gone: the memory collector says so, and still exports the cuda view.
    assert value(reg, "memexporter_collector_success", rank="3", collector="memory") == 0
    assert value(reg, "memexporter_memory_used_bytes", rank="3", device="cuda:0") == 3 * GiB
    assert value(reg, "memexporter_memory_used_bytes", rank="3", device="cpu") is None


@pytest.mark.parametrize(
    ("backend", "expandable", "committed"),
    [
        ("native", False, 3 * GiB + 512 * MiB),  # allocated + inactive split
        ("native", True, 4 * GiB),  # reserved
        ("cudaMallocAsync", False, 3 * GiB),  # allocated
    ],
)
def test_committed_bytes_follow_the_allocator(backend: str, expandable: bool, committed: int) -> None:
    cuda, nvml = one_gpu()
    cuda.backend, cuda.expandable = backend, expandable
    reg = registry_for(sources(cuda, nvml))
    assert value(reg, "memexporter_memory_used_bytes", rank="3", device="cuda:0") == 3 * GiB  # allocated, always
    assert value(reg, "memexporter_memory_committed_bytes", rank="3", device="cuda:0") == committed
    assert value(reg, "memexporter_memory_committed_bytes", rank="3", device="cpu") == 2 * GiB  # RSS
