"""Apple silicon (MPS) memory, through ``torch.accelerator``: the only module that reads MPS memory.

torch 2.13 made the MPS allocator a ``c10::DeviceAllocator`` (pytorch/pytorch#186748), so
``torch.accelerator`` answers for it without creating anything: ``_accelerator_isAllocatorInitialized()``
says whether the job has used MPS, ``memory_stats()`` gives the allocator's figures in
``torch.cuda.memory_stats()``'s vocabulary and ``get_memory_info()`` the room under Metal's
``recommendedMaxWorkingSetSize``. MPS fills only the aggregate allocated and reserved bytes
(``MPSAllocator::getDeviceStats``); every other statistic in that dict reads zero whatever
happens, so only those two families are handed on: a zero that looks measured would be worse than
no series. Reserved is the allocator's heaps; ``torch.mps.driver_allocated_memory()`` (everything
Metal holds for the process, MPSGraph's own buffers too) is not read, because it creates the Metal
device on a process that has none.

The limit is the recommended working set less what Metal holds outside the allocator: past it
macOS pages the unified memory out and the job crawls, before the allocator's own cap
(``PYTORCH_MPS_HIGH_WATERMARK_RATIO`` times the working set, 1.7 by default) raises the OOM.
Before torch 2.13 the probe itself raises ("Allocator for mps is not a DeviceAllocator",
pytorch/pytorch#186430) and nothing else can tell without creating the Metal device: no mps
series, said once. No driver library: no ``memexporter_device_*`` series.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from memexporter.backends.base import ALLOCATOR_NATIVE, MPS, LogOnce, Reading, device_label

MEASURED = ("allocated_bytes.all.", "reserved_bytes.all.")  # the statistics MPS keeps


class MpsBackend:
    """Reads MPS through ``torch.accelerator`` once the job has used MPS. Bytes; one device, ``mps``."""

    family = MPS

    def __init__(self) -> None:
        self._log = LogOnce()

    def label(self, index: int) -> str:
        return device_label(MPS, index)

    def _initialized(self) -> bool:
        probe = getattr(torch._C, "_accelerator_isAllocatorInitialized", None)
        try:
            return probe is not None and bool(probe())
        except Exception as exc:  # torch before 2.13: the MPS allocator is no DeviceAllocator yet
            self._log.warning(
                "probe",
                "memexporter: torch %s cannot tell whether MPS is in use without creating the "
                "Metal device (%s); torch 2.13 can: no mps series",
                torch.__version__,
                exc,
            )
            return False

    def device_stats(self) -> dict[int, Mapping[str, int]]:
        """``{0: the allocated and reserved statistics}`` once the allocator holds memory."""
        if not self._initialized():
            return {}
        empty: dict[str, int] = {}
        stats = self._log.read(
            "stats",
            lambda: {k: int(v) for k, v in torch.accelerator.memory_stats(0).items() if k.startswith(MEASURED)},
            empty,
            "memexporter: torch.accelerator.memory_stats() failed on mps (%s): no mps series",
        )
        return {0: stats} if stats.get("reserved_bytes.all.peak", 0) > 0 else {}

    def devices_in_use(self) -> list[int]:
        return list(self.device_stats())

    def allocator_backend(self) -> str:
        return ALLOCATOR_NATIVE

    def expandable_segments(self) -> bool:
        """MPS's heaps are no caching-allocator segments."""
        return False

    def reading(self, index: int) -> Reading:
        """``used`` (allocated), its peak and the committed bytes (allocated: MPS reports no split
        blocks) for the step tracker; raises what torch raises."""
        if not self._initialized():
            return Reading(0, 0, 0)
        stats = torch.accelerator.memory_stats(0)
        used = int(stats.get("allocated_bytes.all.current", 0))
        return Reading(used, int(stats.get("allocated_bytes.all.peak", 0)), used)

    def uuid(self, index: int) -> str | None:
        return None  # Metal exposes no device UUID to torch; no driver library joins on one

    def total_memory(self, index: int) -> int | None:
        info = self.mem_get_info(index)
        return info[1] if info is not None else None

    def memory_fraction(self, index: int) -> float:
        return 1.0  # torch.mps has a setter only; the limit is the recommended working set

    def mem_get_info(self, index: int) -> tuple[int, int] | None:
        """``torch.accelerator.get_memory_info()``: ``(recommended working set - what Metal holds for
        the process, recommended working set)``; the scrape adds reserved back for the limit."""
        if not self._initialized():
            return None
        info = self._log.read(
            "mem_get_info",
            lambda: torch.accelerator.get_memory_info(0),
            None,
            "memexporter: torch.accelerator.get_memory_info() failed on mps (%s): no mps limit",
        )
        return None if info is None else (int(info[0]), int(info[1]))

    def host_pinned_stats(self) -> Mapping[str, float]:
        return {}  # unified memory: no pinned host pool

    def versions(self) -> tuple[str, str]:
        return str(torch.__version__), ""
