"""Stand-ins for torch.cuda's answers, replaying a fixture (``nvml_standin.py``: pynvml).

The answers come from a fixture (``tests/fixtures/synthetic/*.json``, made up; or
``tests/fixtures/recorded/*.json``, recorded on a GPU by ``tests/cuda/record_fixtures.py``).
Only what torch's C++ answers is stood in for, in the shape the INSTALLED torch's C++ gives it
(``memory_stats.reported``: torch 2.11 has no private pools, say), with the fixture's figures:
``torch._C._cuda_memoryStats`` and ``_cuda_hostMemoryStats``. So each torch's own Python
(``memory_stats()``, ``memory_stats_as_nested_dict()``, ``host_memory_stats()``: the device-index
checks, the flattening, the sorting) runs as it is, and a stand-in breaks where that torch changed.
``get_device_properties`` answers an object with the fields of ``torch._C._CudaDeviceProperties``
(``uuid`` a ``_CUuuid`` whose ``str()`` is bare hex, absent where that torch had none); the
fraction and ``mem_get_info``, which need a CUDA build to reach their C++, are stood in for whole.
Functions the fixture's torch lacked are removed from ``torch.cuda`` for the test.

The torch stand-in also models what creates a CUDA context: ``mem_get_info`` on a device without
one does (``cudaMemGetInfo`` under a device guard); reading stats, properties or the fraction
does not. ``TorchStandIn.contexts`` is what ``torch._C._cuda_hasPrimaryContext`` would answer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.cuda
import torch.cuda.memory

from tests.support.memory_stats import reported, unflatten, zeros_like

_ERRORS: dict[str, type[Exception]] = {
    "RuntimeError": RuntimeError,
    "AssertionError": AssertionError,
    "ValueError": ValueError,
    "OSError": OSError,
}


HOST_STATS = hasattr(torch.cuda, "host_memory_stats")
"""Whether the installed torch has ``torch.cuda.host_memory_stats()`` (2.6 on): before it, no stand-in can answer one."""


def installed() -> str:
    """The installed torch's version: the stand-ins answer in its shape (``torch.__version__`` is the
    fixture's while they stand in)."""
    return str(torch.version.__version__)


def as_installed_reports(flat: dict[str, int]) -> dict[str, int]:
    """A fixture's flat ``memory_stats()`` as the installed torch reports it (the stand-in's answer)."""
    return flat if "raises" in flat else reported(flat, installed())


RECORDED_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "recorded"


def recorded_files() -> list[Path]:
    """The answers recorded on a GPU: ``tests/fixtures/recorded/*.json``, the top level only
    (folders below, such as ``traces/``, hold other records: per-step traces)."""
    return sorted(p for p in RECORDED_DIR.glob("*.json") if p.is_file())


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def replay(value: Any) -> Any:
    """The value, or raise what the fixture says the call raised (``{"raises": "Type: message"}``)."""
    if isinstance(value, dict) and "raises" in value:
        kind, _, message = value["raises"].partition(": ")
        raise _ERRORS.get(kind, RuntimeError)(message)
    return value


class CUuuid:
    """``torch._C._CUuuid``: ``str()`` is the 8-4-4-4-12 hex of ``.bytes`` (Module.cpp ``uuid_to_string``)."""

    def __init__(self, text: str) -> None:
        self.bytes = list(bytes.fromhex(text.replace("-", "")))

    def __str__(self) -> str:
        h = bytes(self.bytes).hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class DeviceProperties:
    """``torch._C._CudaDeviceProperties``' fields; ``uuid`` only where that torch had one."""

    def __init__(self, fields: dict[str, Any]) -> None:
        for key, value in fields.items():
            setattr(self, key, CUuuid(value) if key == "uuid" else value)


class TorchStandIn:
    """torch.cuda as the fixture's process saw it. ``calls`` lists ``(function, device)``."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, int]] = []
        self.contexts = {int(i) for i, d in answers["devices"].items() if d.get("has_primary_context")}

    def device(self, index: int) -> dict[str, Any]:
        if str(index) in self.answers["devices"]:
            return self.answers["devices"][str(index)]  # type: ignore[no-any-return]
        # A visible device the process never used: a fresh allocator, no context.
        first = next(iter(self.answers["devices"].values()))
        stats = first["memory_stats"]
        total = first["properties"]["total_memory"]
        return {
            "properties": first["properties"],
            "memory_fraction": 1.0,
            "mem_get_info": [total, total],
            "memory_stats": zeros_like(stats) if "raises" not in stats else stats,
        }

    def _call(self, name: str, device: Any) -> dict[str, Any]:
        index = int(device)
        if not 0 <= index < self.answers["device_count"]:
            raise AssertionError("Invalid device id")
        self.calls.append((name, index))
        return self.device(index)

    def install(self, mp: pytest.MonkeyPatch) -> TorchStandIn:
        a = self.answers

        def memory_stats(device: int) -> dict[Any, Any]:  # THCPModule_memoryStats
            return unflatten(as_installed_reports(replay(self._call("memory_stats", device)["memory_stats"])))

        def mem_get_info(device: Any = None) -> tuple[int, int]:
            answer = self._call("mem_get_info", device)
            self.contexts.add(int(device))  # cudaMemGetInfo under a device guard creates the context
            free, total = replay(answer["mem_get_info"])
            return int(free), int(total)

        initialized = lambda: a.get("initialized", True)  # noqa: E731
        mp.setattr(torch.cuda, "is_initialized", initialized)
        mp.setattr(torch.cuda.memory, "is_initialized", initialized)  # memory.py's own import of it
        mp.setattr(torch.cuda, "device_count", lambda: a["device_count"])
        mp.setattr(torch._C, "_cuda_memoryStats", memory_stats, raising=False)  # absent from a CPU build
        mp.setattr(
            torch.cuda,
            "get_device_properties",
            lambda device=None: DeviceProperties(self._call("get_device_properties", device)["properties"]),
        )
        mp.setattr(torch.cuda, "mem_get_info", mem_get_info)
        mp.setattr(torch._C, "_cuda_hasPrimaryContext", lambda i: i in self.contexts, raising=False)
        if a["allocator_backend"] is None:  # torch before get_allocator_backend()
            mp.delattr(torch.cuda, "get_allocator_backend", raising=False)
        else:
            mp.setattr(torch.cuda, "get_allocator_backend", lambda: a["allocator_backend"])
        if all(d.get("memory_fraction") is None for d in a["devices"].values()):  # torch before the getter
            mp.delattr(torch.cuda, "get_per_process_memory_fraction", raising=False)
        else:
            mp.setattr(
                torch.cuda,
                "get_per_process_memory_fraction",
                lambda device=None: float(
                    replay(self._call("get_per_process_memory_fraction", device)["memory_fraction"])
                ),
            )
        if "host_memory_stats" in a:  # torch's host_memory_stats() (2.6 on) flattens this, when initialised
            mp.setattr(torch._C, "_cuda_hostMemoryStats", lambda: unflatten(a["host_memory_stats"]), raising=False)
        else:  # the fixture's torch was before 2.6
            mp.delattr(torch.cuda, "host_memory_stats", raising=False)
        mp.setattr(torch, "__version__", a["torch_version"])
        mp.setattr(torch.version, "cuda", a["cuda_version"])
        mp.setattr(torch.version, "hip", a.get("hip_version"))  # ROCm's build: set, and cuda None
        return self


def no_nvml(mp: pytest.MonkeyPatch) -> None:
    """``pip install memexporter`` without the ``[nvml]`` extra: ``import pynvml`` fails."""
    mp.setitem(sys.modules, "pynvml", None)
