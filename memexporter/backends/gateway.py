"""The one gateway to a native driver library (NVML, amdsmi): the pattern of nvitop's ``nvmlQuery``.

A driver backend (``nvml.py``, ``amdsmi.py``) reaches its library through a ``DriverLibrary`` only:

- **lazy**: the library is imported and initialised by the first query, once, behind a lock; never
  at import time, never in a process that does not scrape;
- **error to sentinel**: a call that raises answers ``None``, so one failing figure costs only
  itself and nothing raises into a scrape;
- **log once**: the first failure of each kind is a warning saying what could not be read and what
  is missing because of it; repeats are debug lines (``base.LogOnce``), so a call that fails at
  every scrape does not flood the training job's log.

Devices are looked up once per torch UUID and cached, "no such device" included; a lookup that
raised (a driver error, not an answer) is tried again at the next scrape. ``own_share`` reads this
process's lines of a driver's process list, one judgement for every vendor. ``query_newer`` asks a
newer call where the driver and its binding have it and the older one where they do not (NVML's
v2 memory info, say), deciding once per key and saying so once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Generic, TypeVar

from memexporter.backends.base import LogOnce, ProcessMemory

__all__ = ["DriverLibrary"]

log = logging.getLogger("memexporter")
T = TypeVar("T")
D = TypeVar("D")


class DriverLibrary(Generic[D]):
    """Lazy, failure-tolerant access to one driver library; ``D`` is its backend's device record."""

    def __init__(self, name: str, load: Callable[[], ModuleType], missing: str, not_available: str) -> None:
        """``name``: how messages call the library (``NVML``); ``load()``: import and initialise it,
        raising when it cannot; ``missing``: what its absence costs and how to get it (said once,
        at info level: a CPU box has no driver library, and that is not a fault);
        ``not_available``: the library's spelling of a figure it cannot give."""
        self.name = name
        self._load, self._missing, self._not_available = load, missing, not_available
        self._lock = threading.Lock()
        self._lib: ModuleType | None = None
        self._tried = False
        self._devices: dict[str, D | None] = {}  # torch's UUID -> the library's device, or None: not there
        self._older: set[str] = set()  # query_newer keys whose newer call the library lacks
        self._log = LogOnce()

    def library(self) -> ModuleType | None:
        """The initialised library module, or ``None`` when it cannot be loaded (tried once)."""
        with self._lock:
            if not self._tried:
                self._tried = True
                try:
                    self._lib = self._load()
                except Exception as exc:  # ImportError, a missing shared library, a driver mismatch...
                    log.info("memexporter: %s unavailable (%s); %s", self.name, exc, self._missing)
            return self._lib

    def query(self, key: str, what: str, call: Callable[[ModuleType], T], costs: str = "") -> T | None:
        """``call(library)``; ``None`` when the library is unavailable or the call raised, and then
        "<name> cannot <what> (<error>)<costs>" is logged, a warning the first time per ``key``.
        ``call`` must not answer ``None`` itself: ``None`` means "could not say"."""
        lib = self.library()
        if lib is None:
            return None
        try:
            return call(lib)
        except Exception as exc:
            self._log.warning(key, "memexporter: %s cannot %s (%s)%s", self.name, what, exc, costs)
            return None

    def query_newer(
        self,
        key: str,
        what: str,
        newer: Callable[[ModuleType], T],
        older: Callable[[ModuleType], T],
        lacks: Callable[[ModuleType, Exception], bool],
        instead: str,
    ) -> T | None:
        """``newer(library)`` where the library has that call, else ``older(library)``; ``None`` as
        ``query`` answers it. ``lacks(library, error)`` tells an error that means the newer call is
        not there (an older driver or binding) from one that means this read failed. The first
        makes ``key`` use ``older`` from then on, said once at info level (an older driver is not
        a fault): "<name> <instead> (<error>)". The second costs this read only, as in ``query``:
        ``None``, a warning the first time, and ``newer`` is asked again next time, never
        ``older``, so a figure does not change meaning between two reads."""
        lib = self.library()
        if lib is None:
            return None
        with self._lock:
            use_older = key in self._older
        if not use_older:
            try:
                return newer(lib)
            except Exception as exc:
                if not lacks(lib, exc):
                    self._log.warning(key, "memexporter: %s cannot %s (%s)", self.name, what, exc)
                    return None
                with self._lock:
                    first = key not in self._older  # two scrapes at once: said once all the same
                    self._older.add(key)
                if first:
                    log.info("memexporter: %s %s (%s)", self.name, instead, exc)
        return self.query(key, what, older)

    def device(self, uuid: str, find: Callable[[ModuleType], D | None], unmatched: str) -> D | None:
        """The device torch calls ``uuid``: ``find(library)``'s answer, looked up once and cached.
        ``None`` without the library, when no device matches (``unmatched`` is said once), or when
        the lookup raised (said once, and tried again next time)."""
        lib = self.library()
        if lib is None:
            return None
        with self._lock:
            if uuid in self._devices:
                return self._devices[uuid]
        try:
            device = find(lib)
        except Exception as exc:
            self._log.warning(f"find:{uuid}", "memexporter: %s lookup of device %s failed (%s)", self.name, uuid, exc)
            return None
        if device is None:
            self._log.warning(f"find:{uuid}", "memexporter: %s", unmatched)
        with self._lock:
            self._devices[uuid] = device
        return device

    def own_share(
        self, uuid: str, name: str, listed: Sequence[tuple[int | None, int | None]], pid: int
    ) -> ProcessMemory:
        """Process ``pid``'s bytes on device ``name`` from the driver's process list, given as
        ``(pid, bytes or None)`` lines: the sum of its lines (one per compute instance of a MIG
        slice). ``hidden`` when no line has this PID, ``not_available`` when one has no figure."""
        mine = [used for line_pid, used in listed if line_pid == pid]
        if not mine:
            self._log.warning(
                f"hidden:{uuid}",
                "memexporter: %s lists %d process(es) on %s, none with this process's PID %d: a "
                "container's PID namespace hides it from the driver (run with the host's PID namespace: "
                "hostPID: true, docker --pid=host, to measure it). "
                "memexporter_device_process_used_bytes is NaN, _non_allocator_bytes absent",
                self.name,
                len(listed),
                name,
                pid,
            )
            return ProcessMemory(None, "hidden")
        if any(used is None for used in mine):
            self._log.warning(
                f"na:{uuid}",
                "memexporter: %s lists this process on %s without its memory (%s): "
                "memexporter_device_process_used_bytes is NaN",
                self.name,
                name,
                self._not_available,
            )
            return ProcessMemory(None, "not_available")
        return ProcessMemory(sum(used for used in mine if used is not None))
