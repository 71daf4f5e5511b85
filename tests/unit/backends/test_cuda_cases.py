"""Whole scrapes through the real TorchBackend and NvmlBackend, over torch.cuda and pynvml answering
as the SYNTHETIC fixtures say (real-shaped, made up): the five situations of issue 11 and the
series each one must, and must not, produce."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from memexporter.backends.cuda import TorchBackend
from memexporter.backends.nvml import NvmlBackend
from memexporter.collectors.allocator import KEYS, NATIVE_ONLY
from memexporter.collectors.registry import catalogue
from memexporter.tracking.steps import StepTracker
from tests.support.cuda_standins import HOST_STATS, TorchStandIn, installed, load, no_nvml
from tests.support.fakes import FakeCuda, FakeHost, GiB, MiB, registry_for, sources
from tests.support.memory_stats import shape
from tests.support.nvml_standin import NvmlStandIn
from tests.support.synthetic_fixtures import SYNTHETIC_DIR

CUDA = {"rank": "3", "device": "cuda:0"}


def answers(name: str) -> dict[str, Any]:
    return copy.deepcopy(load(SYNTHETIC_DIR / f"{name}.json")["answers"])  # type: ignore[no-any-return]


def scrape(
    monkeypatch: pytest.MonkeyPatch,
    a: dict[str, Any],
    nvml: bool = True,
    steps: int = 0,
) -> tuple[CollectorRegistry, TorchStandIn]:
    torch_standin = TorchStandIn(a).install(monkeypatch)
    if nvml:
        NvmlStandIn(a["nvml"]).install(monkeypatch)
    else:
        no_nvml(monkeypatch)
    cuda, host = TorchBackend(), FakeHost()
    tracker = StepTracker(cuda, host, window=64, warmup_steps=0, host_peak=lambda: 0)  # type: ignore[arg-type]
    for _ in range(steps):
        tracker.step()
    reg = registry_for(sources(cuda, NvmlBackend(), host, steps=tracker))  # type: ignore[arg-type]
    return reg, torch_standin


def v(reg: CollectorRegistry, metric: str, labels: dict[str, str] = CUDA) -> float | None:
    return reg.get_sample_value(metric, labels)


def device_info(reg: CollectorRegistry) -> list[dict[str, str]]:
    return [s.labels for f in reg.collect() for s in f.samples if s.name == "memexporter_device_info"]


def all_collectors_succeeded(reg: CollectorRegistry) -> bool:
    return all(v(reg, "memexporter_collector_success", {"rank": "3", "collector": c.name}) == 1 for c in catalogue())


def test_v100_older_torch_after_caught_ooms(monkeypatch: pytest.MonkeyPatch) -> None:
    a = answers("v100_torch1.13_after_ooms")
    stats = a["devices"]["0"]["memory_stats"]
    reg, _ = scrape(monkeypatch, a, steps=3)
    assert v(reg, "memexporter_allocator_ooms_total") == 3
    assert v(reg, "memexporter_allocator_alloc_retries_total") == 5
    assert v(reg, "memexporter_allocator_reserved_bytes") == stats["reserved_bytes.all.current"]
    # Keys torch 1.13 does not report: no series, never a zero.
    for metric in ("requested_bytes", "device_allocations_total", "device_frees_total"):
        assert v(reg, f"memexporter_allocator_{metric}") is None, metric
    # No device UUID in torch 1.13: NVML cannot be matched, so no device series, and the limit
    # falls back to cudaMemGetInfo's free figure.
    assert device_info(reg) == [] and v(reg, "memexporter_device_total_bytes") is None
    assert v(reg, "memexporter_memory_limit_bytes") == stats["reserved_bytes.all.current"] + 1400 * MiB
    assert v(reg, "memexporter_memory_used_bytes") == stats["allocated_bytes.all.current"]
    assert v(reg, "memexporter_allocator_info", {**CUDA, "backend": "native"}) == 1
    assert v(reg, "memexporter_steps_total", {"rank": "3"}) == 3
    assert all_collectors_succeeded(reg)


def test_a100_fraction_caps_at_the_cuda_total_not_nvmls(monkeypatch: pytest.MonkeyPatch) -> None:
    a = answers("a100_torch2.13_fraction")
    reg, _ = scrape(monkeypatch, a)
    cuda_total, nvml_total = 84987740160, 81920 * MiB
    # The allocator refuses to reserve beyond 0.5 x totalGlobalMem. Half of NVML's total would
    # read ~1 % (435 MiB) too high.
    assert v(reg, "memexporter_memory_limit_bytes") == int(0.5 * cuda_total)
    assert 0.010 < int(0.5 * nvml_total) / int(0.5 * cuda_total) - 1 < 0.011
    assert v(reg, "memexporter_device_total_bytes") == nvml_total  # the device series keep NVML's figure
    assert device_info(reg) == [
        {
            "rank": "3",
            "device": "cuda:0",
            "uuid": "GPU-3f6a9c2e-8b1d-4e07-a5c9-72d41e0b9f63",
            "name": "NVIDIA A100-SXM4-80GB",
            "pci_bus_id": "00000000:C7:00.0",
            "gpu_uuid": "GPU-3f6a9c2e-8b1d-4e07-a5c9-72d41e0b9f63",
            "gpu_instance_id": "",
            "vendor": "nvidia",
        }
    ]
    assert v(reg, "memexporter_allocator_requested_bytes") == 31878 * MiB + 59 * MiB
    counted = "num_device_alloc" in shape(installed()).scalars  # torch 2.3 on: before, no such series
    assert v(reg, "memexporter_allocator_device_allocations_total") == (279 if counted else None)
    assert all_collectors_succeeded(reg)


def test_a100_without_a_fraction_is_reserved_plus_nvml_free(monkeypatch: pytest.MonkeyPatch) -> None:
    a = answers("a100_torch2.13_fraction")
    a["devices"]["0"]["memory_fraction"] = 1.0
    reg, _ = scrape(monkeypatch, a)
    reserved = a["devices"]["0"]["memory_stats"]["reserved_bytes.all.current"]
    assert v(reg, "memexporter_memory_limit_bytes") == reserved + (81920 - 40806) * MiB


def test_mig_slice_has_device_series_and_join_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    a = answers("a100_mig_1g.10gb_torch2.13")
    reg, _ = scrape(monkeypatch, a)
    assert v(reg, "memexporter_device_total_bytes") == 9728 * MiB  # the slice, not the GPU
    assert device_info(reg) == [
        {
            "rank": "3",
            "device": "cuda:0",
            "uuid": "MIG-9b1c5e7a-2d4f-5a60-8c3b-1e9f0d2a7c45",
            "name": "NVIDIA A100-SXM4-80GB MIG 1g.10gb",
            "pci_bus_id": "00000000:4E:00.0",
            "gpu_uuid": "GPU-e1c4a8f2-6b3d-4f90-8a7e-2c5d1b0f9e36",
            "gpu_instance_id": "13",
            "vendor": "nvidia",
        }
    ]
    reserved = a["devices"]["0"]["memory_stats"]["reserved_bytes.all.current"]
    assert v(reg, "memexporter_memory_limit_bytes") == reserved + 1908 * MiB  # the slice's free memory
    assert all_collectors_succeeded(reg)


def test_pluggable_allocator_costs_only_its_own_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    # The module-hook error counter is process-wide: other tests in this worker raise it on purpose.
    monkeypatch.setattr("memexporter.tracking.modules.hook_errors", lambda: 0)
    reg, _ = scrape(monkeypatch, answers("h100_torch2.13_pluggable"), steps=4)
    assert all_collectors_succeeded(reg)
    for metric in [
        *KEYS,
        "memexporter_allocator_fragmentation_ratio",
        "memexporter_memory_used_bytes",
        "memexporter_memory_limit_bytes",
        "memexporter_memory_baseline_bytes",
    ]:
        assert v(reg, metric) is None, metric
    assert v(reg, "memexporter_allocator_info", {**CUDA, "backend": "pluggable"}) == 1
    assert v(reg, "memexporter_device_used_bytes") == 63488 * MiB  # NVML still sees the device
    # The cpu view and the step count are untouched.
    assert v(reg, "memexporter_memory_used_bytes", {"rank": "3", "device": "cpu"}) == 2 * GiB
    assert v(reg, "memexporter_steps_total", {"rank": "3"}) == 4
    assert v(reg, "memexporter_hook_errors_total", {"rank": "3"}) == 0


def test_cuda_malloc_async_exports_what_the_pool_measures(monkeypatch: pytest.MonkeyPatch) -> None:
    reg, _ = scrape(monkeypatch, answers("h100_torch2.13_cudamallocasync"))
    assert v(reg, "memexporter_allocator_allocated_bytes") == 45 * GiB
    assert v(reg, "memexporter_allocator_active_bytes") == 45 * GiB
    assert v(reg, "memexporter_allocator_reserved_bytes") == 50 * GiB
    assert v(reg, "memexporter_allocator_peak_allocated_bytes") == 52 * GiB
    assert v(reg, "memexporter_allocator_peak_reserved_bytes") == 58 * GiB
    for metric in NATIVE_ONLY:  # zeros in memory_stats() that would look measured
        assert v(reg, metric) is None, metric
    assert v(reg, "memexporter_allocator_info", {**CUDA, "backend": "cudaMallocAsync"}) == 1
    assert v(reg, "memexporter_memory_used_bytes") == 45 * GiB
    assert v(reg, "memexporter_memory_limit_bytes") == 50 * GiB + (81559 - 51800) * MiB
    assert all_collectors_succeeded(reg)


def test_native_allocator_exports_the_native_only_series(monkeypatch: pytest.MonkeyPatch) -> None:
    # The same zero counters under the native allocator are measured zeros: exported.
    reg, _ = scrape(monkeypatch, answers("a100_torch2.13_fraction"))
    assert v(reg, "memexporter_allocator_ooms_total") == 0
    assert v(reg, "memexporter_allocator_fragmentation_ratio") == pytest.approx((12 + 2100) / (78 + 39602))


def test_unreadable_free_figure_gives_no_limit_but_keeps_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two devices in use, no NVML; mem_get_info fails on cuda:1 only.
    a = answers("a100_torch2.13_fraction")
    a["device_count"] = 2
    a["devices"]["0"]["memory_fraction"] = 1.0
    a["devices"]["1"] = {**copy.deepcopy(a["devices"]["0"]), "mem_get_info": {"raises": "RuntimeError: CUDA error"}}
    reg, _ = scrape(monkeypatch, a, nvml=False, steps=2)
    reserved = a["devices"]["0"]["memory_stats"]["reserved_bytes.all.current"]
    cuda1 = {"rank": "3", "device": "cuda:1"}
    assert v(reg, "memexporter_memory_limit_bytes", cuda1) is None
    assert v(reg, "memexporter_memory_used_bytes", cuda1) == 31948 * MiB
    assert v(reg, "memexporter_oom_eta_seconds", cuda1) == float("inf")  # no limit: nothing to count down to
    assert v(reg, "memexporter_memory_limit_bytes") == reserved + 40246 * MiB
    assert all_collectors_succeeded(reg)


def test_unreadable_free_figure_with_a_fraction_uses_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    a = answers("a100_torch2.13_fraction")
    a["devices"]["0"]["mem_get_info"] = {"raises": "RuntimeError: CUDA error"}
    reg, _ = scrape(monkeypatch, a, nvml=False)
    assert v(reg, "memexporter_memory_limit_bytes") == int(0.5 * 84987740160)


def test_scrape_creates_no_context_on_a_device_the_job_does_not_use(monkeypatch: pytest.MonkeyPatch) -> None:
    # The risky case: eight visible GPUs, CUDA initialised and used on cuda:5 only. A scrape (and
    # the step tracker) may read every device's host-side counters, nothing more.
    a = answers("a100_torch2.13_fraction")
    a["device_count"] = 8
    a["devices"] = {"5": a["devices"]["0"]}
    reg, s = scrape(monkeypatch, a, nvml=False, steps=3)
    assert v(reg, "memexporter_memory_limit_bytes", {"rank": "3", "device": "cuda:5"}) is not None
    assert s.contexts == {5}
    assert {i for fn, i in s.calls if fn != "memory_stats"} == {5}


def test_budget_stays_on_cuda_when_its_view_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    # A pluggable allocator: the job trains on CUDA, whose used/limit cannot be read. The soft
    # budget is for the training device, so it must not move to the cpu view.
    torch_standin = TorchStandIn(answers("h100_torch2.13_pluggable")).install(monkeypatch)
    NvmlStandIn(torch_standin.answers["nvml"]).install(monkeypatch)
    host = FakeHost()
    reg = registry_for(sources(TorchBackend(), NvmlBackend(), host, memory_limit_bytes=1 * GiB))  # type: ignore[arg-type]
    assert (
        v(reg, "memexporter_memory_limit_bytes", {"rank": "3", "device": "cpu"})
        == host.value.rss + host.value.available
    )


def test_a_raising_cuda_source_costs_only_the_cuda_series() -> None:
    # A AllocatorSource that raises (TorchBackend does not; a future one might): the allocator and
    # device collectors report the failure, and so does the memory collector, whose cuda view is
    # gone; the cpu view and the step count stay.
    class Broken(FakeCuda):
        def device_stats(self) -> dict[int, Any]:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    host = FakeHost()
    tracker = StepTracker(FakeCuda(), host, window=64, warmup_steps=0, host_peak=lambda: 0)  # type: ignore[arg-type]
    tracker.step()
    reg = registry_for(sources(Broken(), host=host, steps=tracker))
    success = {c.name: v(reg, "memexporter_collector_success", {"rank": "3", "collector": c.name}) for c in catalogue()}
    assert success["allocator"] == success["device"] == success["memory"] == 0
    assert success["trend"] == success["host"] == 1
    assert v(reg, "memexporter_memory_used_bytes", {"rank": "3", "device": "cpu"}) == 2 * GiB
    assert v(reg, "memexporter_steps_total", {"rank": "3"}) == 1


NON_ALLOCATOR, PROCESS = "memexporter_device_non_allocator_bytes", "memexporter_device_process_used_bytes"


@pytest.mark.parametrize(
    ("name", "outside"),
    [
        ("a100_torch2.13_fraction", 1210 * MiB),  # context, workspaces and NCCL buffers; a profiler's process ignored
        ("h100_torch2.13_cudamallocasync", 596 * MiB),
    ],
)
def test_memory_outside_the_allocator_is_the_drivers_figure_minus_reserved(
    monkeypatch: pytest.MonkeyPatch, name: str, outside: int
) -> None:
    a = answers(name)
    reg, _ = scrape(monkeypatch, a)
    reserved = a["devices"]["0"]["memory_stats"]["reserved_bytes.all.current"]
    assert v(reg, PROCESS) == reserved + outside
    assert v(reg, NON_ALLOCATOR) == outside


def test_outside_the_allocator_needs_the_allocators_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    # A pluggable allocator reports nothing: the driver's figure stays, the difference cannot be made.
    reg, _ = scrape(monkeypatch, answers("h100_torch2.13_pluggable"))
    assert v(reg, PROCESS) == 63488 * MiB
    assert v(reg, NON_ALLOCATOR) is None


def test_a_pid_namespace_that_hides_the_process_gives_nan_not_a_wrong_number(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The MIG slice's job runs in a container: the driver lists it under its host PID only.
    reg, _ = scrape(monkeypatch, answers("a100_mig_1g.10gb_torch2.13"))
    value = v(reg, PROCESS)
    assert value is not None and math.isnan(value)
    assert v(reg, NON_ALLOCATOR) is None
    assert any("PID namespace" in r.getMessage() and "hostPID" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("name", "nvml"), [("a100_torch2.13_fraction", False), ("v100_torch1.13_after_ooms", True)]
)  # no UUID to match NVML's by
def test_no_nvml_device_no_process_series(monkeypatch: pytest.MonkeyPatch, name: str, nvml: bool) -> None:
    reg, _ = scrape(monkeypatch, answers(name), nvml=nvml)
    assert v(reg, PROCESS) is None and v(reg, NON_ALLOCATOR) is None


PINNED, PINNED_ACTIVE = "memexporter_host_pinned_bytes", "memexporter_host_pinned_active_bytes"


@pytest.mark.skipif(
    not HOST_STATS, reason="this torch has no torch.cuda.host_memory_stats() (2.6 on): nothing to stand in for"
)
def test_pinned_host_memory_from_the_host_caching_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    # A DataLoader with pin_memory=True: 1 GiB of page-locked blocks, 256 MiB of them handed out.
    reg, _ = scrape(monkeypatch, answers("a100_torch2.13_fraction"))
    assert (v(reg, PINNED, {"rank": "3"}), v(reg, PINNED_ACTIVE, {"rank": "3"})) == (GiB, 256 * MiB)


@pytest.mark.parametrize("name", ["v100_torch1.13_after_ooms", "a100_torch2.13_fraction"])
def test_no_pinned_series_without_the_call_or_before_cuda(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    a = answers(name)
    a["initialized"] = name.startswith("v100")  # torch 1.13 has no host_memory_stats(); the A100 job has not begun
    reg, _ = scrape(monkeypatch, a)
    assert v(reg, PINNED, {"rank": "3"}) is None and v(reg, PINNED_ACTIVE, {"rank": "3"}) is None
