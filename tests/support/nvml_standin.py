"""A stand-in for the ``pynvml`` module (nvidia-ml-py), replaying a fixture's NVML answers.

Answers are nvidia-ml-py's own types: ``c_nvmlMemory_t``, ``c_nvmlMemory_v2_t`` and
``nvmlPciInfo_t`` structures, the ``NVMLError_*`` classes NVML's return codes map to, a ``c_uint``
from ``nvmlDeviceIsMigDeviceHandle``, ``c_nvmlDevice_t`` handles, and the running processes as
nvidia-ml-py hands them out (``c_nvmlProcessInfo_v3_t`` turned into its friendly object, an
unavailable figure as ``None``). Names, UUIDs and the PCI bus id
come back as ``str`` (nvidia-ml-py >= 11.515) or ``bytes`` (older), as the fixture asks.

Memory: ``nvmlDeviceGetMemoryInfo(handle)`` answers the device's ``memory`` (v1);
``nvmlDeviceGetMemoryInfo(handle, version=nvmlMemory_v2)`` its ``memory_v2`` (total, reserved,
free, used; the struct's version is the caller's), or raises as the real call does: ``NVMLError_FunctionNotFound`` where the
device has no ``memory_v2`` (a driver without the symbol, or a fixture recorded before v2 was),
``NVMLError_ArgumentVersionMismatch`` for another struct version, and whatever ``{"raises":
"NVMLError_...: ..."}`` says. ``"memory_v2_binding": false`` in the answers is an nvidia-ml-py
without v2: no ``nvmlMemory_v2``, and the call takes no ``version``.
"""

from __future__ import annotations

import ctypes
import os
import sys
from types import ModuleType
from typing import Any

import pynvml
import pytest

from tests.support.cuda_standins import replay


def _replay(value: Any) -> Any:
    """``replay``, with nvidia-ml-py's own error classes for ``{"raises": "NVMLError_...: ..."}``."""
    if isinstance(value, dict) and str(value.get("raises", "")).startswith("NVMLError_"):
        raise getattr(pynvml, value["raises"].partition(":")[0])()
    return replay(value)


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
            def wrapped(*args: Any, **kwargs: Any) -> Any:
                self.calls.append(fn.__name__)
                return fn(*args, **kwargs)

            setattr(m, fn.__name__, wrapped)
            return wrapped

        @record
        def nvmlInit() -> None:
            replay(nvml.get("init"))

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
            answer = dev(handle)[0]
            if not version:  # nvidia-ml-py's test: v1 unless a version is given
                mem = _replay(answer["memory"])
                return pynvml.c_nvmlMemory_t(total=mem["total"], free=mem["free"], used=mem["used"])
            if "memory_v2" not in answer:  # the binding's lookup of nvmlDeviceGetMemoryInfo_v2 fails
                raise pynvml.NVMLError_FunctionNotFound()
            if version != pynvml.nvmlMemory_v2:
                raise pynvml.NVMLError_ArgumentVersionMismatch()
            mem = _replay(answer["memory_v2"])
            return pynvml.c_nvmlMemory_v2_t(
                version=version, total=mem["total"], reserved=mem["reserved"], free=mem["free"], used=mem["used"]
            )

        if not nvml.get("memory_v2_binding", True):  # an nvidia-ml-py before v2: def nvmlDeviceGetMemoryInfo(handle)
            recorded = m.nvmlDeviceGetMemoryInfo

            def v1_only(handle: Any) -> Any:
                return recorded(handle)

            m.nvmlDeviceGetMemoryInfo = v1_only  # type: ignore[attr-defined]
        else:
            m.nvmlMemory_v2 = pynvml.nvmlMemory_v2  # type: ignore[attr-defined]

        @record
        def nvmlDeviceGetComputeRunningProcesses(handle: Any) -> list[Any]:
            answer = dev(handle)[0]
            if "processes" not in answer:  # a fixture recorded before the call was: a driver without it
                raise pynvml.NVMLError_NotSupported()
            out = []
            for p in replay(answer["processes"]):
                info = pynvml.c_nvmlProcessInfo_v3_t(
                    pid=os.getpid() if p["pid"] == "self" else int(p["pid"]),
                    usedGpuMemory=pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value if p["used"] is None else p["used"],
                    gpuInstanceId=p["gpu_instance_id"],
                    computeInstanceId=p["compute_instance_id"],
                )
                obj = pynvml.nvmlStructToFriendlyObject(info)
                if obj.usedGpuMemory == pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
                    obj.usedGpuMemory = None  # as nvidia-ml-py's nvmlDeviceGetComputeRunningProcesses_v3 does
                out.append(obj)
            return out

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
