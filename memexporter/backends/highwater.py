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

import contextlib
import os
import resource
import sys

_KIB = 1024
_STATUS = "/proc/self/status"


def _own_kib(fd: int) -> int | None:
    """``VmHWM`` (KiB) from the open status file, None when it has none (not Linux, a kernel thread)."""
    data = os.pread(fd, 8192, 0)
    at = data.find(b"VmHWM:")
    if at < 0:
        return None
    return int(data[at + 6 : data.index(b"\n", at)].split()[0])


class HighWater:
    """Callable: this process's lifetime RSS high-water mark (bytes). Fork-safe: a child reads its own."""

    def __init__(self, status: str = _STATUS) -> None:
        self._status = status
        self._fd: tuple[int, int] | None = None  # (pid, descriptor) while ru_maxrss is not yet ours
        self._own_pid = -1  # the pid for which ru_maxrss is known to be the process's own
        self._closed = False  # the exporter stopped: a read opens the status file and closes it again

    def __call__(self) -> int:
        mark = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if sys.platform == "darwin":  # bytes there, and no inherited mark to correct
            return int(mark)
        pid = os.getpid()
        if self._own_pid == pid:
            return int(mark) * _KIB
        own = self._read_own(pid)
        if own is None or own >= mark:  # no VmHWM, or ru_maxrss is ours now: it stays so
            self._drop()
            self._own_pid = pid
            return int(mark) * _KIB
        return own * _KIB

    def _read_own(self, pid: int) -> int | None:
        if self._fd is None or self._fd[0] != pid:  # opened per process: a forked child's copy reads the parent
            try:
                fd = os.open(self._status, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
            if self._closed:
                try:
                    return _own_kib(fd)
                except (OSError, ValueError, IndexError):
                    return None
                finally:
                    os.close(fd)
            self._fd = (pid, fd)
        try:
            return _own_kib(self._fd[1])
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        """Close the status descriptor, if this process opened one (the exporter's ``stop()``); later reads
        keep none open."""
        self._closed = True
        self._drop()

    def _drop(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None and fd[0] == os.getpid():
            with contextlib.suppress(OSError):
                os.close(fd[1])

    def __del__(self) -> None:
        self._drop()
