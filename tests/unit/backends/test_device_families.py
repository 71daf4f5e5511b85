"""AMD (ROCm's torch.cuda with amdsmi), Intel (torch.xpu) and Apple (MPS through torch.accelerator):
whole scrapes through the real backends that ``backends/select.py`` picks, over stand-ins replaying
the SYNTHETIC fixtures in tests/fixtures/synthetic/families/ (real-shaped, made up; never run on
those devices). The expected figures are worked out here from the fixture's answers alone."""

from __future__ import annotations

import copy
import logging
import math
from typing import Any

import pytest
import torch
from prometheus_client import CollectorRegistry

from memexporter.backends import select
from memexporter.backends.amdsmi import AmdSmiBackend, unique_id
from memexporter.backends.cuda import TorchBackend
from memexporter.backends.mps import MpsBackend
from memexporter.backends.xpu import XpuBackend
from memexporter.collectors.registry import catalogue
from memexporter.tracking.steps import StepTracker
from tests.support.amdsmi_standin import AMDSMI_STATUS_NO_PERM, AmdSmiStandIn, no_amdsmi
from tests.support.cuda_standins import TorchStandIn, load
from tests.support.device_standins import (
    ACCELERATOR_STATS,
    IGPU_FREE_MEMORY,
    MPS_BEFORE_2_13,
    XPU_FRACTION,
    MpsStandIn,
    XpuStandIn,
)
from tests.support.fakes import FakeHost, registry_for, sources
from tests.support.fixture_checks import inconsistencies
from tests.support.memory_stats import PRIVATE_POOLS, accelerator_nested, flatten, nested, xpu_nested
from tests.support.synthetic_fixtures import FAMILIES_DIR, FAMILY_FIXTURES, render

ROCM, XPU, MPS = "mi325x_rocm7.0_torch2.13", "arc_b60_xpu_torch2.13", "m4_max_mps_torch2.13"
KIND = {ROCM: "cuda", XPU: "xpu", MPS: "mps"}
LABEL = {ROCM: "cuda:0", XPU: "xpu:0", MPS: "mps"}
NEEDS_ACCELERATOR_STATS = pytest.mark.skipif(
    not ACCELERATOR_STATS, reason="this torch has no torch.accelerator.memory_stats() (2.9 on): no MPS figure to read"
)


def answers(name: str) -> dict[str, Any]:
    return copy.deepcopy(load(FAMILIES_DIR / f"{name}.json")["answers"])


def install(mp: pytest.MonkeyPatch, name: str, a: dict[str, Any]) -> Any:
    if name == ROCM:
        TorchStandIn(a).install(mp)
        if a.get("amdsmi") is None:
            no_amdsmi(mp)
            return None
        return AmdSmiStandIn(a["amdsmi"]).install(mp)
    return (XpuStandIn if name == XPU else MpsStandIn)(a).install(mp)


def scrape(mp: pytest.MonkeyPatch, name: str, a: dict[str, Any] | None = None) -> tuple[CollectorRegistry, Any]:
    a = answers(name) if a is None else a
    standin = install(mp, name, a)
    allocator, driver = select.backends(KIND[name])
    return registry_for(sources(allocator, driver, FakeHost())), standin  # type: ignore[arg-type]


def v(reg: CollectorRegistry, metric: str, name: str, **extra: str) -> float | None:
    return reg.get_sample_value(metric, {"rank": "3", "device": LABEL[name], **extra})


def names(reg: CollectorRegistry, prefix: str) -> set[str]:
    return {s.name for f in reg.collect() for s in f.samples if s.name.startswith(prefix)}


def info(reg: CollectorRegistry) -> list[dict[str, str]]:
    return [s.labels for f in reg.collect() for s in f.samples if s.name == "memexporter_device_info"]


def all_collectors_succeeded(reg: CollectorRegistry) -> bool:
    return all(
        reg.get_sample_value("memexporter_collector_success", {"rank": "3", "collector": c.name}) == 1
        for c in catalogue()
    )


