"""AMD GPU device view: the only module that imports ``amdsmi`` (PyPI ``amdsmi``, ROCm's SMI library).

The allocator side of an AMD GPU is ``torch.cuda`` (ROCm's HIP build, ``backends/cuda.py``); this
is the driver's view NVML gives on NVIDIA: the card's VRAM total and use, its identity, and this
process's VRAM as the driver counts it. Lazy and optional like NVML: ``amdsmi`` is imported and
initialised on the first scrape that needs it, and its absence (the package, or ``libamd_smi.so``,
whose absence makes the import itself fail) means no ``memexporter_device_*`` series, said once.
Every call goes through one ``gateway.DriverLibrary``, as NVML's does.

amdsmi enumerates every GPU and ignores ``HIP_VISIBLE_DEVICES``, so devices are matched by identity,
never by index. On ROCm torch's UUID holds the ASCII of the KFD unique id (``GPU-`` stripped;
``str()`` shows its hex: ``62333961-...`` for ``b39adaf836600b31``), which amdsmi reports as the ASIC
serial (``0xB39ADAF836600B31``), torch's own way to join the two (``torch.cuda._raw_device_uuid_amdsmi``).
From ROCm 7.12 ``amdsmi_get_gpu_device_uuid`` may spell it directly; both are tried. A card
without a unique id (``GPU-XX``: many consumer and APU parts) cannot be matched: no series, said once.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

from memexporter.backends.base import DeviceIdentity, DeviceMemory, ProcessMemory
from memexporter.backends.gateway import DriverLibrary

__all__ = ["AmdSmiBackend", "unique_id"]


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
    identity: DeviceIdentity


def _load() -> ModuleType:
    import amdsmi  # without libamd_smi.so the import itself fails (OSError, KeyError)

    amdsmi.amdsmi_init()
    lib: ModuleType = amdsmi  # untyped: the package ships no stubs
    return lib


class AmdSmiBackend:
    """Lazy, failure-tolerant amdsmi access (a ``DriverSource``). Sizes in bytes."""

    def __init__(self) -> None:
        self._smi: DriverLibrary[_Device] = DriverLibrary(
            "amdsmi",
            _load,
            missing=(
                "no memexporter_device_* series "
                "(pip install memexporter[amdsmi] brings it; it needs ROCm's libamd_smi.so)"
            ),
            not_available="N/A",
        )

    def memory(self, uuid: str, index: int | None = None) -> DeviceMemory | None:
        """VRAM total and use of the card torch calls ``uuid``; ``None`` if amdsmi cannot say."""
        device = self._device(uuid)
        if device is None:
            return None
        sizes = self._smi.query(
            f"memory:{uuid}",
            f"read the VRAM of {device.identity.uuid}",
            lambda smi: (
                int(smi.amdsmi_get_gpu_memory_total(device.handle, smi.AmdSmiMemoryType.VRAM)),
                int(smi.amdsmi_get_gpu_memory_usage(device.handle, smi.AmdSmiMemoryType.VRAM)),
            ),
        )
        if sizes is None:
            return None
        total, used = sizes
        return device.identity.with_memory(total, used, max(0, total - used))

    def process_memory(self, uuid: str, pid: int) -> ProcessMemory | None:
        """Process ``pid``'s VRAM on the card (``memory_usage.vram_mem`` of its entry in
        ``amdsmi_get_gpu_process_list``); ``None`` without amdsmi or the card."""
        device = self._device(uuid)
        if device is None:
            return None
        listed = self._smi.query(
            f"processes:{uuid}",
            f"list the processes on {device.identity.uuid}",
            lambda smi: [
                (_int(e.get("pid")), _int((e.get("memory_usage") or {}).get("vram_mem")))
                for e in (_entry(smi, device.handle, p) for p in smi.amdsmi_get_gpu_process_list(device.handle))
            ],
            costs=": no memexporter_device_process_used_bytes or _non_allocator_bytes for it",
        )
        if listed is None:
            return ProcessMemory(None, "error")
        return self._smi.own_share(uuid, device.identity.uuid, listed, pid)

    def _device(self, uuid: str) -> _Device | None:
        return self._smi.device(
            uuid,
            lambda smi: self._find(smi, uuid),
            f"no amdsmi GPU matches torch's device {uuid} (by ASIC serial or UUID; a card without a "
            "unique id cannot be matched): no memexporter_device_* series for it",
        )

    def _find(self, smi: ModuleType, uuid: str) -> _Device | None:
        wanted = unique_id(uuid)
        for handle in smi.amdsmi_get_processor_handles():
            asic = dict(smi.amdsmi_get_gpu_asic_info(handle))
            amd_uuid = str(smi.amdsmi_get_gpu_device_uuid(handle))
            names = {_plain(asic.get("asic_serial", "")), _plain(amd_uuid)}
            if (wanted is not None and wanted in names) or _plain(uuid) in names:
                return _Device(handle, self._describe(handle, asic, amd_uuid))
        return None

    def _describe(self, handle: Any, asic: dict[str, Any], amd_uuid: str) -> DeviceIdentity:
        bdf = self._smi.query(
            f"bdf:{amd_uuid}",
            f"give the PCI address of {amd_uuid}",
            lambda smi: str(smi.amdsmi_get_gpu_device_bdf(handle)),
        )
        name = str(asic.get("market_name") or "")
        return DeviceIdentity(amd_uuid, "" if name == "N/A" else name, bdf or "", amd_uuid, vendor="amd")


def _entry(smi: ModuleType, handle: Any, item: Any) -> dict[str, Any]:
    # amdsmi before c551c3ca (ROCm 6.0/6.1) listed process handles, read one by one.
    return item if isinstance(item, dict) else dict(smi.amdsmi_get_gpu_process_info(handle, item))


def _int(value: object) -> int | None:
    """amdsmi's integers, or ``None`` for its ``"N/A"`` (and anything else that is no number)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None
