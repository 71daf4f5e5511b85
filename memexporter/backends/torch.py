"""CUDA caching-allocator access: the only module that imports ``torch.cuda``.

Observe, never initialise: every call first checks ``torch.cuda.is_initialized()`` and answers
empty when CUDA is not in use, so the exporter never creates a CUDA context on its own (a context
costs hundreds of MiB and cannot be freed). Every call names its device explicitly, because the
scrape thread does not inherit the training thread's current device.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.cuda


def _initialized() -> bool:
    # Untyped in torch's stubs. True once the process itself has initialised CUDA.
    return bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


class TorchBackend:
    """Reads ``torch.cuda`` for initialised devices. All sizes are bytes."""

    def device_stats(self) -> dict[int, Mapping[str, int]]:
        """``{ordinal: memory_stats(ordinal)}`` for devices the allocator has reserved memory on.

        One ``memory_stats()`` call per visible device (host-side counters: no context, no sync),
        and the answer is the scrape's copy, so no device is read twice. Devices the process never
        touched are left out: a rank that trains on ``cuda:3`` reports one device, not eight.
        ``{}`` when CUDA is not initialised.
        """
        if not _initialized():
            return {}
        out: dict[int, Mapping[str, int]] = {}
        for index in range(torch.cuda.device_count()):
            stats = torch.cuda.memory_stats(index)
            if stats.get("reserved_bytes.all.peak", 0) > 0:
                out[index] = stats
        return out

    def cuda_devices(self) -> list[int]:
        """Ordinals of the devices in use (see ``device_stats``)."""
        return list(self.device_stats())

    def allocated(self, index: int) -> tuple[int, int]:
        """``(allocated_bytes.all.current, allocated_bytes.all.peak)`` for the step tracker.

        Runs on the training thread several times a step, so it takes the nested dict that
        ``memory_stats()`` would flatten and sort (~150 keys) and reads the two numbers it needs.
        """
        if not _initialized():
            return 0, 0
        alloc = torch.cuda.memory_stats_as_nested_dict(index).get("allocated_bytes", {}).get("all", {})
        return int(alloc.get("current", 0)), int(alloc.get("peak", 0))

    def uuid(self, index: int) -> str | None:
        """The device UUID as NVML spells it (``GPU-xxxxxxxx-...``), from ``get_device_properties``."""
        if not _initialized():
            return None
        raw = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
        if not raw:
            return None
        # torch prints the bare hex UUID; NVML and CUDA_VISIBLE_DEVICES prefix it with GPU-/MIG-.
        return raw if raw.startswith(("GPU-", "MIG-")) else f"GPU-{raw}"

    def total_memory(self, index: int) -> int:
        """``get_device_properties(index).total_memory``; 0 when CUDA is not initialised."""
        if not _initialized():
            return 0
        return int(torch.cuda.get_device_properties(index).total_memory)

    def memory_fraction(self, index: int) -> float:
        """The cap set by ``set_per_process_memory_fraction`` (1.0 when unset or unknown)."""
        getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        if getter is None or not _initialized():
            return 1.0
        return float(getter(index))

    def mem_get_info(self, index: int) -> tuple[int, int] | None:
        """``(free, total)`` from ``cudaMemGetInfo``, only for a device the allocator already uses.

        ``mem_get_info`` creates a context on a device that has none, so it is only a fallback
        for NVML and only called for devices listed by ``cuda_devices()``.
        """
        if not _initialized():
            return None
        free, total = torch.cuda.mem_get_info(index)
        return int(free), int(total)

    def versions(self) -> tuple[str, str]:
        """``(torch.__version__, torch.version.cuda or "")``."""
        return str(torch.__version__), str(torch.version.cuda or "")