# --- The fixtures themselves -----------------------------------------------------------------------


def test_family_fixtures_are_current_synthetic_and_torch_shaped() -> None:
    assert sorted(p.stem for p in FAMILIES_DIR.glob("*.json")) == sorted(FAMILY_FIXTURES)
    for name in FAMILY_FIXTURES:
        assert (FAMILIES_DIR / f"{name}.json").read_text() == render(name), (
            "rerun python -m tests.support.synthetic_fixtures"
        )
        record = load(FAMILIES_DIR / f"{name}.json")
        assert record["synthetic"] is True and record["provenance"].startswith("SYNTHETIC, not measured on the device")
    rocm, xpu, mps = (
        answers(ROCM)["devices"]["0"]["memory_stats"],
        answers(XPU)["devices"]["0"]["memory_stats"],
        answers(MPS),
    )
    assert set(rocm) - {k for k in rocm if k.startswith(PRIVATE_POOLS)} == set(flatten(nested("2.13", {}, {}))) - {
        PRIVATE_POOLS
    }
    assert set(xpu) == set(flatten(xpu_nested("2.13", {}))) and len(xpu) == 108
    assert set(mps["memory_stats"]) == set(flatten(accelerator_nested({}, {}))) and len(mps["memory_stats"]) == 122
    assert inconsistencies(rocm, "native") == [] and inconsistencies(xpu, "native") == []
    filled = {k for k, value in mps["memory_stats"].items() if value}
    assert filled and all(k.startswith(("allocated_bytes.all.", "reserved_bytes.all.")) for k in filled)


# --- Which backends a build gets -------------------------------------------------------------------


def test_this_cpu_build_is_cuda_family_and_each_family_gets_its_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    assert select.family() == "cuda"  # a CPU wheel: torch.cuda, which answers nothing until CUDA is up
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: torch.device("xpu"))
    assert select.family() == "xpu"
    allocator, driver = select.backends("xpu")
    assert isinstance(allocator, XpuBackend) and driver is allocator
    allocator, driver = select.backends("mps")
    assert isinstance(allocator, MpsBackend) and isinstance(driver, select.NoDriver)
    monkeypatch.setattr(torch.version, "hip", "7.0.51831-a3e329ad8")
    allocator, driver = select.backends("cuda")
    assert isinstance(allocator, TorchBackend) and isinstance(driver, AmdSmiBackend)


# --- AMD: ROCm's torch.cuda and amdsmi -------------------------------------------------------------


def test_rocm_oom_view_allocator_and_amdsmi_device_view(monkeypatch: pytest.MonkeyPatch) -> None:
    a = answers(ROCM)
    reg, _ = scrape(monkeypatch, ROCM, a)
    stats = a["devices"]["0"]["memory_stats"]
    card = a["amdsmi"]["gpus"][1]  # cuda:0 under HIP_VISIBLE_DEVICES=1: amdsmi's second GPU, matched by serial
    free = card["memory"]["vram_total"] - card["memory"]["vram_used"]
    assert v(reg, "memexporter_memory_used_bytes", ROCM) == stats["allocated_bytes.all.current"]
    assert v(reg, "memexporter_memory_limit_bytes", ROCM) == stats["reserved_bytes.all.current"] + free
    assert v(reg, "memexporter_allocator_ooms_total", ROCM) == stats["num_ooms"]
    assert v(reg, "memexporter_device_total_bytes", ROCM) == card["memory"]["vram_total"]
    assert v(reg, "memexporter_device_free_bytes", ROCM) == free
    mine = next(p for p in card["processes"] if p["pid"] == "self")["memory_usage"]["vram_mem"]
    assert v(reg, "memexporter_device_process_used_bytes", ROCM) == mine
    assert v(reg, "memexporter_device_non_allocator_bytes", ROCM) == mine - stats["reserved_bytes.all.current"]
    assert info(reg) == [
        {
            "rank": "3",
            "device": "cuda:0",
            "uuid": card["uuid"],
            "name": "AMD Instinct MI325X",
            "pci_bus_id": "0000:c1:00.0",
            "gpu_uuid": card["uuid"],
            "gpu_instance_id": "",
            "vendor": "amd",
        }
    ]
    assert (
        reg.get_sample_value("memexporter_host_pinned_bytes", {"rank": "3"})
        == a["host_memory_stats"]["allocated_bytes.current"]
    )
    assert all_collectors_succeeded(reg)


