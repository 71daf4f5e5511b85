"""Checks shared by the fixture tests: is a ``memory_stats()`` answer self-consistent, and which
series must a scrape over a fixture's answers produce. The expectations are worked out here from
the answers alone, by the rules of DESIGN.md section 4, independently of ``memexporter``'s code."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.memory_stats import FIELDS, PRIVATE_POOLS, STAT_ARRAYS

# Contract metric -> memory_stats() key, and the ones cudaMallocAsync leaves at zero (DESIGN.md §4).
ALLOCATOR_KEYS = {
    "allocated_bytes": "allocated_bytes.all.current",
    "reserved_bytes": "reserved_bytes.all.current",
    "active_bytes": "active_bytes.all.current",
    "inactive_split_bytes": "inactive_split_bytes.all.current",
    "requested_bytes": "requested_bytes.all.current",
    "peak_allocated_bytes": "allocated_bytes.all.peak",
    "peak_reserved_bytes": "reserved_bytes.all.peak",
    "alloc_retries_total": "num_alloc_retries",
    "ooms_total": "num_ooms",
    "device_allocations_total": "num_device_alloc",
    "device_frees_total": "num_device_free",
}
# What NVML raises for nvmlDeviceGetMemoryInfo_v2 on a driver without it (the v1 answer counts then).
NO_V2 = {"NVMLError_FunctionNotFound", "NVMLError_NotSupported", "NVMLError_ArgumentVersionMismatch"}
ASYNC_MEASURED = {"allocated_bytes", "reserved_bytes", "active_bytes", "peak_allocated_bytes", "peak_reserved_bytes"}


def inconsistencies(stats: dict[str, int], backend: str) -> list[str]:
    """What is wrong with a flat ``memory_stats()`` answer, as a list of readable findings."""
    bad = []
    if backend == "cudaMallocAsync":
        measured = {
            f"{k}.all.{f}" for k in ("allocated_bytes", "active_bytes", "reserved_bytes") for f in ("current", "peak")
        }
        return [
            f"{k} = {v} under cudaMallocAsync"
            for k, v in stats.items()
            if v and k not in measured and k != "max_split_size"
        ]
    arrays = sorted({k.split(".")[0] for k in stats if k.count(".") == 2 and not k.startswith(PRIVATE_POOLS)})
    for name in arrays:
        s = {(pool, f): stats[f"{name}.{pool}.{f}"] for pool in ("all", "small_pool", "large_pool") for f in FIELDS}
        for pool in ("all", "small_pool", "large_pool"):
            if s[pool, "current"] != s[pool, "allocated"] - s[pool, "freed"]:
                bad.append(f"{name}.{pool}: current != allocated - freed")
            if s[pool, "peak"] < s[pool, "current"]:
                bad.append(f"{name}.{pool}: peak < current")
        for f in ("current", "allocated", "freed"):
            if s["all", f] != s["small_pool", f] + s["large_pool", f]:
                bad.append(f"{name}.all.{f} != small_pool + large_pool")
        if (
            not max(s["small_pool", "peak"], s["large_pool", "peak"])
            <= s["all", "peak"]
            <= s["small_pool", "peak"] + s["large_pool", "peak"]
        ):
            bad.append(f"{name}.all.peak outside [max, sum] of the pools' peaks")
    for pool in ("small_pool", "large_pool"):
        get = {
            n: stats.get(f"{n}.{pool}.current", 0)
            for n in ("allocated_bytes", "active_bytes", "reserved_bytes", "inactive_split_bytes", "requested_bytes")
        }
        if not get["allocated_bytes"] <= get["active_bytes"] <= get["reserved_bytes"]:
            bad.append(f"{pool}: not allocated <= active <= reserved")
        if get["inactive_split_bytes"] > get["reserved_bytes"] - get["active_bytes"]:
            bad.append(f"{pool}: inactive_split > reserved - active")
        if get["requested_bytes"] > get["allocated_bytes"]:
            bad.append(f"{pool}: requested > allocated")
    return bad


def torch_version_of(stats: dict[str, int]) -> str:
    """Which derived key set (``memory_stats.STAT_ARRAYS``) an answer has."""
    arrays = {k.split(".")[0] for k in stats if k.count(".") == 2 and not k.startswith(PRIVATE_POOLS)}
    return next((v for v, names in STAT_ARRAYS.items() if set(names) == arrays), "unknown")


def _hex(uuid: str) -> str:
    uuid = uuid.lower()
    return uuid.split("-", 1)[1] if uuid.startswith(("gpu-", "mig-")) else uuid


def nvml_match(answers: dict[str, Any], torch_uuid: str | None) -> dict[str, Any] | None:
    """The NVML device (GPU or MIG slice) whose UUID is torch's, with ``gpu_uuid`` added."""
    if torch_uuid is None or answers.get("nvml") is None:
        return None
    for gpu in answers["nvml"]["gpus"]:
        for dev, parent in [(gpu, gpu), *((m, gpu) for m in gpu["mig"])]:
            if _hex(dev["uuid"]) == _hex(torch_uuid):
                return {**dev, "gpu_uuid": parent["uuid"], "pci_bus_id": parent["pci_bus_id"]}
    return None


