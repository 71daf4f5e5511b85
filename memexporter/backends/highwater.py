"""The process's own lifetime RSS high-water mark, in bytes: the host's ``Reading.peak``.

``getrusage(RUSAGE_SELF).ru_maxrss`` is a syscall of about 0.7 us, but not the process's own: Linux
keeps the largest mark across ``fork`` and ``execve`` (getrusage(2), NOTES: "preserved across
execve"), and ``subprocess`` starts a child on its parent's memory (vfork), so a job started by a
large parent reads the parent's mark. Measured: a Python child of an 800 MiB parent read
``ru_maxrss`` 813 MiB while it held 14 MiB (``VmHWM``). Such a job's mark never rose until it outgrew
its parent: no exact step or phase peak, no point for the input capacity (a pytest worker at
1.5 GiB starting a training run of 420 MiB, for one).

``VmHWM`` in ``/proc/self/status`` is this process's own mark (its memory map's, new at ``execve``),
at about 5 us a read (``pread`` of a descriptor kept open). So ``HighWater`` reads ``ru_maxrss``, and
``VmHWM`` only while ``ru_maxrss`` is above it (still an ancestor's): once the process's own mark
reaches the inherited one the two agree for good, and the cheap read serves alone.
"""

from __future__ import annotations

import os
import resource
import sys

from memexporter.backends.procfile import ProcFile

_KIB = 1024
_STATUS = "/proc/self/status"


def _own_kib(status: bytes) -> int | None:
    """``VmHWM`` (KiB) from the status file, None when it has none (not Linux, a kernel thread)."""
    at = status.find(b"VmHWM:")
    if at < 0:
        return None
    return int(status[at + 6 : status.index(b"\n", at)].split()[0])


class HighWater:
    """Callable: this process's lifetime RSS high-water mark (bytes). Fork-safe: a child reads its own."""

    def __init__(self, status: str = _STATUS) -> None:
        self._status = ProcFile(status, 8192)  # read while ru_maxrss is not yet ours
        self._own_pid = -1  # the pid for which ru_maxrss is known to be the process's own

    def __call__(self) -> int:
        mark = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if sys.platform == "darwin":  # bytes there, and no inherited mark to correct
            return int(mark)
        pid = os.getpid()
        if self._own_pid == pid:
            return int(mark) * _KIB
        own = self._read_own()
        if own is None or own >= mark:  # no VmHWM, or ru_maxrss is ours now: it stays so
            self._status.release()
            self._own_pid = pid
            return int(mark) * _KIB
        return own * _KIB

    def _read_own(self) -> int | None:
        status = self._status.read()
        try:
            return None if status is None else _own_kib(status)
        except (ValueError, IndexError):
            return None

    def close(self) -> None:
        """Close the status descriptor, if this process opened one (the exporter's ``stop()``); later reads
        keep none open."""
        self._status.close()
