"""Stand-ins for torch.xpu and for torch.accelerator on an MPS build, replaying a SYNTHETIC fixture
(``tests/fixtures/synthetic/arc_b60_xpu_*.json``, ``m4_max_mps_*.json``), as ``cuda_standins.py``
does for torch.cuda: only the C-level answers are stood in for, so torch's own Python (the
flattening and sorting of ``torch.xpu.memory_stats`` and ``torch.accelerator.memory_stats``, the
device-index checks) still runs. ``answers`` stay mutable: a test that changes them (a leak) is
answered the new figures on the next call.

What raises is what torch raises: ``mem_get_info`` on an integrated XPU ("doesn't support querying
the available free memory", pytorch/pytorch#194487), and the allocator probe on an MPS build
before torch 2.13 ("Allocator for mps is not a DeviceAllocator", pytorch/pytorch#186430). What the
installed torch lacks is not stood in for: its tests skip under that torch (``XPU_FRACTION``,
``ACCELERATOR_STATS``), as a user of that torch gets no such figure.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.xpu
import torch.xpu.memory

from tests.support.cuda_standins import DeviceProperties, replay
from tests.support.memory_stats import unflatten

XPU_FRACTION = hasattr(torch.xpu, "get_per_process_memory_fraction")
"""Whether the installed torch has ``torch.xpu.get_per_process_memory_fraction()`` (2.10 on)."""
ACCELERATOR_STATS = hasattr(torch, "accelerator") and hasattr(torch.accelerator, "memory_stats")
"""Whether the installed torch has ``torch.accelerator.memory_stats()`` (2.9 on): MPS is read through it."""

IGPU_FREE_MEMORY = (
    "RuntimeError: The device (Intel(R) Graphics [0xb080]) doesn't support querying the available free "
    "memory. You can file an issue at https://github.com/pytorch/pytorch/issues to help us prioritize "
    "its implementation."
)
MPS_BEFORE_2_13 = (
    'RuntimeError: device_allocator INTERNAL ASSERT FAILED at "/Users/runner/work/pytorch/pytorch/pytorch/'
    'c10/core/CachingDeviceAllocator.h":253, please report a bug to PyTorch. Allocator for mps is not a '
    "DeviceAllocator."
)


class XpuStandIn:
    """torch.xpu as the fixture's process saw it. ``calls`` lists ``(function, device)``."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, int]] = []

    def _device(self, name: str, device: Any) -> dict[str, Any]:
        index = int(device)
        if not 0 <= index < self.answers["device_count"]:
            raise RuntimeError("Invalid device index")
        self.calls.append((name, index))
        return self.answers["devices"][str(index)]  # type: ignore[no-any-return]

    def install(self, mp: pytest.MonkeyPatch) -> XpuStandIn:
        a = self.answers

        def nested(device: Any = None) -> dict[Any, Any]:
            if not a["initialized"]:  # torch.xpu.memory_stats_as_nested_dict's own guard
                return {}
            return unflatten(replay(self._device("memory_stats", device)["memory_stats"]))

        def mem_get_info(device: Any = None) -> tuple[int, int]:
            free, total = replay(self._device("mem_get_info", device)["mem_get_info"])
            return int(free), int(total)

        mp.setattr(torch.xpu, "is_initialized", lambda: a["initialized"])
        mp.setattr(torch.xpu, "device_count", lambda: a["device_count"])
        mp.setattr(torch.xpu.memory, "memory_stats_as_nested_dict", nested)  # torch.xpu.memory_stats calls it
        mp.setattr(torch.xpu, "memory_stats_as_nested_dict", nested)
        mp.setattr(
            torch.xpu,
            "get_device_properties",
            lambda device=None: DeviceProperties(self._device("get_device_properties", device)["properties"]),
        )
        mp.setattr(torch.xpu, "mem_get_info", mem_get_info)
        if XPU_FRACTION:  # before it, the installed torch has no getter to answer for
            mp.setattr(
                torch.xpu,
                "get_per_process_memory_fraction",
                lambda device=None: float(
                    replay(self._device("get_per_process_memory_fraction", device)["memory_fraction"])
                ),
            )
        mp.setattr(torch, "__version__", a["torch_version"])
        return self


class MpsStandIn:
    """torch.accelerator's C-level calls on an MPS build, as the fixture says."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    def install(self, mp: pytest.MonkeyPatch) -> MpsStandIn:
        a = self.answers

        def initialized() -> bool:
            self.calls.append("isAllocatorInitialized")
            return bool(replay(a["allocator_initialized"]))

        def stats(index: int) -> dict[Any, Any]:
            self.calls.append("getDeviceStats")
            if index != 0:
                raise RuntimeError(f"Invalid device index {index}")
            return unflatten(a["memory_stats"])

        def info(index: int) -> tuple[int, int]:
            self.calls.append("getMemoryInfo")
            free, total = a["memory_info"]
            return int(free), int(total)

        mp.setattr(torch._C, "_accelerator_isAllocatorInitialized", initialized, raising=False)
        mp.setattr(torch._C, "_accelerator_getDeviceStats", stats, raising=False)
        mp.setattr(torch._C, "_accelerator_getMemoryInfo", info, raising=False)
        mp.setattr(torch, "__version__", a["torch_version"])
        return self
