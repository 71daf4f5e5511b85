"""Which backends this process gets: the caching allocator of its accelerator, and the driver
library that sees the same devices.

torch is built for one accelerator: ``torch.accelerator.current_accelerator()`` names it from the
build alone (torch 2.6 and later: no device is touched, fork is not poisoned). Without that API the
build's version strings and ``torch.backends.mps.is_built()`` tell. ROCm's HIP build answers
through ``torch.cuda``: its allocator backend is ``TorchBackend``, its driver library amdsmi.

Each backend module is imported only for its family, so a job pays only for its own device's
libraries, and a CPU-only job for none (``tests/integration/test_no_device_libraries.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from memexporter.backends.base import CUDA, MPS, XPU, AllocatorSource, DeviceMemory, DriverSource, ProcessMemory


def family() -> str:
    """``cuda`` (NVIDIA and ROCm), ``xpu`` or ``mps``: the accelerator torch was built for. ``cuda``
    on a CPU-only build, whose ``torch.cuda`` answers nothing until CUDA is initialised."""
    accelerator = getattr(torch, "accelerator", None)
    current = getattr(accelerator, "current_accelerator", None)
    if current is not None:
        try:
            device = current(check_available=False)
        except Exception:  # a build whose accelerator hook fails: the version strings still tell
            device = None
        if device is not None and device.type in (CUDA, XPU, MPS):
            return str(device.type)
    if torch.version.cuda or getattr(torch.version, "hip", None):
        return CUDA
    if getattr(torch.version, "xpu", None):
        return XPU
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_built():
        return MPS
    return CUDA


def is_rocm() -> bool:
    """Whether torch is ROCm's HIP build (``torch.version.hip`` set, e.g. ``6.4.43482-0f2d60242``)."""
    return bool(getattr(torch.version, "hip", None))


class NoDriver:
    """No driver library for this family (Apple's MPS): no ``memexporter_device_*`` series."""

    def memory(self, uuid: str, index: int | None = None) -> DeviceMemory | None:
        return None

    def process_memory(self, uuid: str, pid: int) -> ProcessMemory | None:
        return None


def backends(kind: str | None = None) -> tuple[AllocatorSource, DriverSource]:
    """``(allocator, driver)`` for the family ``kind`` (default: ``family()``)."""
    kind = kind or family()
    allocator: Any
    if kind == XPU:
        from memexporter.backends.xpu import XpuBackend

        allocator = XpuBackend()
        return allocator, allocator  # torch.xpu answers the device view too: Level Zero's free/total
    if kind == MPS:
        from memexporter.backends.mps import MpsBackend

        return MpsBackend(), NoDriver()
    from memexporter.backends.cuda import TorchBackend

    if is_rocm():
        from memexporter.backends.amdsmi import AmdSmiBackend

        return TorchBackend(), AmdSmiBackend()
    from memexporter.backends.nvml import NvmlBackend

    return TorchBackend(), NvmlBackend()
