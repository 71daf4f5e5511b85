"""Intel GPU (XPU) memory: the only module that imports ``torch.xpu``.

The allocator side and the device view both come from torch. XPU's caching allocator keeps CUDA's
statistics in the same flat vocabulary (``torch.xpu.memory_stats()``: the four ``*_bytes``
families up to torch 2.10, nine families from 2.11; never the ``num_*`` counters). That dict is
read rather than ``torch.accelerator.memory_stats()``, which lists every statistic of every
allocator and reports the ones XPU does not keep as zeros: a missing key means no series here, a
zero would look measured. ``torch.xpu.mem_get_info`` answers Level Zero's free and total for the
device (torch 2.6 and later; integrated GPUs refuse it), the view NVML gives on NVIDIA. No
per-process figure: torch exposes none, so ``memexporter_device_process_used_bytes`` and
``_non_allocator_bytes`` are absent on XPU.

Observe, never initialise: every call first checks ``torch.xpu.is_initialized()`` (properties,
``mem_get_info`` and the fraction getter would initialise XPU otherwise), and calls that need a
device are made only for devices whose allocator has reserved memory. No method raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.xpu

from memexporter.backends.base import (
    ALLOCATOR_NATIVE,
    XPU,
    DeviceMemory,
    LogOnce,
    ProcessMemory,
    Reading,
    device_label,
    reading_of,
)


def _initialized() -> bool:
    return bool(torch.xpu.is_initialized())  # type: ignore[no-untyped-call]


def _uuid_text(raw: Any) -> str:
    """``_XpuDeviceProperties.uuid`` (a ``torch._C._XPUuuid``, torch 2.9 and later): its ``str()`` is
    the 8-4-4-4-12 hex of its 16 ``bytes``. Level Zero builds it from the vendor and device ids, so
    two cards of one model can share it: the device view is matched by ordinal (``memory``)."""
    return str(raw)


class XpuBackend:
    """Reads ``torch.xpu`` for initialised devices. All sizes are bytes. Also the XPU ``DriverSource``."""

    family = XPU

    def __init__(self) -> None:
        self._log = LogOnce()
        self._uuids: dict[int, str] = {}

    def label(self, index: int) -> str:
        return device_label(XPU, index)

    def device_stats(self) -> dict[int, Mapping[str, int]]:
        """``{ordinal: memory_stats(ordinal)}`` for the devices whose allocator reserved memory."""
        if not _initialized():
            return {}
        out: dict[int, Mapping[str, int]] = {}
        for index in range(torch.xpu.device_count()):
            stats: dict[str, int] = self._log.read(
                "stats",
                lambda: dict(torch.xpu.memory_stats(index)),  # noqa: B023 (called at once)
                {},
                "memexporter: torch.xpu.memory_stats(%d) failed (%s): no xpu allocator series",
                index,
            )
            if stats.get("reserved_bytes.all.peak", 0) > 0:
                out[index] = stats
        return out

    def devices_in_use(self) -> list[int]:
        return [index for index, stats in self.device_stats().items() if stats]

    def allocator_backend(self) -> str:
        """XPU has one caching allocator (a custom ``XPUPluggableAllocator`` aside): ``native``."""
        return ALLOCATOR_NATIVE

    def expandable_segments(self) -> bool:
        """XPU's caching allocator has no expandable segments."""
        return False

    def reading(self, index: int) -> Reading:
        """``used``, its peak and the committed bytes (``base.committed``: allocated plus the
        inactive split bytes that torch 2.11 and later report) from the nested dict (no
        flattening), for the step tracker. Raises what torch raises (the tracker counts it)."""
        if not _initialized():
            return Reading(0, 0, 0)
        return reading_of(torch.xpu.memory_stats_as_nested_dict(index), (ALLOCATOR_NATIVE, False))

    def uuid(self, index: int) -> str | None:
        """``get_device_properties(index).uuid`` as hex; ``None`` where torch has none (before 2.9)."""
        if index in self._uuids:
            return self._uuids[index]
        props = self._properties(index)
        raw = getattr(props, "uuid", None) if props is not None else None
        if raw is None:
            return None
        self._uuids[index] = text = _uuid_text(raw)
        return text

    def total_memory(self, index: int) -> int | None:
        props = self._properties(index)
        return int(props.total_memory) if props is not None else None

    def memory_fraction(self, index: int) -> float:
        """``torch.xpu.get_per_process_memory_fraction`` (torch 2.10 and later); 1.0 when unset or absent."""
        getter = getattr(torch.xpu, "get_per_process_memory_fraction", None)
        if getter is None or not _initialized():
            return 1.0
        return self._log.read(
            "fraction",
            lambda: float(getter(index)),
            1.0,
            "memexporter: torch.xpu.get_per_process_memory_fraction() failed (%s)",
        )

    def mem_get_info(self, index: int) -> tuple[int, int] | None:
        """``(free, total)`` of the device (Level Zero), for a device the allocator already uses."""
        if not _initialized():
            return None
        info = self._log.read(
            "mem_get_info",
            lambda: torch.xpu.mem_get_info(index),
            None,
            "memexporter: torch.xpu.mem_get_info(%d) failed (%s); the xpu limit is unknown",
            index,
        )
        return None if info is None else (int(info[0]), int(info[1]))

    def host_pinned_stats(self) -> Mapping[str, float]:
        """The pinned host caching allocator's counters where torch.xpu has them, else ``{}``."""
        getter = getattr(torch.xpu, "host_memory_stats", None)
        if getter is None or not _initialized():
            return {}
        return self._log.read(
            "host_stats", lambda: dict(getter()), {}, "memexporter: torch.xpu.host_memory_stats() failed (%s)"
        )

    def versions(self) -> tuple[str, str]:
        """``(torch.__version__, "")``: the build_info ``cuda_version`` label is empty on XPU."""
        return str(torch.__version__), ""

    # --- DriverSource: the device as Level Zero sees it, through torch.xpu. ---------------------

    def memory(self, uuid: str, index: int | None = None) -> DeviceMemory | None:
        """Device ``index`` (torch's ordinal, which Level Zero shares): its name, total and free."""
        if index is None:
            index = next((i for i, u in self._uuids.items() if u == uuid), None)
        props = self._properties(index) if index is not None else None
        info = self.mem_get_info(index) if index is not None else None
        if props is None or info is None:
            return None
        free, total = info
        return DeviceMemory(uuid, str(props.name), total, total - free, free, vendor="intel")

    def process_memory(self, uuid: str, pid: int) -> ProcessMemory | None:
        """Not measured on XPU (see the module's docstring): no series."""
        return None

    def _properties(self, index: int) -> Any:
        if not _initialized():
            return None
        return self._log.read(
            "props",
            lambda: torch.xpu.get_device_properties(index),
            None,
            "memexporter: torch.xpu.get_device_properties(%d) failed (%s)",
            index,
        )
