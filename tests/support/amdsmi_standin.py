"""A stand-in ``amdsmi`` module replaying a SYNTHETIC fixture's ``amdsmi`` answers (``nvml_standin.py``
does the same for pynvml). Shaped as amdsmi 7.0.2's ``amdsmi_interface.py`` answers: processor
handles are opaque objects, ``amdsmi_get_gpu_asic_info`` a dict of strings (``asic_serial``
``0x%016X``), memory figures ints in bytes, the process list a list of dicts whose figures may be
``"N/A"``; errors are ``AmdSmiLibraryException(err_code)`` with amdsmi's ``__str__``, and the status
codes amdsmi_wrapper's ints (no ``AmdSmiRetCode`` class exists)."""

from __future__ import annotations

import enum
import os
import sys
import types
from typing import Any

import pytest

AMDSMI_STATUS_NOT_SUPPORTED, AMDSMI_STATUS_NO_PERM, AMDSMI_STATUS_NOT_FOUND = 2, 10, 31
_INFO = {
    2: "AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported",
    10: "AMDSMI_STATUS_NO_PERM - Permission Denied",
    31: "AMDSMI_STATUS_NOT_FOUND - Device Not found",
}


class AmdSmiException(Exception):
    """amdsmi_exception.AmdSmiException: the base of the library's errors."""


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        super().__init__(err_code)
        self.err_code = abs(err_code)
        self.err_info = _INFO.get(self.err_code, "AMDSMI_STATUS_UNKNOWN_ERROR - An unknown error occurred")

    def get_error_code(self) -> int:
        return self.err_code

    def get_error_info(self) -> str:
        return self.err_info

    def __str__(self) -> str:
        return f"Error code:\n\t{self.err_code} | {self.err_info}"


class AmdSmiMemoryType(enum.IntEnum):
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


class _Handle:
    """An opaque processor handle (amdsmi's ``processor_handle``, a ctypes pointer)."""

    def __init__(self, gpu: dict[str, Any]) -> None:
        self.gpu = gpu


class AmdSmiStandIn:
    """``fails``: function name -> status code it raises with (``AmdSmiLibraryException``)."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.fails: dict[str, int] = {}
        self.initialised = 0

    def _check(self, name: str) -> None:
        if name in self.fails:
            raise AmdSmiLibraryException(self.fails[name])

    def module(self) -> types.ModuleType:
        m = types.ModuleType("amdsmi")
        m.AmdSmiException = AmdSmiException  # type: ignore[attr-defined]
        m.AmdSmiLibraryException = AmdSmiLibraryException  # type: ignore[attr-defined]
        m.AmdSmiMemoryType = AmdSmiMemoryType  # type: ignore[attr-defined]

        def init(flag: int = 1) -> None:
            self._check("amdsmi_init")
            self.initialised += 1

        def handles() -> list[_Handle]:
            self._check("amdsmi_get_processor_handles")
            return [_Handle(g) for g in self.answers["gpus"]]

        def memory(key: str) -> Any:
            def read(h: _Handle, kind: AmdSmiMemoryType) -> int:
                self._check(f"amdsmi_get_gpu_memory_{key}")
                if kind != AmdSmiMemoryType.VRAM:
                    raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
                return int(h.gpu["memory"][f"vram_{key.replace('usage', 'used')}"])

            return read

        def processes(h: _Handle) -> list[dict[str, Any]]:
            self._check("amdsmi_get_gpu_process_list")
            return [{**p, "pid": os.getpid() if p["pid"] == "self" else p["pid"]} for p in h.gpu["processes"]]

        def simple(name: str, field: str) -> Any:
            def read(h: _Handle) -> Any:
                self._check(name)
                value = h.gpu[field]
                return dict(value) if isinstance(value, dict) else value

            return read

        m.amdsmi_init = init  # type: ignore[attr-defined]
        m.amdsmi_shut_down = lambda: None  # type: ignore[attr-defined]
        m.amdsmi_get_processor_handles = handles  # type: ignore[attr-defined]
        m.amdsmi_get_gpu_asic_info = simple("amdsmi_get_gpu_asic_info", "asic_info")  # type: ignore[attr-defined]
        m.amdsmi_get_gpu_device_uuid = simple("amdsmi_get_gpu_device_uuid", "uuid")  # type: ignore[attr-defined]
        m.amdsmi_get_gpu_device_bdf = simple("amdsmi_get_gpu_device_bdf", "bdf")  # type: ignore[attr-defined]
        m.amdsmi_get_gpu_memory_total = memory("total")  # type: ignore[attr-defined]
        m.amdsmi_get_gpu_memory_usage = memory("usage")  # type: ignore[attr-defined]
        m.amdsmi_get_gpu_process_list = processes  # type: ignore[attr-defined]
        return m

    def install(self, mp: pytest.MonkeyPatch) -> AmdSmiStandIn:
        mp.setitem(sys.modules, "amdsmi", self.module())
        return self


def no_amdsmi(mp: pytest.MonkeyPatch) -> None:
    """No ``amdsmi`` package (or its import failing for want of libamd_smi.so)."""
    mp.setitem(sys.modules, "amdsmi", None)