def expected_series(answers: dict[str, Any], index: str) -> dict[str, float | None]:
    """``{metric: value or None (no series)}`` on ``cuda:index`` for these answers, as the installed
    torch reports them (no ``num_device_alloc`` before torch 2.3, say)."""
    from tests.support.cuda_standins import as_installed_reports  # imports torch: only where a scrape runs

    dev = answers["devices"][index]
    stats, backend = as_installed_reports(dev["memory_stats"]), answers["allocator_backend"] or "native"
    out: dict[str, float | None] = {}
    readable = "raises" not in stats
    for short, key in ALLOCATOR_KEYS.items():
        keep = readable and key in stats and (backend != "cudaMallocAsync" or short in ASYNC_MEASURED)
        out[f"memexporter_allocator_{short}"] = float(stats[key]) if keep else None
    match = nvml_match(answers, dev["properties"].get("uuid"))
    # NVML's v2 answer where the driver and nvidia-ml-py gave one (the reservation apart); v1's where
    # they have none (no answer, or one of the errors that say so); none where v2 failed otherwise.
    v2 = match.get("memory_v2") if match and answers["nvml"].get("memory_v2_binding", True) else None
    raised = v2.get("raises", "").partition(":")[0] if isinstance(v2, dict) else ""
    failed = bool(raised) and raised not in NO_V2
    mem = None if match is None or failed else v2 if v2 is not None and not raised else match["memory"]
    out["memexporter_device_total_bytes"] = float(mem["total"]) if mem else None
    out["memexporter_device_used_bytes"] = float(mem["used"]) if mem else None
    out["memexporter_device_reserved_bytes"] = float(mem["reserved"]) if mem and "reserved" in mem else None
    out["memexporter_memory_used_bytes"] = float(stats["allocated_bytes.all.current"]) if readable else None
    free = mem["free"] if mem else None
    if free is None and "raises" not in (dev["mem_get_info"] or {"raises": ""}):
        free = dev["mem_get_info"][0]
    limit = None if free is None or not readable else float(stats["reserved_bytes.all.current"] + free)
    fraction = dev["memory_fraction"]
    if isinstance(fraction, float | int) and fraction < 1.0:
        cap = float(int(fraction * dev["properties"]["total_memory"]))
        limit = cap if limit is None else min(limit, cap)
    out["memexporter_memory_limit_bytes"] = limit if readable else None
    return out


def check_mapping(monkeypatch: pytest.MonkeyPatch, answers: dict[str, Any]) -> None:
    """Scrape over ``answers`` with the real backends; every expected series, every collector up."""
    from memexporter.backends.cuda import TorchBackend
    from memexporter.backends.nvml import NvmlBackend
    from memexporter.collectors.registry import catalogue
    from tests.support.cuda_standins import TorchStandIn, no_nvml
    from tests.support.fakes import FakeHost, registry_for, sources
    from tests.support.nvml_standin import NvmlStandIn

    TorchStandIn(answers).install(monkeypatch)
    if answers.get("nvml") is not None:
        NvmlStandIn(answers["nvml"]).install(monkeypatch)
    else:
        no_nvml(monkeypatch)
    reg = registry_for(sources(TorchBackend(), NvmlBackend(), FakeHost()))  # type: ignore[arg-type]
    for index in answers["devices"]:
        labels = {"rank": "3", "device": f"cuda:{index}"}
        for metric, value in expected_series(answers, index).items():
            assert reg.get_sample_value(metric, labels) == value, (metric, index)
    for c in catalogue():
        assert reg.get_sample_value("memexporter_collector_success", {"rank": "3", "collector": c.name}) == 1, c.name
