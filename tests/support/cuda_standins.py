"""Stand-ins for torch.cuda's public functions and for the ``pynvml`` module, replaying answers.

The answers come from a fixture (``tests/fixtures/synthetic/*.json``, made up; or
``tests/fixtures/recorded/*.json``, recorded on a GPU by ``tests/cuda/record_fixtures.py``).
Only the answers are stood in for: torch's own ``memory_stats()`` still flattens and sorts the
nested dict, NVML answers are nvidia-ml-py's real ``c_nvmlMemory_t`` / ``nvmlPciInfo_t``
structures, its real ``NVMLError_*`` classes and its ``c_uint`` for ``nvmlDeviceIsMigDeviceHandle``,
and names come back as ``str`` (nvidia-ml-py >= 11.515) or ``bytes`` (older), as asked.

The torch stand-in also models what creates a CUDA context: ``mem_get_info`` on a device without
one does (``cudaMemGetInfo`` under a device guard); reading stats, properties or the fraction
does not. ``TorchStandIn.contexts`` is what ``torch._C._cuda_hasPrimaryContext`` would answer.
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pynvml
import pytest
import torch
import torch.cuda
import torch.cuda.memory

from tests.support.memory_stats import unflatten, zeros_like

_ERRORS: dict[str, type[Exception]] = {"RuntimeError": RuntimeError, "AssertionError": AssertionError,
                                       "ValueError": ValueError, "OSError": OSError}


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def _answer(value: Any) -> Any:
    """The value, or raise what the fixture says the call raised (``{"raises": "Type: message"}``)."""
    if isinstance(value, dict) and "raises" in value:
        kind, _, message = value["raises"].partition(": ")
        raise _ERRORS.get(kind, RuntimeError)(message)
    return value


class CUuuid:
    """``torch._C._CUuuid``: ``str()`` is the 8-4-4-4-12 hex of ``.bytes`` (Module.cpp ``uuid_to_string``)."""

    def __init__(self, text: str) -> None:
        self.bytes = list(bytes.fromhex(text.replace("-", "")))

    def __str__(self) -> str:
        h = bytes(self.bytes).hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class DeviceProperties:
    """``torch._C._CudaDeviceProperties``' fields; ``uuid`` only where that torch had one."""

    def __init__(self, fields: dict[str, Any]) -> None:
        for key, value in fields.items():
            setattr(self, key, CUuuid(value) if key == "uuid" else value)


