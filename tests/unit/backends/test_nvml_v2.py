"""NvmlBackend's memory figures: NVML's v2 answer (used as nvidia-smi shows it, the driver's
reservation apart) where the driver and nvidia-ml-py have it, v1 where they do not.

The answers are an H200's, through nvidia-ml-py's real structures and error classes: v1 and v2
as NVML answered them together on the GPU (``nvml_h200.h200_recorded_v2``), and the first GPU
run's recording (``nvml_h200.h200_answers``: v1 and the process line recorded, the v2 answer
SYNTHETIC, derived from that recording's NVML and ``cudaMemGetInfo`` figures), on which the cases
without v2 are built.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pytest

from memexporter.backends.base import DeviceMemory
from memexporter.backends.nvml import NvmlBackend
from tests.support.fakes import SYNTHETIC_STATS, FakeCuda, registry_for, sources
from tests.support.nvml_h200 import h200_answers, h200_recorded_v2
from tests.support.nvml_standin import NvmlStandIn

H200_HEX = "1420dfe2-68c0-6889-4308-4efc45aaef99"
# cudaMemGetInfo on the H200, as recorded (free, total): what nvidia-smi's used is total - free of.
CUDA_FREE, CUDA_TOTAL = 147_860_815_872, 150_109_880_320
RESERVED = 644_939_776  # 615.06 MiB: NVML's total less cudaMemGetInfo's
V1 = DeviceMemory(
    uuid=f"GPU-{H200_HEX}",
    name="NVIDIA H200",
    total=150_754_820_096,
    used=2_894_004_224,
    free=CUDA_FREE,
    pci_bus_id="00000000:00:06.0",
    gpu_uuid=f"GPU-{H200_HEX}",
)
V2 = replace(V1, used=CUDA_TOTAL - CUDA_FREE, reserved=RESERVED)
NO_V2 = "no v2 memory info"


def install(monkeypatch: pytest.MonkeyPatch, **v2: Any) -> NvmlStandIn:
    """The H200's answers; ``memory_v2=`` replaces its v2 answer (``None``: the driver has none),
    other keys go to the answers (``memory_v2_binding=False``: an nvidia-ml-py without v2)."""
    answers = h200_answers()
    gpu = answers["gpus"][0]
    if "memory_v2" in v2:
        answer = v2.pop("memory_v2")
        gpu.pop("memory_v2")
        if answer is not None:
            gpu["memory_v2"] = answer
    return NvmlStandIn({**answers, **v2}).install(monkeypatch)


def said(caplog: pytest.LogCaptureFixture, text: str) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if text in r.getMessage()]


def test_recorded_v2_used_is_cudamemgetinfos_and_the_reservation_comes_apart(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    answers, record = h200_recorded_v2()  # recorded on an H200: v1 and v2 read together
    NvmlStandIn(answers).install(monkeypatch)
    gpu, (cuda_free, cuda_total) = answers["gpus"][0], record["busy"]["mem_get_info"]
    with caplog.at_level(logging.DEBUG, logger="memexporter"):
        mem = NvmlBackend().memory(record["busy"]["uuid"])  # torch's spelling: bare hex
    assert mem is not None and mem.reserved == 644_939_776 and mem.uuid == gpu["uuid"]
    assert (mem.total, mem.used, mem.free) == (150_754_820_096, cuda_total - cuda_free, cuda_free)
    assert mem.used == gpu["memory"]["used"] - mem.reserved  # v1 counted the driver's 615 MiB as used
    assert mem.total - mem.reserved == cuda_total == record["busy"]["total_memory"]
    assert caplog.records == []
    # Before CUDA was initialised there: v1 read 615 MiB used, v2 (and nvidia-smi) none.
    idle = record["idle"]
    assert (idle["memory"]["used"], idle["memory_v2"]["used"]) == (idle["memory_v2"]["reserved"], 0)
    assert record["recorded"]["nvidia_smi_fb_memory_usage"]["Used"] == "0 MiB"


def test_v2_used_is_nvidia_smis_and_the_reservation_comes_apart(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    install(monkeypatch)
    with caplog.at_level(logging.DEBUG, logger="memexporter"):
        mem = NvmlBackend().memory(H200_HEX)
    assert mem == V2 and mem.reserved is not None
    assert mem.used == V1.used - RESERVED  # v1 counted the driver's 615 MiB as used
    assert mem.total - mem.reserved == CUDA_TOTAL  # what CUDA can hand out: cudaMemGetInfo's total
    assert mem.total == mem.used + mem.reserved + mem.free
    assert caplog.records == []


@pytest.mark.parametrize(
    "lacking",
    [
        pytest.param({"memory_v2": None}, id="driver-without-the-symbol"),  # FUNCTION_NOT_FOUND
        pytest.param({"memory_v2": {"raises": "NVMLError_NotSupported: Not Supported"}}, id="not-supported"),
        pytest.param(
            {"memory_v2": {"raises": "NVMLError_ArgumentVersionMismatch: Argument version mismatch"}},
            id="version-mismatch",
        ),
        pytest.param({"memory_v2_binding": False}, id="nvidia-ml-py-without-v2"),
    ],
)
def test_without_v2_the_v1_figures_no_reserved_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, lacking: dict[str, Any]
) -> None:
    nv = install(monkeypatch, **lacking)
    backend = NvmlBackend()
    with caplog.at_level(logging.DEBUG, logger="memexporter"):
        readings = [backend.memory(H200_HEX) for _ in range(3)]
    assert readings == [V1] * 3  # v1 as it was (reserved None): no made-up reservation
    lines = said(caplog, NO_V2)
    assert len(lines) == 1 and lines[0][0] == logging.INFO, lines
    assert f"GPU-{H200_HEX}" in lines[0][1] and "memexporter_device_reserved_bytes" in lines[0][1]
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    # Decided once: v2 asked by the first read only (an nvidia-ml-py without it is not even asked).
    asked_v2 = "memory_v2_binding" not in lacking
    assert nv.calls.count("nvmlDeviceGetMemoryInfo") == 3 + asked_v2


def test_v2_raising_at_run_time_costs_that_read_only(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    nv = install(monkeypatch)
    backend = NvmlBackend()
    assert backend.memory(H200_HEX) == V2
    gpu = nv.nvml["gpus"][0]
    good, gpu["memory_v2"] = gpu["memory_v2"], {"raises": "NVMLError_Unknown: Unknown Error"}
    with caplog.at_level(logging.DEBUG, logger="memexporter"):
        # No figures rather than v1's: used would jump by the reservation and reserved vanish.
        assert backend.memory(H200_HEX) is None and backend.memory(H200_HEX) is None
    assert [level for level, _ in said(caplog, "cannot read the memory")] == [logging.WARNING, logging.DEBUG]
    assert said(caplog, NO_V2) == []
    gpu["memory_v2"] = good
    assert backend.memory(H200_HEX) == V2  # v2 asked again, not given up for v1


def test_the_scrape_exports_the_reservation_and_keeps_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    answers, record = h200_recorded_v2()
    NvmlStandIn(answers).install(monkeypatch)
    (cuda_free, cuda_total), v1 = record["busy"]["mem_get_info"], answers["gpus"][0]["memory"]
    cuda = FakeCuda(stats={0: SYNTHETIC_STATS}, uuids={0: record["busy"]["uuid"]})  # SYNTHETIC allocator figures
    reg = registry_for(sources(cuda, NvmlBackend()))
    labels = {"rank": "3", "device": "cuda:0"}
    assert reg.get_sample_value("memexporter_device_used_bytes", labels) == cuda_total - cuda_free
    assert reg.get_sample_value("memexporter_device_reserved_bytes", labels) == RESERVED
    assert reg.get_sample_value("memexporter_device_total_bytes", labels) == v1["total"]
    assert reg.get_sample_value("memexporter_device_free_bytes", labels) == cuda_free == v1["free"]
    # The limit is the allocator's reserved bytes plus the driver's free: v2's free is v1's.
    held = SYNTHETIC_STATS["reserved_bytes.all.current"]
    assert reg.get_sample_value("memexporter_memory_limit_bytes", labels) == held + cuda_free


def test_without_v2_the_scrape_has_no_reserved_series(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, memory_v2=None)
    cuda = FakeCuda(stats={0: SYNTHETIC_STATS}, uuids={0: H200_HEX})
    reg = registry_for(sources(cuda, NvmlBackend()))
    labels = {"rank": "3", "device": "cuda:0"}
    assert reg.get_sample_value("memexporter_device_used_bytes", labels) == V1.used
    assert reg.get_sample_value("memexporter_device_reserved_bytes", labels) is None
    assert "memexporter_device_reserved_bytes" not in {f.name for f in reg.collect()}
