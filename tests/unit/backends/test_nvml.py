"""NvmlBackend itself, over a ``pynvml`` module that answers as the SYNTHETIC fixtures say with
nvidia-ml-py's real structures and error classes: matching torch's UUID spelling to NVML's (GPU,
MIG slice, old driver, old nvidia-ml-py), what it reports, and what it does when NVML cannot say."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import pynvml
import pytest

from memexporter.backends.base import DeviceMemory, ProcessMemory
from memexporter.backends.nvml import NvmlBackend
from tests.support.cuda_standins import load, no_nvml
from tests.support.nvml_standin import NvmlStandIn
from tests.support.synthetic_fixtures import SYNTHETIC_DIR

MiB = 1 << 20
A100_HEX = "3f6a9c2e-8b1d-4e07-a5c9-72d41e0b9f63"
MIG_HEX = "9b1c5e7a-2d4f-5a60-8c3b-1e9f0d2a7c45"
MIG_PARENT = "GPU-e1c4a8f2-6b3d-4f90-8a7e-2c5d1b0f9e36"


def nvml_answers(name: str) -> dict[str, Any]:
    return load(SYNTHETIC_DIR / f"{name}.json")["answers"]["nvml"]  # type: ignore[no-any-return]


def install(monkeypatch: pytest.MonkeyPatch, name: str, **changes: Any) -> NvmlStandIn:
    return NvmlStandIn({**nvml_answers(name), **changes}).install(monkeypatch)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("strings", ["str", "bytes"])  # nvidia-ml-py >= 11.515 decodes; older returned bytes
@pytest.mark.parametrize("spelling", [A100_HEX, f"GPU-{A100_HEX}", A100_HEX.upper()])
def test_a100_matched_by_uuid_not_index(monkeypatch: pytest.MonkeyPatch, strings: str, spelling: str) -> None:
    module = install(monkeypatch, "a100_torch2.13_fraction", strings=strings).module()
    name = module.nvmlDeviceGetName(module.nvmlDeviceGetHandleByIndex(3))
    assert isinstance(name, bytes if strings == "bytes" else str)
    assert isinstance(module.nvmlDeviceGetPciInfo(module.nvmlDeviceGetHandleByIndex(3)).busId, type(name))
    mem = NvmlBackend().memory(spelling)
    # cuda:0 under CUDA_VISIBLE_DEVICES=3 is NVML's fourth GPU, with the same UUID.
    assert mem == DeviceMemory(
        uuid=f"GPU-{A100_HEX}",
        name="NVIDIA A100-SXM4-80GB",
        total=81920 * MiB,
        used=40806 * MiB,
        free=(81920 - 40806) * MiB,
        pci_bus_id="00000000:C7:00.0",
        gpu_uuid=f"GPU-{A100_HEX}",
        gpu_instance_id="",
    )


@pytest.mark.parametrize("handle_by_mig_uuid", [True, False])  # False: a driver that does not look MIG UUIDs up
def test_mig_slice_found_under_its_mig_spelling(monkeypatch: pytest.MonkeyPatch, handle_by_mig_uuid: bool) -> None:
    nv = install(monkeypatch, "a100_mig_1g.10gb_torch2.13", handle_by_mig_uuid=handle_by_mig_uuid)
    mem = NvmlBackend().memory(MIG_HEX)
    assert mem == DeviceMemory(
        uuid=f"MIG-{MIG_HEX}",
        name="NVIDIA A100-SXM4-80GB MIG 1g.10gb",
        total=9728 * MiB,
        used=7820 * MiB,
        free=1908 * MiB,
        pci_bus_id="00000000:4E:00.0",  # the parent GPU's
        gpu_uuid=MIG_PARENT,
        gpu_instance_id="13",
    )
    assert ("nvmlDeviceGetMigDeviceHandleByIndex" in nv.calls) is not handle_by_mig_uuid


def test_identity_is_looked_up_once_memory_every_scrape(monkeypatch: pytest.MonkeyPatch) -> None:
    nv = install(monkeypatch, "a100_mig_1g.10gb_torch2.13", handle_by_mig_uuid=False)
    backend = NvmlBackend()
    backend.memory(MIG_HEX)
    first = len(nv.calls)
    nv.nvml["gpus"][0]["mig"][2]["memory"] = {"total": 9728 * MiB, "used": 9000 * MiB, "free": 728 * MiB}
    mem = backend.memory(MIG_HEX)
    assert mem is not None and mem.used == 9000 * MiB
    assert nv.calls[first:] == ["nvmlDeviceGetMemoryInfo"]


def test_unknown_uuid_gives_none_and_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    nv = install(monkeypatch, "a100_torch2.13_fraction")
    backend = NvmlBackend()
    assert backend.memory("0badc0de-0000-4000-8000-000000000000") is None
    calls = len(nv.calls)
    assert backend.memory("0badc0de-0000-4000-8000-000000000000") is None
    assert len(nv.calls) == calls  # not found is an answer: no second scan of NVML's list
    assert warnings(caplog) == [
        "memexporter: no NVML device has UUID 0badc0de-0000-4000-8000-000000000000 (tried "
        "GPU-/MIG- and NVML's device list): no memexporter_device_* series for it"
    ]


def test_memory_read_failure_costs_that_scrape_only(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    nv = install(monkeypatch, "a100_torch2.13_fraction")
    backend = NvmlBackend()
    gpu = nv.nvml["gpus"][3]
    good = gpu["memory"]
    gpu["memory"] = {"raises": "RuntimeError: GPU is lost"}
    assert backend.memory(A100_HEX) is None and backend.memory(A100_HEX) is None
    assert len(warnings(caplog)) == 1
    gpu["memory"] = good
    mem = backend.memory(A100_HEX)
    assert mem is not None and mem.total == 81920 * MiB


def test_driver_error_during_lookup_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    nv = install(monkeypatch, "a100_torch2.13_fraction")
    module = sys.modules["pynvml"]
    real = module.nvmlDeviceGetHandleByUUID

    def lost(uuid: str) -> Any:
        raise pynvml.NVMLError_GpuIsLost()

    monkeypatch.setattr(module, "nvmlDeviceGetHandleByUUID", lost)
    backend = NvmlBackend()
    assert backend.memory(A100_HEX) is None  # an error, not "no such device": not remembered
    monkeypatch.setattr(module, "nvmlDeviceGetHandleByUUID", real)
    assert backend.memory(A100_HEX) is not None
    assert "nvmlInit" in nv.calls


def test_no_pci_or_mig_answer_keeps_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, "v100_torch1.13_after_ooms")
    module = sys.modules["pynvml"]

    def not_supported(handle: Any) -> Any:
        raise pynvml.NVMLError_NotSupported()

    monkeypatch.setattr(module, "nvmlDeviceGetPciInfo", not_supported)
    monkeypatch.setattr(module, "nvmlDeviceIsMigDeviceHandle", not_supported)
    mem = NvmlBackend().memory("6f2e5c71-0a4b-9d3e-52c1-8e7f90ab34cd")
    assert mem is not None and (mem.uuid, mem.pci_bus_id, mem.gpu_uuid, mem.gpu_instance_id) == (
        "GPU-6f2e5c71-0a4b-9d3e-52c1-8e7f90ab34cd",
        "",
        "GPU-6f2e5c71-0a4b-9d3e-52c1-8e7f90ab34cd",
        "",
    )


def test_nvml_library_missing(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    nv = install(monkeypatch, "a100_torch2.13_fraction", init={"raises": "OSError: NVML Shared Library Not Found"})
    caplog.set_level(logging.INFO, logger="memexporter")
    backend = NvmlBackend()
    assert backend.memory(A100_HEX) is None and backend.memory(A100_HEX) is None
    assert nv.calls == ["nvmlInit"]  # tried once


def test_without_the_nvml_extra(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    no_nvml(monkeypatch)
    caplog.set_level(logging.INFO, logger="memexporter")
    assert NvmlBackend().memory(A100_HEX) is None
    assert any("pip install memexporter[nvml]" in r.getMessage() for r in caplog.records)


def test_process_memory_is_this_pids_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, "a100_torch2.13_fraction")
    reserved = load(SYNTHETIC_DIR / "a100_torch2.13_fraction.json")["answers"]["devices"]["0"]["memory_stats"][
        "reserved_bytes.all.current"
    ]
    assert NvmlBackend().process_memory(A100_HEX, os.getpid()) == ProcessMemory(reserved + 1210 * MiB)
    # The profiler's process beside it is its own entry.
    assert NvmlBackend().process_memory(A100_HEX, 51877) == ProcessMemory(268 * MiB)


def test_process_memory_hidden_by_a_pid_namespace_is_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    install(monkeypatch, "a100_mig_1g.10gb_torch2.13")
    backend = NvmlBackend()
    with caplog.at_level(logging.DEBUG, logger="memexporter"):
        assert backend.process_memory(MIG_HEX, os.getpid()) == ProcessMemory(None, "hidden")
        assert backend.process_memory(MIG_HEX, os.getpid()) == ProcessMemory(None, "hidden")
    said = warnings(caplog)
    assert len(said) == 1 and "PID namespace" in said[0] and f"MIG-{MIG_HEX}" in said[0], said


def test_process_memory_not_available_and_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = nvml_answers("a100_torch2.13_fraction")["gpus"]
    mine = next(g for g in gpus if g["uuid"] == f"GPU-{A100_HEX}")
    mine["processes"] = [{**p, "used": None} for p in mine["processes"]]  # NVML_VALUE_NOT_AVAILABLE
    install(monkeypatch, "a100_torch2.13_fraction", gpus=gpus)
    assert NvmlBackend().process_memory(A100_HEX, os.getpid()) == ProcessMemory(None, "not_available")
    del mine["processes"]  # NVMLError_NotSupported from nvmlDeviceGetComputeRunningProcesses
    install(monkeypatch, "a100_torch2.13_fraction", gpus=gpus)
    assert NvmlBackend().process_memory(A100_HEX, os.getpid()) == ProcessMemory(None, "error")


def test_process_memory_without_nvml_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    no_nvml(monkeypatch)
    assert NvmlBackend().process_memory(A100_HEX, os.getpid()) is None