def test_rocm_uuid_is_the_ascii_of_the_kfd_unique_id() -> None:
    assert unique_id("62333961-6461-6638-3336-363030623331") == "b39adaf836600b31"
    assert unique_id("58580000-0000-0000-0000-000000000000") is None  # "XX": a card without a unique id
    assert unique_id("3f6a9c2e-8b1d-4e07-a5c9-72d41e0b9f63") is None  # an NVIDIA UUID is binary, no ASCII


def test_rocm_card_without_a_unique_id_has_no_device_series(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    a = answers(ROCM)
    a["devices"]["0"]["properties"]["uuid"] = "58580000-0000-0000-0000-000000000000"
    with caplog.at_level(logging.INFO, logger="memexporter"):
        reg, _ = scrape(monkeypatch, ROCM, a)
        list(reg.collect())  # collect() is a generator: the scrape runs here, inside the log capture
    assert names(reg, "memexporter_device_") == set() and v(reg, "memexporter_memory_used_bytes", ROCM) is not None
    assert sum("no amdsmi GPU matches" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize(("change", "why"), [("hidden", "a PID namespace"), ("na", "N/A")])
def test_rocm_process_the_driver_cannot_measure_is_nan_not_a_number(
    monkeypatch: pytest.MonkeyPatch, change: str, why: str
) -> None:
    a = answers(ROCM)
    mine = next(p for p in a["amdsmi"]["gpus"][1]["processes"] if p["pid"] == "self")
    if change == "hidden":
        mine["pid"] = 2716403  # the host's PID for it: the container's namespace hides the match
    else:
        mine["memory_usage"]["vram_mem"] = mine["mem"] = "N/A"
    reg, _ = scrape(monkeypatch, ROCM, a)
    value = v(reg, "memexporter_device_process_used_bytes", ROCM)
    assert value is not None and math.isnan(value), why
    assert v(reg, "memexporter_device_non_allocator_bytes", ROCM) is None
    assert v(reg, "memexporter_device_total_bytes", ROCM) is not None


def test_rocm_process_list_refused_costs_only_the_process_series(monkeypatch: pytest.MonkeyPatch) -> None:
    a = answers(ROCM)
    standin = install(monkeypatch, ROCM, a)
    standin.fails["amdsmi_get_gpu_process_list"] = AMDSMI_STATUS_NO_PERM
    allocator, driver = select.backends("cuda")
    reg = registry_for(sources(allocator, driver, FakeHost()))  # type: ignore[arg-type]
    assert v(reg, "memexporter_device_process_used_bytes", ROCM) is None
    assert v(reg, "memexporter_device_used_bytes", ROCM) == a["amdsmi"]["gpus"][1]["memory"]["vram_used"]


def test_rocm_without_amdsmi_keeps_the_allocator_side_and_only_says_so_at_info(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    a = answers(ROCM)
    a["amdsmi"] = None
    with caplog.at_level(logging.DEBUG, logger="memexporter"):
        reg, _ = scrape(monkeypatch, ROCM, a)
        list(reg.collect())  # collect() is a generator: the scrape runs here, inside the log capture
    assert names(reg, "memexporter_device_") == set() and all_collectors_succeeded(reg)
    stats = a["devices"]["0"]["memory_stats"]
    # Without a free figure from amdsmi, the allocator's mem_get_info (hipMemGetInfo) gives the limit.
    free = a["devices"]["0"]["mem_get_info"][0]
    assert v(reg, "memexporter_memory_limit_bytes", ROCM) == stats["reserved_bytes.all.current"] + free
    assert [r.levelname for r in caplog.records if "amdsmi" in r.getMessage()] == ["INFO"]


# --- Intel: torch.xpu --------------------------------------------------------------------------------


def test_xpu_oom_view_allocator_and_level_zero_device_view(monkeypatch: pytest.MonkeyPatch) -> None:
    a = answers(XPU)
    reg, _ = scrape(monkeypatch, XPU, a)
    dev = a["devices"]["0"]
    stats, (free, total) = dev["memory_stats"], dev["mem_get_info"]
    assert v(reg, "memexporter_memory_used_bytes", XPU) == stats["allocated_bytes.all.current"]
    assert v(reg, "memexporter_memory_limit_bytes", XPU) == stats["reserved_bytes.all.current"] + free
    assert v(reg, "memexporter_allocator_reserved_bytes", XPU) == stats["reserved_bytes.all.current"]
    assert v(reg, "memexporter_allocator_fragmentation_ratio", XPU) == pytest.approx(
        stats["inactive_split_bytes.all.current"] / stats["reserved_bytes.all.current"]
    )
    # XPU's allocator keeps no num_* counters: no series, rather than zeros that look measured.
    assert v(reg, "memexporter_allocator_ooms_total", XPU) is None
    assert v(reg, "memexporter_allocator_alloc_retries_total", XPU) is None
    assert (v(reg, "memexporter_device_total_bytes", XPU), v(reg, "memexporter_device_free_bytes", XPU)) == (
        total,
        free,
    )
    assert v(reg, "memexporter_device_used_bytes", XPU) == total - free
    assert v(reg, "memexporter_device_process_used_bytes", XPU) is None  # torch exposes no per-process figure
    assert info(reg) == [
        {
            "rank": "3",
            "device": "xpu:0",
            "uuid": dev["properties"]["uuid"],
            "name": "Intel(R) Arc(TM) Pro B60 Graphics",
            "pci_bus_id": "",
            "gpu_uuid": dev["properties"]["uuid"],
            "gpu_instance_id": "",
            "vendor": "intel",
        }
    ]
    assert all_collectors_succeeded(reg)


@pytest.mark.skipif(not XPU_FRACTION, reason="this torch has no torch.xpu.get_per_process_memory_fraction() (2.10 on)")
def test_xpu_fraction_caps_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    a = answers(XPU)
    a["devices"]["0"]["memory_fraction"] = 0.5
    reg, _ = scrape(monkeypatch, XPU, a)
    assert v(reg, "memexporter_memory_limit_bytes", XPU) == int(0.5 * a["devices"]["0"]["properties"]["total_memory"])


def test_xpu_integrated_gpu_without_a_free_figure_has_no_limit_but_its_usage(monkeypatch: pytest.MonkeyPatch) -> None:
    a = answers(XPU)
    a["devices"]["0"]["mem_get_info"] = {"raises": IGPU_FREE_MEMORY}
    reg, _ = scrape(monkeypatch, XPU, a)
    assert (
        v(reg, "memexporter_memory_used_bytes", XPU) == a["devices"]["0"]["memory_stats"]["allocated_bytes.all.current"]
    )
    assert v(reg, "memexporter_memory_limit_bytes", XPU) is None
    assert names(reg, "memexporter_device_") == set()


def test_xpu_before_torch_2_11_exports_the_four_byte_families(monkeypatch: pytest.MonkeyPatch) -> None:
    a = answers(XPU)
    stats = a["devices"]["0"]["memory_stats"]
    a["devices"]["0"]["memory_stats"] = {k: stats[k] for k in flatten(xpu_nested("2.10", {}))}
    reg, _ = scrape(monkeypatch, XPU, a)
    assert v(reg, "memexporter_allocator_requested_bytes", XPU) == stats["requested_bytes.all.current"]
    assert v(reg, "memexporter_allocator_inactive_split_bytes", XPU) is None
    assert v(reg, "memexporter_allocator_fragmentation_ratio", XPU) is None


def test_xpu_not_initialised_is_never_initialised(monkeypatch: pytest.MonkeyPatch) -> None:
    a = answers(XPU)
    a["initialized"] = False
    reg, standin = scrape(monkeypatch, XPU, a)
    assert names(reg, "memexporter_allocator_") == set() and v(reg, "memexporter_memory_used_bytes", XPU) is None
    assert standin.calls == []  # no properties, mem_get_info or fraction call: each would initialise XPU


# --- Apple: MPS through torch.accelerator ---------------------------------------------------------


@NEEDS_ACCELERATOR_STATS
def test_mps_oom_view_and_only_the_statistics_mps_keeps(monkeypatch: pytest.MonkeyPatch) -> None:
    a = answers(MPS)
    reg, _ = scrape(monkeypatch, MPS, a)
    stats, (free, _) = a["memory_stats"], a["memory_info"]
    assert v(reg, "memexporter_memory_used_bytes", MPS) == stats["allocated_bytes.all.current"]
    assert v(reg, "memexporter_memory_limit_bytes", MPS) == stats["reserved_bytes.all.current"] + free
    assert v(reg, "memexporter_allocator_peak_allocated_bytes", MPS) == stats["allocated_bytes.all.peak"]
    assert v(reg, "memexporter_allocator_peak_reserved_bytes", MPS) == stats["reserved_bytes.all.peak"]
    kept = {
        "memexporter_allocator_allocated_bytes",
        "memexporter_allocator_reserved_bytes",
        "memexporter_allocator_peak_allocated_bytes",
        "memexporter_allocator_peak_reserved_bytes",
        "memexporter_allocator_info",
    }
    assert names(reg, "memexporter_allocator_") == kept  # the zeros MPS never fills are not exported
    assert names(reg, "memexporter_device_") == set() and all_collectors_succeeded(reg)


def test_mps_unused_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    a = answers(MPS)
    a["allocator_initialized"] = False
    reg, standin = scrape(monkeypatch, MPS, a)
    assert v(reg, "memexporter_memory_used_bytes", MPS) is None and "getDeviceStats" not in standin.calls


def test_mps_before_torch_2_13_reports_nothing_and_says_why_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    a = answers(MPS)
    a["allocator_initialized"] = {"raises": MPS_BEFORE_2_13}
    with caplog.at_level(logging.INFO, logger="memexporter"):
        reg, _ = scrape(monkeypatch, MPS, a)
        list(reg.collect())  # collect() is a generator: the scrape runs here, inside the log capture
    assert v(reg, "memexporter_memory_used_bytes", MPS) is None and all_collectors_succeeded(reg)
    said = [r for r in caplog.records if r.levelno >= logging.WARNING and "torch 2.13 can" in r.getMessage()]
    assert len(said) == 1


# --- The step tracker follows each family's device -----------------------------------------------


@pytest.mark.parametrize("name", [ROCM, XPU, pytest.param(MPS, marks=NEEDS_ACCELERATOR_STATS)])
def test_step_boundaries_read_each_family_under_its_label(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    a = answers(name)
    install(monkeypatch, name, a)
    allocator, _ = select.backends(KIND[name])
    tracker = StepTracker(allocator, FakeHost(), window=64, warmup_steps=0, host_peak=lambda: 0)
    readings = tracker.step()
    stats = a["memory_stats"] if name == MPS else a["devices"]["0"]["memory_stats"]
    assert readings is not None
    used = stats["allocated_bytes.all.current"]
    # What fills the limit: the native caching allocator's stranded split blocks on ROCm and XPU;
    # MPS keeps no split statistics (allocated alone).
    stranded = 0 if name == MPS else stats.get("inactive_split_bytes.all.current", 0)
    assert readings[LABEL[name]] == (used, stats["allocated_bytes.all.peak"], used + stranded)
    assert tracker.errors == 0