class TorchStandIn:
    """torch.cuda as the fixture's process saw it. ``calls`` lists ``(function, device)``."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, int]] = []
        self.contexts = {int(i) for i, d in answers["devices"].items() if d.get("has_primary_context")}

    def device(self, index: int) -> dict[str, Any]:
        if str(index) in self.answers["devices"]:
            return self.answers["devices"][str(index)]  # type: ignore[no-any-return]
        # A visible device the process never used: a fresh allocator, no context.
        first = next(iter(self.answers["devices"].values()))
        stats = first["memory_stats"]
        total = first["properties"]["total_memory"]
        return {"properties": first["properties"], "memory_fraction": 1.0, "mem_get_info": [total, total],
                "memory_stats": zeros_like(stats) if "raises" not in stats else stats}

    def _call(self, name: str, device: Any) -> dict[str, Any]:
        index = int(device)
        if not 0 <= index < self.answers["device_count"]:
            raise AssertionError("Invalid device id")
        self.calls.append((name, index))
        return self.device(index)

    def install(self, mp: pytest.MonkeyPatch) -> TorchStandIn:
        a = self.answers

        def nested(device: Any = None) -> dict[Any, Any]:
            return unflatten(_answer(self._call("memory_stats", device)["memory_stats"]))

        def mem_get_info(device: Any = None) -> tuple[int, int]:
            answer = self._call("mem_get_info", device)
            self.contexts.add(int(device))  # cudaMemGetInfo under a device guard creates the context
            free, total = _answer(answer["mem_get_info"])
            return int(free), int(total)

        mp.setattr(torch.cuda, "is_initialized", lambda: a.get("initialized", True))
        mp.setattr(torch.cuda, "device_count", lambda: a["device_count"])
        mp.setattr(torch.cuda.memory, "memory_stats_as_nested_dict", nested)  # torch's memory_stats() calls this
        mp.setattr(torch.cuda, "memory_stats_as_nested_dict", nested)
        mp.setattr(torch.cuda, "get_device_properties",
                   lambda device=None: DeviceProperties(self._call("get_device_properties", device)["properties"]))
        mp.setattr(torch.cuda, "mem_get_info", mem_get_info)
        mp.setattr(torch._C, "_cuda_hasPrimaryContext", lambda i: i in self.contexts, raising=False)
        if a["allocator_backend"] is None:  # torch before get_allocator_backend()
            mp.delattr(torch.cuda, "get_allocator_backend", raising=False)
        else:
            mp.setattr(torch.cuda, "get_allocator_backend", lambda: a["allocator_backend"])
        if all(d.get("memory_fraction") is None for d in a["devices"].values()):  # torch before the getter
            mp.delattr(torch.cuda, "get_per_process_memory_fraction", raising=False)
        else:
            mp.setattr(torch.cuda, "get_per_process_memory_fraction",
                       lambda device=None: float(_answer(self._call("get_per_process_memory_fraction", device)["memory_fraction"])))
        mp.setattr(torch, "__version__", a["torch_version"])
        mp.setattr(torch.version, "cuda", a["cuda_version"])
        return self


class _PciInfoBeforeStr(pynvml.nvmlPciInfo_t):  # type: ignore[misc]
    """nvidia-ml-py before 11.515 did not decode ``char[]`` fields: ``busId`` reads as bytes."""

    def __getattribute__(self, name: str) -> Any:
        return ctypes.Structure.__getattribute__(self, name)


class NvmlStandIn:
    """A ``pynvml`` module over the fixture's NVML answers. ``calls`` names each NVML call."""

    def __init__(self, nvml: dict[str, Any]) -> None:
        self.nvml = nvml
        self.calls: list[str] = []
        self._devices: dict[int, tuple[dict[str, Any], Any]] = {}  # id(handle) -> (answer, parent handle)
        self._handles: dict[int, Any] = {}  # id(answer) -> handle (handles must stay alive: ids are keys)
        self._gpus: list[Any] = []
        for gpu in nvml["gpus"]:
            handle = self._handle(gpu, None)
            self._gpus.append(handle)
            for mig in gpu["mig"]:
                self._handle(mig, handle)

    def _handle(self, answer: dict[str, Any], parent: Any) -> Any:
        handle = pynvml.c_nvmlDevice_t()  # an opaque pointer, as NVML hands out
        self._handles[id(answer)] = handle
        self._devices[id(handle)] = (answer, parent)
        return handle

    def _text(self, value: str) -> str | bytes:
        return value.encode() if self.nvml["strings"] == "bytes" else value

    def _dev(self, handle: Any) -> tuple[dict[str, Any], Any]:
        if id(handle) not in self._devices:
            raise pynvml.NVMLError_InvalidArgument()
        return self._devices[id(handle)]

    def module(self) -> ModuleType:
        m = ModuleType("pynvml")
        for name in dir(pynvml):
            if name.startswith(("NVMLError", "NVML_")):
                setattr(m, name, getattr(pynvml, name))
        nvml, dev = self.nvml, self._dev

        def record(fn: Any) -> Any:
            def wrapped(*args: Any) -> Any:
                self.calls.append(fn.__name__)
                return fn(*args)
            setattr(m, fn.__name__, wrapped)
            return wrapped

        @record
        def nvmlInit() -> None:
            _answer(nvml.get("init"))

        @record
        def nvmlSystemGetDriverVersion() -> str | bytes:
            return self._text(nvml.get("driver_version", ""))

        @record
        def nvmlDeviceGetCount() -> int:
            return len(self._gpus)

        @record
        def nvmlDeviceGetHandleByIndex(index: int) -> Any:
            return self._gpus[index]

        @record
        def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> Any:
            text = uuid.decode() if isinstance(uuid, bytes) else uuid
            for answer, parent in self._devices.values():
                if answer["uuid"] == text and (parent is None or nvml["handle_by_mig_uuid"]):
                    return self._handles[id(answer)]
            raise pynvml.NVMLError_NotFound()

        @record
        def nvmlDeviceGetUUID(handle: Any) -> str | bytes:
            return self._text(dev(handle)[0]["uuid"])

        @record
        def nvmlDeviceGetName(handle: Any) -> str | bytes:
            return self._text(dev(handle)[0]["name"])

        @record
        def nvmlDeviceGetMemoryInfo(handle: Any, version: Any = None) -> Any:
            mem = _answer(dev(handle)[0]["memory"])
            return pynvml.c_nvmlMemory_t(total=mem["total"], free=mem["free"], used=mem["used"])

        @record
        def nvmlDeviceGetPciInfo(handle: Any) -> Any:
            answer, parent = dev(handle)
            if parent is not None:
                raise pynvml.NVMLError_NotSupported()
            info = (_PciInfoBeforeStr if nvml["strings"] == "bytes" else pynvml.nvmlPciInfo_t)()
            info.busId = answer["pci_bus_id"].encode()
            info.busIdLegacy = answer["pci_bus_id"][4:].encode()
            return info

        @record
        def nvmlDeviceGetMigMode(handle: Any) -> list[int]:
            mode = dev(handle)[0].get("mig_mode")
            if mode is None:
                raise pynvml.NVMLError_NotSupported()
            return list(mode)

        @record
        def nvmlDeviceGetMaxMigDeviceCount(handle: Any) -> int:
            return 7 if dev(handle)[0].get("mig_mode") is not None else 0

        @record
        def nvmlDeviceGetMigDeviceHandleByIndex(handle: Any, index: int) -> Any:
            slices = dev(handle)[0]["mig"]
            if index >= len(slices):
                raise pynvml.NVMLError_NotFound()
            return self._handles[id(slices[index])]

        @record
        def nvmlDeviceIsMigDeviceHandle(handle: Any) -> ctypes.c_uint:
            return ctypes.c_uint(int(dev(handle)[1] is not None))

        @record
        def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle: Any) -> Any:
            parent = dev(handle)[1]
            if parent is None:
                raise pynvml.NVMLError_InvalidArgument()
            return parent

        @record
        def nvmlDeviceGetGpuInstanceId(handle: Any) -> int:
            answer, parent = dev(handle)
            if parent is None:
                raise pynvml.NVMLError_InvalidArgument()
            return int(answer["gpu_instance_id"])

        return m

    def install(self, mp: pytest.MonkeyPatch) -> NvmlStandIn:
        mp.setitem(sys.modules, "pynvml", self.module())
        return self


def no_nvml(mp: pytest.MonkeyPatch) -> None:
    """``pip install memexporter`` without the ``[nvml]`` extra: ``import pynvml`` fails."""
    mp.setitem(sys.modules, "pynvml", None)

