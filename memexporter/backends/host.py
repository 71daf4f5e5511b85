"""Host memory: with ``cgroup.py`` and ``procfile.py``, the only modules that read psutil, /proc and
cgroup files.

A container's memory limit is a cgroup limit, not the machine's RAM, and the kernel's OOM killer
acts on it. So the limit and the available memory are the tighter of the machine's and the
cgroup's (``cgroup.py``).

Each figure is read on its own: one that fails is ``None`` in the sample (and named in
``HostSample.failed``), the others stay.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psutil

from memexporter.backends.base import HostSample, LogOnce
from memexporter.backends.cgroup import CgroupMemory, read_cgroup
from memexporter.backends.procfile import ProcFile

__all__ = ["CgroupMemory", "HostBackend", "HostSample", "read_cgroup"]

_log = LogOnce()
_T = TypeVar("_T")

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_PROC = Path("/proc")


def _children_from_proc(pid: int) -> list[int] | None:
    """Direct children of ``pid`` from ``/proc/PID/task/*/children``, or None if unsupported.

    psutil's ``children()`` scans every process on the machine to build a parent map (tens of
    milliseconds on a busy node); the kernel's per-thread children lists are a few small reads.
    """
    tasks = _PROC / str(pid) / "task"
    try:
        out: list[int] = []
        for task in tasks.iterdir():
            out.extend(int(c) for c in (task / "children").read_text().split())
        return out
    except FileNotFoundError:
        return None if pid == os.getpid() else []  # missing for self: no CONFIG_PROC_CHILDREN
    except (OSError, ValueError):
        return []


def _rss_from_proc(pid: int) -> int:
    try:
        return int((_PROC / str(pid) / "statm").read_text().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0  # the worker exited between listing and reading


class HostBackend:
    """psutil for the process and the machine, cgroup files for the container limit."""

    def __init__(
        self,
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        proc_cgroup: Path = Path("/proc/self/cgroup"),
        statm: str = "/proc/self/statm",
    ) -> None:
        self._proc = psutil.Process()
        self._cgroup_root = cgroup_root
        self._proc_cgroup = proc_cgroup
        self._statm = ProcFile(statm, 256)

    def rss(self) -> int:
        """Resident set size of this process in bytes, for the step tracker and every phase boundary.

        Linux: field 2 of ``/proc/self/statm`` (pages) through a descriptor kept open (``procfile.py``),
        about 1 us a read where psutil's ``memory_info()`` takes about 7; elsewhere, or if that fails, psutil.
        """
        data = self._statm.read()
        if data is not None:
            try:
                return int(data.split()[1]) * _PAGE
            except (ValueError, IndexError):
                pass
        return int(psutil.Process().memory_info().rss)

    def close(self) -> None:
        """Close the statm descriptor (the exporter's ``stop()``: every descriptor it opened goes); later
        reads keep none open."""
        self._statm.close()

    def children_rss(self) -> int:
        """Summed RSS of all descendants (DataLoader workers and their children), in bytes."""
        pending = _children_from_proc(os.getpid())
        if pending is None:  # no /proc children lists: let psutil scan
            total = 0
            for child in self._proc.children(recursive=True):
                try:
                    total += int(child.memory_info().rss)
                except psutil.Error:
                    continue
            return total
        total, seen = 0, set()
        while pending:
            pid = pending.pop()
            if pid in seen:
                continue
            seen.add(pid)
            total += _rss_from_proc(pid)
            pending.extend(_children_from_proc(pid) or [])
        return total

    def sample(self) -> HostSample:
        """One reading of every host figure; a read that fails costs only its own figures."""
        failed: list[str] = []

        def read(what: str, fn: Callable[[], _T]) -> _T | None:
            try:
                return fn()
            except Exception as exc:  # psutil.Error, OSError...: named on the collectors' success
                failed.append(f"{what}: {type(exc).__name__}: {exc}")
                _log.warning(
                    f"read:{what}",
                    "memexporter: reading the %s failed (%s: %s); its series are missing until it reads again",
                    what,
                    type(exc).__name__,
                    exc,
                )
                return None

        rss = read("process RSS", self.rss)
        children = read("DataLoader workers' RSS", self.children_rss)
        vm = read("machine's memory (psutil.virtual_memory)", psutil.virtual_memory)
        cg = read("cgroup memory limit", lambda: read_cgroup(self._cgroup_root, self._proc_cgroup))
        available = limit = None
        if vm is not None:
            available, limit = int(vm.available), int(vm.total)
            if cg is not None:
                limit = min(limit, cg.limit)
                available = min(available, max(0, cg.limit - cg.usage))
        return HostSample(rss=rss, children_rss=children, available=available, limit=limit, failed=tuple(failed))
