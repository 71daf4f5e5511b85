"""The driver-library gateway (memexporter/backends/gateway.py): lazy, error to ``None``, said once.

The library here is a plain module object with a couple of functions: the gateway never looks
inside it, it only passes it to the caller's function, so no NVML or amdsmi shape is needed.
"""

from __future__ import annotations

import logging
import types

import pytest

from memexporter.backends.base import ProcessMemory
from memexporter.backends.gateway import DriverLibrary


class Calls:
    """A loader that counts its calls and can fail."""

    def __init__(self, fail: bool = False) -> None:
        self.loads = 0
        self.fail = fail

    def load(self) -> types.ModuleType:
        self.loads += 1
        if self.fail:
            raise ImportError("No module named 'pynvml'")
        lib = types.ModuleType("standin")
        lib.answer = lambda: 42  # type: ignore[attr-defined]
        lib.broken = lambda: 1 / 0  # type: ignore[attr-defined]
        return lib


def gateway(calls: Calls) -> DriverLibrary[str]:
    return DriverLibrary("Lib", calls.load, missing="no device series", not_available="N/A")


def levels(caplog: pytest.LogCaptureFixture, text: str) -> list[int]:
    return [r.levelno for r in caplog.records if text in r.getMessage()]


def test_the_library_is_loaded_by_the_first_query_and_only_once() -> None:
    calls = Calls()
    lib = gateway(calls)
    assert calls.loads == 0  # building a backend loads nothing
    assert lib.query("a", "answer", lambda m: m.answer()) == 42
    assert lib.query("a", "answer", lambda m: m.answer()) == 42
    assert calls.loads == 1


def test_a_missing_library_answers_none_and_is_said_once_at_info(caplog: pytest.LogCaptureFixture) -> None:
    calls = Calls(fail=True)
    lib = gateway(calls)
    with caplog.at_level(logging.DEBUG, logger="memexporter"):
        for _ in range(3):
            assert lib.query("a", "answer", lambda m: m.answer()) is None
            assert lib.device("GPU-1", lambda m: "found", "no such device") is None
    assert calls.loads == 1  # not retried at every scrape
    assert levels(caplog, "Lib unavailable") == [logging.INFO]  # a CPU box: not a fault
    assert "no device series" in caplog.records[0].getMessage()


def test_a_failing_call_answers_none_warns_once_per_kind_then_debug(caplog: pytest.LogCaptureFixture) -> None:
    lib = gateway(Calls())
    with caplog.at_level(logging.DEBUG, logger="memexporter"):
        for _ in range(3):
            assert lib.query("memory:0", "read the memory of GPU-0", lambda m: m.broken(), costs=": none") is None
        assert lib.query("memory:1", "read the memory of GPU-1", lambda m: m.broken()) is None
    said = [r for r in caplog.records if "cannot read the memory" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING, logging.DEBUG, logging.DEBUG, logging.WARNING]
    assert said[0].getMessage() == "memexporter: Lib cannot read the memory of GPU-0 (division by zero): none"


def test_query_newer_falls_back_once_when_the_newer_call_is_not_there(caplog: pytest.LogCaptureFixture) -> None:
    lib = gateway(Calls())
    asked: list[str] = []

    def newer(m: types.ModuleType, error: Exception | None) -> str:
        asked.append("newer")
        if error is not None:
            raise error
        return "v2"

    def older(m: types.ModuleType) -> str:
        asked.append("older")
        return "v1"

    def lacks(m: types.ModuleType, exc: Exception) -> bool:  # the newer call is not there
        return isinstance(exc, LookupError)

    def read(key: str, error: Exception | None) -> str | None:
        return lib.query_newer(key, f"read {key}", lambda m: newer(m, error), older, lacks, "has no v2: v1 instead")

    with caplog.at_level(logging.DEBUG, logger="memexporter"):
        assert [read("a", None) for _ in range(2)] == ["v2", "v2"]
        assert [read("b", LookupError("Function Not Found")) for _ in range(3)] == ["v1"] * 3
        # Any other error is a failed read: None, said once, the newer call asked again next time.
        assert [read("c", RuntimeError("GPU is lost")) for _ in range(2)] == [None, None]
        assert read("c", None) == "v2"
    assert asked == ["newer"] * 2 + ["newer", "older", "older", "older"] + ["newer"] * 3
    assert levels(caplog, "Lib has no v2: v1 instead (Function Not Found)") == [logging.INFO]
    assert levels(caplog, "Lib cannot read c (GPU is lost)") == [logging.WARNING, logging.DEBUG]


def test_a_device_is_looked_up_once_and_no_such_device_is_remembered(caplog: pytest.LogCaptureFixture) -> None:
    lib = gateway(Calls())
    looked: list[str] = []

    def find(uuid: str, answer: str | None) -> str | None:
        looked.append(uuid)
        return answer

    with caplog.at_level(logging.DEBUG, logger="memexporter"):
        for _ in range(3):
            assert lib.device("GPU-a", lambda m: find("GPU-a", "handle-a"), "unmatched a") == "handle-a"
            assert lib.device("GPU-b", lambda m: find("GPU-b", None), "no device is GPU-b") is None
    assert looked == ["GPU-a", "GPU-b"]
    assert levels(caplog, "no device is GPU-b") == [logging.WARNING]


def test_a_lookup_that_raises_is_tried_again(caplog: pytest.LogCaptureFixture) -> None:
    lib = gateway(Calls())
    tries: list[int] = []

    def flaky(m: types.ModuleType) -> str:
        tries.append(1)
        if len(tries) < 3:
            raise RuntimeError("driver busy")
        return "handle"

    with caplog.at_level(logging.DEBUG, logger="memexporter"):
        assert lib.device("GPU-c", flaky, "unmatched") is None
        assert lib.device("GPU-c", flaky, "unmatched") is None
        assert lib.device("GPU-c", flaky, "unmatched") == "handle"
        assert lib.device("GPU-c", flaky, "unmatched") == "handle"
    assert len(tries) == 3
    assert levels(caplog, "lookup of device GPU-c failed (driver busy)") == [logging.WARNING, logging.DEBUG]


def test_own_share_sums_this_process_lines_and_says_why_when_it_cannot(caplog: pytest.LogCaptureFixture) -> None:
    lib = gateway(Calls())
    # One process on two compute instances of a MIG slice, and a neighbour.
    assert lib.own_share("u", "GPU-u", [(7, 100), (9, 5), (7, 20)], pid=7) == ProcessMemory(120)
    with caplog.at_level(logging.DEBUG, logger="memexporter"):
        assert lib.own_share("u", "GPU-u", [(1234, 100)], pid=7) == ProcessMemory(None, "hidden")
        assert lib.own_share("u", "GPU-u", [(7, None), (7, 20)], pid=7) == ProcessMemory(None, "not_available")
    hidden, na = (r.getMessage() for r in caplog.records)
    assert "lists 1 process(es) on GPU-u, none with this process's PID 7" in hidden and "hostPID" in hidden
    assert "without its memory (N/A)" in na
