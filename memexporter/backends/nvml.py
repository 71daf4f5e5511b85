"""NVML device memory: the only module that imports ``pynvml`` (package ``nvidia-ml-py``).

NVML is initialised lazily, once, behind a lock, and never creates a CUDA context. Every query
answers ``None`` instead of raising: no NVML (a CPU box, a container without the driver library)
means no device series, not a failing collector. NVML enumerates physical GPUs and ignores
``CUDA_VISIBLE_DEVICES``, so devices are looked up by UUID, never by index.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from types import ModuleType

log = logging.getLogger("memexporter")


@dataclass(frozen=True)
class NvmlMemory:
    """One device as NVML reports it. Sizes in bytes (``nvmlDeviceGetMemoryInfo``)."""

    uuid: str
    name: str
    total: int
    used: int
    free: int


class NvmlBackend:
    """Lazy, failure-tolerant NVML access."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nvml: ModuleType | None = None
        self._tried = False

    def _lib(self) -> ModuleType | None:
        with self._lock:
            if not self._tried:
                self._tried = True
                try:
                    import pynvml

                    pynvml.nvmlInit()
                    self._nvml = pynvml
                except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, driver mismatch...
                    log.info("memexporter: NVML unavailable (%s); no memexporter_device_* series", exc)
            return self._nvml

    def memory(self, uuid: str) -> NvmlMemory | None:
        """Memory of the device with this UUID (``GPU-...``), or ``None`` if NVML cannot say."""
        nvml = self._lib()
        if nvml is None:
            return None
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            name = nvml.nvmlDeviceGetName(handle)
        except Exception:
            return None
        name = name.decode() if isinstance(name, bytes) else str(name)
        return NvmlMemory(uuid=uuid, name=name, total=int(info.total), used=int(info.used), free=int(info.free))
