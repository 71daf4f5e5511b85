"""NVML device memory: the only module that imports ``pynvml`` (package ``nvidia-ml-py``).

NVML is initialised lazily, once, behind a lock, and never creates a CUDA context. Every query
answers ``None`` instead of raising: no NVML (a CPU box, a container without the driver library,
``pip install memexporter`` without the ``[nvml]`` extra) means no device series, not a failing
collector. NVML enumerates physical GPUs and ignores ``CUDA_VISIBLE_DEVICES``, so devices are
matched by UUID, never by index.

torch spells a UUID as bare hex; NVML prefixes ``GPU-`` for a GPU and ``MIG-`` for a MIG slice.
Both spellings are tried, then NVML's own list (MIG slices included) is searched for the hex.
What a device is (UUID, name, PCI bus id, MIG parent) is looked up once; its memory every scrape.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from memexporter.backends.base import DeviceMemory, LogOnce, ProcessMemory

log = logging.getLogger("memexporter")


@dataclass(frozen=True)
class _Device:
    handle: Any
    identity: DeviceMemory  # sizes zero: filled per scrape


def _text(value: object) -> str:
    # nvidia-ml-py returns str since 11.515; older releases return bytes (names, UUIDs, busId).
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _hex(uuid: str) -> str:
    """The bare hex of a UUID in any spelling: ``GPU-ab..`` / ``MIG-ab..`` / ``ab..`` -> ``ab..``."""
    uuid = uuid.strip().lower()
    return uuid.split("-", 1)[1] if uuid.startswith(("gpu-", "mig-")) else uuid


def _not_found(nvml: ModuleType, exc: Exception) -> bool:
    # NOT_FOUND: no such device; INVALID_ARGUMENT: a spelling this driver does not accept.
    kinds = tuple(getattr(nvml, n) for n in ("NVMLError_NotFound", "NVMLError_InvalidArgument") if hasattr(nvml, n))
    return isinstance(exc, kinds)


class NvmlBackend:
    """Lazy, failure-tolerant NVML access."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nvml: ModuleType | None = None
        self._tried = False
        self._devices: dict[str, _Device | None] = {}  # torch's UUID -> the NVML device, or None: not there
        self._log = LogOnce()

    def _lib(self) -> ModuleType | None:
        with self._lock:
            if not self._tried:
                self._tried = True
                try:
                    import pynvml

                    pynvml.nvmlInit()
                    self._nvml = pynvml
                except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, driver mismatch...
                    log.info(
                        "memexporter: NVML unavailable (%s); no memexporter_device_* series "
                        "(pip install memexporter[nvml] brings nvidia-ml-py)",
                        exc,
                    )
            return self._nvml

    def memory(self, uuid: str, index: int | None = None) -> DeviceMemory | None:
        """Identity and memory of the device torch calls ``uuid``, or ``None`` if NVML cannot say.
        ``index`` (torch's ordinal) is not used: NVML numbers the physical GPUs its own way."""
        nvml = self._lib()
        if nvml is None:
            return None
        device = self._device(nvml, uuid)
        if device is None:
            return None
        try:
            info = nvml.nvmlDeviceGetMemoryInfo(device.handle)
        except Exception as exc:
            self._log.warning(
                f"memory:{uuid}", "memexporter: NVML cannot read the memory of %s (%s)", device.identity.uuid, exc
            )
            return None
        d = device.identity
        return DeviceMemory(
            d.uuid, d.name, int(info.total), int(info.used), int(info.free), d.pci_bus_id, d.gpu_uuid, d.gpu_instance_id
        )

    def process_memory(self, uuid: str, pid: int) -> ProcessMemory | None:
        """Process ``pid``'s memory on the device torch calls ``uuid``; ``None`` without NVML or
        the device. One ``nvmlDeviceGetComputeRunningProcesses`` call (the driver's list, no
        context, no sync)."""
        nvml = self._lib()
        device = self._device(nvml, uuid) if nvml is not None else None
        if nvml is None or device is None:
            return None
        name = device.identity.uuid
        try:
            listed = nvml.nvmlDeviceGetComputeRunningProcesses(device.handle)
        except Exception as exc:  # NOT_SUPPORTED on some vGPU and older drivers
            self._log.warning(
                f"processes:{uuid}",
                "memexporter: NVML cannot list the processes on %s (%s): no "
                "memexporter_device_process_used_bytes or _non_allocator_bytes for it",
                name,
                exc,
            )
            return ProcessMemory(None, "error")
        mine = [p for p in listed if int(p.pid) == pid]
        if not mine:
            self._log.warning(
                f"hidden:{uuid}",
                "memexporter: NVML lists %d process(es) on %s, none with this "
                "process's PID %d: a container's PID namespace hides it from the driver (run with "
                "the host's PID namespace: hostPID: true, docker --pid=host, to measure it). "
                "memexporter_device_process_used_bytes is NaN, _non_allocator_bytes absent",
                len(listed),
                name,
                pid,
            )
            return ProcessMemory(None, "hidden")
        # nvidia-ml-py turns NVML_VALUE_NOT_AVAILABLE into None; a process listed on several
        # compute instances of one MIG slice has one entry each.
        used = [p.usedGpuMemory for p in mine]
        if any(u is None for u in used):
            self._log.warning(
                f"na:{uuid}",
                "memexporter: NVML lists this process on %s without its memory "
                "(NVML_VALUE_NOT_AVAILABLE): memexporter_device_process_used_bytes is NaN",
                name,
            )
            return ProcessMemory(None, "not_available")
        return ProcessMemory(sum(int(u) for u in used))

    def _device(self, nvml: ModuleType, uuid: str) -> _Device | None:
        with self._lock:
            if uuid in self._devices:
                return self._devices[uuid]
        try:
            handle = self._find(nvml, uuid)
            device = _Device(handle, self._describe(nvml, handle)) if handle is not None else None
        except Exception as exc:  # a driver error, not an answer: try again next scrape
            self._log.warning(f"find:{uuid}", "memexporter: NVML lookup of device %s failed (%s)", uuid, exc)
            return None
        if device is None:
            self._log.warning(
                f"find:{uuid}",
                "memexporter: no NVML device has UUID %s (tried GPU-/MIG- and NVML's "
                "device list): no memexporter_device_* series for it",
                uuid,
            )
        with self._lock:
            self._devices[uuid] = device
        return device

    def _find(self, nvml: ModuleType, uuid: str) -> Any:
        """NVML's handle for torch's ``uuid``, or ``None`` when no device has it."""
        bare = _hex(uuid)
        for spelling in dict.fromkeys((uuid, f"GPU-{bare}", f"MIG-{bare}")):
            try:
                return nvml.nvmlDeviceGetHandleByUUID(spelling)
            except Exception as exc:
                if not _not_found(nvml, exc):
                    raise
        # Drivers that do not look MIG UUIDs up by name: walk the GPUs and their MIG slices.
        for i in range(nvml.nvmlDeviceGetCount()):
            gpu = nvml.nvmlDeviceGetHandleByIndex(i)
            for handle in (gpu, *self._mig_slices(nvml, gpu)):
                if _hex(_text(nvml.nvmlDeviceGetUUID(handle))) == bare:
                    return handle
        return None

    @staticmethod
    def _mig_slices(nvml: ModuleType, gpu: Any) -> list[Any]:
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(gpu)
        except Exception:  # NOT_SUPPORTED on GPUs without MIG
            return []
        if current != nvml.NVML_DEVICE_MIG_ENABLE:
            return []
        out = []
        for j in range(nvml.nvmlDeviceGetMaxMigDeviceCount(gpu)):
            try:
                out.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, j))
            except Exception as exc:  # NOT_FOUND: an empty slot
                if not _not_found(nvml, exc):
                    raise
        return out

    def _describe(self, nvml: ModuleType, handle: Any) -> DeviceMemory:
        """The device's identity; the optional parts (PCI, MIG parent) are empty when NVML cannot say."""
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        name = _text(nvml.nvmlDeviceGetName(handle))
        gpu, gpu_uuid, instance = handle, uuid, ""
        try:
            if nvml.nvmlDeviceIsMigDeviceHandle(handle):
                gpu = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
                gpu_uuid = _text(nvml.nvmlDeviceGetUUID(gpu))
                instance = str(int(nvml.nvmlDeviceGetGpuInstanceId(handle)))
        except Exception as exc:  # NOT_SUPPORTED before MIG existed (drivers < R450)
            self._log.warning(f"mig:{uuid}", "memexporter: NVML cannot tell whether %s is a MIG slice (%s)", uuid, exc)
        try:
            pci = _text(nvml.nvmlDeviceGetPciInfo(gpu).busId)
        except Exception as exc:
            self._log.warning(f"pci:{uuid}", "memexporter: NVML has no PCI bus id for %s (%s)", uuid, exc)
            pci = ""
        return DeviceMemory(uuid, name, 0, 0, 0, pci, gpu_uuid, instance)
