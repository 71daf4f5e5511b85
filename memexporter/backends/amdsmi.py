"""AMD GPU device view: the only module that imports ``amdsmi`` (PyPI ``amdsmi``, ROCm's SMI library).

The allocator side of an AMD GPU is ``torch.cuda`` (ROCm's HIP build, ``backends/cuda.py``); this
is the driver's view NVML gives on NVIDIA: the card's VRAM total and use, its identity, and this
process's VRAM as the driver counts it. Lazy and optional like NVML: ``amdsmi`` is imported and
initialised on the first scrape that needs it, and its absence (the package, or ``libamd_smi.so``,
whose absence makes the import itself fail) means no ``memexporter_device_*`` series, said once.

amdsmi enumerates every GPU and ignores ``HIP_VISIBLE_DEVICES``, so devices are matched by identity,
never by index. On ROCm torch's UUID holds the ASCII of the KFD unique id (``GPU-`` stripped;
``str()`` shows its hex: ``62333961-...`` for ``b39adaf836600b31``), which amdsmi reports as the ASIC
serial (``0xB39ADAF836600B31``), torch's own way to join the two (``torch.cuda._raw_device_uuid_amdsmi``).
From ROCm 7.12 ``amdsmi_get_gpu_device_uuid`` may spell it directly; both are tried. A card
without a unique id (``GPU-XX``: many consumer and APU parts) cannot be matched: no series, said once.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from memexporter.backends.base import DeviceMemory, LogOnce, ProcessMemory

log = logging.getLogger("memexporter")


def unique_id(torch_uuid: str) -> str | None:
    """The KFD unique id behind torch's ROCm UUID (``62333961-6461-...`` -> ``b39adaf836600b31``),
    lowercase; ``None`` when it is no usable id (``XX``, not ASCII hex)."""
    try:
        text = bytes.fromhex(torch_uuid.replace("-", "")).rstrip(b"\0").decode("ascii").lower()
    except (ValueError, UnicodeDecodeError):
        return None
    return text if len(text) >= 8 and all(c in "0123456789abcdef" for c in text) else None


def _plain(text: object) -> str:
    return str(text).strip().lower().removeprefix("gpu-").removeprefix("0x").replace("-", "")


@dataclass(frozen=True)
class _Device:
    handle: Any
    identity: DeviceMemory  # sizes zero: filled per scrape


class AmdSmiBackend:
    """Lazy, failure-tolerant amdsmi access (a ``DriverSource``). Sizes in bytes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lib: ModuleType | None = None
        self._tried = False
        self._devices: dict[str, _Device | None] = {}  # torch's UUID -> the amdsmi device, or None
        self._log = LogOnce()

    def _amdsmi(self) -> ModuleType | None:
        with self._lock:
            if not self._tried:
                self._tried = True
                try:
                    import amdsmi

                    amdsmi.amdsmi_init()
                    self._lib = amdsmi
                except Exception as exc:  # ImportError, OSError/KeyError without libamd_smi.so, AmdSmiLibraryException
                    log.info(
                        "memexporter: amdsmi unavailable (%s); no memexporter_device_* series "
                        "(pip install memexporter[amdsmi] brings it; it needs ROCm's libamd_smi.so)",
                        exc,
                    )
            return self._lib

    def memory(self, uuid: str, index: int | None = None) -> DeviceMemory | None:
        """VRAM total and use of the card torch calls ``uuid``; ``None`` if amdsmi cannot say."""
        smi = self._amdsmi()
        device = self._device(smi, uuid) if smi is not None else None
        if smi is None or device is None:
            return None
        try:
            total = int(smi.amdsmi_get_gpu_memory_total(device.handle, smi.AmdSmiMemoryType.VRAM))
            used = int(smi.amdsmi_get_gpu_memory_usage(device.handle, smi.AmdSmiMemoryType.VRAM))
        except Exception as exc:
            self._log.warning(
                f"memory:{uuid}", "memexporter: amdsmi cannot read the VRAM of %s (%s)", device.identity.uuid, exc
            )
            return None
        d = device.identity
        return DeviceMemory(d.uuid, d.name, total, used, max(0, total - used), d.pci_bus_id, d.gpu_uuid, vendor="amd")

    def process_memory(self, uuid: str, pid: int) -> ProcessMemory | None:
        """Process ``pid``'s VRAM on the card (``memory_usage.vram_mem`` of its entry in
        ``amdsmi_get_gpu_process_list``); ``None`` without amdsmi or the card."""
        smi = self._amdsmi()
        device = self._device(smi, uuid) if smi is not None else None
        if smi is None or device is None:
            return None
        name = device.identity.uuid
        try:
            listed = [self._entry(smi, device.handle, p) for p in smi.amdsmi_get_gpu_process_list(device.handle)]
        except Exception as exc:
            self._log.warning(
                f"processes:{uuid}",
                "memexporter: amdsmi cannot list the processes on %s (%s): no "
                "memexporter_device_process_used_bytes or _non_allocator_bytes for it",
                name,
                exc,
            )
            return ProcessMemory(None, "error")
        mine = [p for p in listed if _int(p.get("pid")) == pid]
        if not mine:
            self._log.warning(
                f"hidden:{uuid}",
                "memexporter: amdsmi lists %d process(es) on %s, none with this "
                "process's PID %d: a container's PID namespace hides it from the driver (run with the "
                "host's PID namespace to measure it). memexporter_device_process_used_bytes is NaN, "
                "_non_allocator_bytes absent",
                len(listed),
                name,
                pid,
            )
            return ProcessMemory(None, "hidden")
        vram = [_int((p.get("memory_usage") or {}).get("vram_mem")) for p in mine]
        if any(v is None for v in vram):
            self._log.warning(
                f"na:{uuid}",
                "memexporter: amdsmi lists this process on %s without its VRAM (N/A): "
                "memexporter_device_process_used_bytes is NaN",
                name,
            )
            return ProcessMemory(None, "not_available")
        return ProcessMemory(sum(v for v in vram if v is not None))

    @staticmethod
    def _entry(smi: ModuleType, handle: Any, item: Any) -> dict[str, Any]:
        # amdsmi before c551c3ca (ROCm 6.0/6.1) listed process handles, read one by one.
        return item if isinstance(item, dict) else dict(smi.amdsmi_get_gpu_process_info(handle, item))

    def _device(self, smi: ModuleType, uuid: str) -> _Device | None:
        with self._lock:
            if uuid in self._devices:
                return self._devices[uuid]
        try:
            device = self._find(smi, uuid)
        except Exception as exc:  # a library error, not an answer: try again next scrape
            self._log.warning(f"find:{uuid}", "memexporter: amdsmi lookup of device %s failed (%s)", uuid, exc)
            return None
        if device is None:
            self._log.warning(
                f"find:{uuid}",
                "memexporter: no amdsmi GPU matches torch's device %s (by ASIC serial "
                "or UUID; a card without a unique id cannot be matched): no memexporter_device_* "
                "series for it",
                uuid,
            )
        with self._lock:
            self._devices[uuid] = device
        return device

    def _find(self, smi: ModuleType, uuid: str) -> _Device | None:
        wanted = unique_id(uuid)
        for handle in smi.amdsmi_get_processor_handles():
            asic = dict(smi.amdsmi_get_gpu_asic_info(handle))
            amd_uuid = str(smi.amdsmi_get_gpu_device_uuid(handle))
            names = {_plain(asic.get("asic_serial", "")), _plain(amd_uuid)}
            if (wanted is not None and wanted in names) or _plain(uuid) in names:
                return _Device(handle, self._describe(smi, handle, asic, amd_uuid))
        return None

    def _describe(self, smi: ModuleType, handle: Any, asic: dict[str, Any], amd_uuid: str) -> DeviceMemory:
        try:
            bdf = str(smi.amdsmi_get_gpu_device_bdf(handle))
        except Exception as exc:
            self._log.warning(f"bdf:{amd_uuid}", "memexporter: amdsmi has no PCI address for %s (%s)", amd_uuid, exc)
            bdf = ""
        name = str(asic.get("market_name") or "")
        return DeviceMemory(amd_uuid, "" if name == "N/A" else name, 0, 0, 0, bdf, amd_uuid, vendor="amd")


def _int(value: object) -> int | None:
    """amdsmi's integers, or ``None`` for its ``"N/A"`` (and anything else that is no number)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None
