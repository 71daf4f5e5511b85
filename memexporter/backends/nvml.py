"""NVML device memory: the only module that imports ``pynvml`` (package ``nvidia-ml-py``).

Every call goes through one ``gateway.DriverLibrary``: NVML is initialised lazily, once, behind a
lock, and never creates a CUDA context; every query answers ``None`` instead of raising, and says
the first failure of each kind once. No NVML (a CPU box, a container without the driver library,
``pip install memexporter`` without the ``[nvml]`` extra) means no device series, not a failing
collector. NVML enumerates physical GPUs and ignores ``CUDA_VISIBLE_DEVICES``, so devices are
matched by UUID, never by index.

torch spells a UUID as bare hex; NVML prefixes ``GPU-`` for a GPU and ``MIG-`` for a MIG slice.
Both spellings are tried, then NVML's own list (MIG slices included) is searched for the hex.
What a device is (UUID, name, PCI bus id, MIG parent) is looked up once; its memory every scrape.

Memory is NVML's v2 answer (``nvmlDeviceGetMemoryInfo_v2``, what ``nvidia-smi`` shows): ``used``
without the driver's own reservation, which comes apart as ``reserved`` (615 MiB on an H200). v1's
``used`` counts the reservation, so an idle GPU reads hundreds of MiB used. ``total`` and ``free`` are
the same in both. A driver or nvidia-ml-py without v2 gets v1, said once, and no reserved figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

from memexporter.backends.base import DeviceIdentity, DeviceMemory, ProcessMemory
from memexporter.backends.gateway import DriverLibrary

__all__ = ["NvmlBackend"]


@dataclass(frozen=True)
class _Device:
    handle: Any
    identity: DeviceIdentity


def _load() -> ModuleType:
    import pynvml

    pynvml.nvmlInit()
    lib: ModuleType = pynvml  # untyped: the package ships no stubs
    return lib


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
    """Lazy, failure-tolerant NVML access (a ``DriverSource``). Sizes in bytes."""

    def __init__(self) -> None:
        self._nvml: DriverLibrary[_Device] = DriverLibrary(
            "NVML",
            _load,
            missing="no memexporter_device_* series (pip install memexporter[nvml] brings nvidia-ml-py)",
            not_available="NVML_VALUE_NOT_AVAILABLE",
        )

    def memory(self, uuid: str, index: int | None = None) -> DeviceMemory | None:
        """Identity and memory of the device torch calls ``uuid``, or ``None`` if NVML cannot say.
        ``index`` (torch's ordinal) is not used: NVML numbers the physical GPUs its own way."""
        device = self._device(uuid)
        if device is None:
            return None
        name = device.identity.uuid
        sizes = self._nvml.query_newer(
            f"memory:{uuid}",
            f"read the memory of {name}",
            lambda nvml: _memory_v2(nvml, device.handle),
            lambda nvml: _memory_v1(nvml, device.handle),
            _lacks_v2,
            f"gives no v2 memory info for {name}: memexporter_device_used_bytes is v1's, which counts "
            "the driver's reservation, and there is no memexporter_device_reserved_bytes",
        )
        return None if sizes is None else device.identity.with_memory(*sizes)

    def process_memory(self, uuid: str, pid: int) -> ProcessMemory | None:
        """Process ``pid``'s memory on the device torch calls ``uuid``; ``None`` without NVML or
        the device. One ``nvmlDeviceGetComputeRunningProcesses`` call (the driver's list, no
        context, no sync)."""
        device = self._device(uuid)
        if device is None:
            return None
        # nvidia-ml-py turns NVML_VALUE_NOT_AVAILABLE into None; a process listed on several
        # compute instances of one MIG slice has one entry each.
        listed = self._nvml.query(
            f"processes:{uuid}",
            f"list the processes on {device.identity.uuid}",  # NOT_SUPPORTED on some vGPU and older drivers
            lambda nvml: [
                (int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory))
                for p in nvml.nvmlDeviceGetComputeRunningProcesses(device.handle)
            ],
            costs=": no memexporter_device_process_used_bytes or _non_allocator_bytes for it",
        )
        if listed is None:
            return ProcessMemory(None, "error")
        return self._nvml.own_share(uuid, device.identity.uuid, listed, pid)

    def _device(self, uuid: str) -> _Device | None:
        return self._nvml.device(
            uuid,
            lambda nvml: self._lookup(nvml, uuid),
            f"no NVML device has UUID {uuid} (tried GPU-/MIG- and NVML's device list): "
            "no memexporter_device_* series for it",
        )

    def _lookup(self, nvml: ModuleType, uuid: str) -> _Device | None:
        handle = self._find(nvml, uuid)
        return None if handle is None else _Device(handle, self._describe(nvml, handle))

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

    def _describe(self, nvml: ModuleType, handle: Any) -> DeviceIdentity:
        """The device's identity; the optional parts (PCI, MIG parent) are empty when NVML cannot say.
        Raises when even its UUID or name cannot be read (the lookup is tried again next scrape)."""
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        name = _text(nvml.nvmlDeviceGetName(handle))
        # NOT_SUPPORTED before MIG existed (drivers < R450): a whole GPU, then.
        gpu, gpu_uuid, instance = self._nvml.query(
            f"mig:{uuid}", f"tell whether {uuid} is a MIG slice", lambda n: _mig_parent(n, handle, uuid)
        ) or (handle, uuid, "")
        pci = self._nvml.query(
            f"pci:{uuid}", f"give the PCI bus id of {uuid}", lambda n: _text(n.nvmlDeviceGetPciInfo(gpu).busId)
        )
        return DeviceIdentity(uuid, name, pci or "", gpu_uuid, instance)


