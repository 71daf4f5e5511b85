"""Host memory: the only module that reads psutil and cgroup files.

A container's memory limit is a cgroup limit, not the machine's RAM, and the kernel's OOM killer
acts on it. So the limit and the available memory are the tighter of the machine's and the
cgroup's: cgroup v2 (``memory.max``, ``memory.current``) or v1 (``memory.limit_in_bytes``,
``memory.usage_in_bytes``), walking up the hierarchy for the tightest limit.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import psutil

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

# cgroup v1 reports "no limit" as a huge page-aligned number rather than "max".
_V1_UNLIMITED = 1 << 60
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


@dataclass(frozen=True)
class HostSample:
    """Host memory in bytes. ``available`` and ``limit`` are cgroup-aware."""

    rss: int
    children_rss: int
    available: int
    limit: int


@dataclass(frozen=True)
class CgroupMemory:
    """The tightest cgroup limit and the reclaim-adjusted usage in that cgroup, in bytes."""

    limit: int
    usage: int


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max" or not text.lstrip("-").isdigit():
        return None
    value = int(text)
    return None if value >= _V1_UNLIMITED else value


def _inactive_file(stat: Path) -> int:
    # Page cache on the inactive list is reclaimed before the OOM killer acts; subtracting it
    # gives the "working set" that cAdvisor and the kubelet use for eviction.
    try:
        for line in stat.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key in ("inactive_file", "total_inactive_file"):
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def read_cgroup(root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")) -> CgroupMemory | None:
    """The memory cgroup limit of this process, or ``None`` when no limit is set or readable."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    best: CgroupMemory | None = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "":  # cgroup v2 unified hierarchy
            base, limit_f, usage_f, stat_f = root, "memory.max", "memory.current", "memory.stat"
        elif "memory" in controllers.split(","):  # cgroup v1
            base, limit_f, usage_f, stat_f = root / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat"
        else:
            continue
        # Inside a container the path in /proc/self/cgroup may not exist under the mount (the
        # namespace root is mounted at the root), so try the path and each ancestor, then the root.
        rel_path = Path(rel.lstrip("/"))
        for candidate in [base / rel_path, *(base / p for p in rel_path.parents)]:
            limit = _read_int(candidate / limit_f)
            usage = _read_int(candidate / usage_f)
            if limit is None or usage is None:
                continue
            usage = max(0, usage - _inactive_file(candidate / stat_f))
            if best is None or limit < best.limit:
                best = CgroupMemory(limit=limit, usage=usage)
    return best


class HostBackend:
    """psutil for the process and the machine, cgroup files for the container limit."""

    def __init__(self, cgroup_root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup"),
                 statm: str = "/proc/self/statm") -> None:
        self._proc = psutil.Process()
        self._cgroup_root = cgroup_root
        self._proc_cgroup = proc_cgroup
        self._statm_path = statm
        self._statm: tuple[int, int] | None = None  # (pid, descriptor) of the open statm file

    def rss(self) -> int:
        """Resident set size of this process in bytes, for the step tracker and every phase boundary.

        Linux: field 2 of ``/proc/self/statm`` (pages) through a descriptor kept open, about 1 us a
        read where psutil's ``memory_info()`` takes about 7; elsewhere, or if that fails, psutil.
        """
        fd = self._statm_fd()
        if fd is not None:
            try:
                return int(os.pread(fd, 256, 0).split()[1]) * _PAGE
            except (OSError, ValueError, IndexError):
                pass
        return int(psutil.Process().memory_info().rss)

    def _statm_fd(self) -> int | None:
        # Opened per process: a forked child's inherited descriptor reads its parent's file.
        pid = os.getpid()
        if self._statm is not None and self._statm[0] == pid:
            return self._statm[1]
        try:
            fd = os.open(self._statm_path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            fd = -1
        self._statm = (pid, fd)
        return None if fd < 0 else fd

    def close(self) -> None:
        """Close the statm descriptor (the exporter's ``stop()``: every descriptor it opened goes)."""
        statm, self._statm = self._statm, None
        if statm is not None and statm[0] == os.getpid() and statm[1] >= 0:
            with contextlib.suppress(OSError):
                os.close(statm[1])

    def __del__(self) -> None:
        self.close()

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
        """One reading of every host figure."""
        rss = self.rss()
        children = self.children_rss()
        vm = psutil.virtual_memory()
        available, limit = int(vm.available), int(vm.total)
        cg = read_cgroup(self._cgroup_root, self._proc_cgroup)
        if cg is not None:
            limit = min(limit, cg.limit)
            available = min(available, max(0, cg.limit - cg.usage))
        return HostSample(rss=rss, children_rss=children, available=available, limit=limit)