def _memory_v2(nvml: ModuleType, handle: Any) -> tuple[int, int, int, int | None]:
    """``(total, used, free, reserved)`` from ``nvmlDeviceGetMemoryInfo_v2`` (``c_nvmlMemory_v2_t``):
    ``used`` without the driver's reservation, ``total = used + reserved + free``."""
    info = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
    return int(info.total), int(info.used), int(info.free), int(info.reserved)


def _memory_v1(nvml: ModuleType, handle: Any) -> tuple[int, int, int, int | None]:
    """``(total, used, free, None)`` from ``nvmlDeviceGetMemoryInfo`` (``c_nvmlMemory_t``): ``used``
    counts the driver's reservation, which v1 does not report apart."""
    info = nvml.nvmlDeviceGetMemoryInfo(handle)
    return int(info.total), int(info.used), int(info.free), None


def _lacks_v2(nvml: ModuleType, exc: Exception) -> bool:
    """Whether ``exc`` says that this driver or binding has no v2 memory info (not that a read failed).

    An nvidia-ml-py without it has no ``nvmlMemory_v2`` (AttributeError) and takes no ``version``
    (TypeError); a driver without the symbol (before R510) raises FUNCTION_NOT_FOUND from the
    binding's function lookup; one that cannot answer it for this device NOT_SUPPORTED; one that
    knows the call but not this struct version ARGUMENT_VERSION_MISMATCH.
    """
    if isinstance(exc, AttributeError | TypeError):
        return True
    names = ("NVMLError_FunctionNotFound", "NVMLError_NotSupported", "NVMLError_ArgumentVersionMismatch")
    return isinstance(exc, tuple(getattr(nvml, n) for n in names if hasattr(nvml, n)))


def _mig_parent(nvml: ModuleType, handle: Any, uuid: str) -> tuple[Any, str, str]:
    """``(the physical GPU's handle, its UUID, the GPU instance id)`` of a MIG slice; of a whole
    GPU, its own handle and UUID and no instance id (dcgm-exporter's ``UUID`` and ``GPU_I_ID``)."""
    if not nvml.nvmlDeviceIsMigDeviceHandle(handle):
        return handle, uuid, ""
    gpu = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
    return gpu, _text(nvml.nvmlDeviceGetUUID(gpu)), str(int(nvml.nvmlDeviceGetGpuInstanceId(handle)))
