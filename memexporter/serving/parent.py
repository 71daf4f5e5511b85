"""The job, seen from its helper: alive, or gone, and the instant it goes.

The helper is the job's child, so it learns of the job's end three ways, the first that works:

- a **pidfd** (``os.pidfd_open``, Linux 5.3+): readable the instant the job exits (becomes a zombie),
  whoever its parent is. A thread of its own waits on it with ``/proc/<pid>/stat`` open already and
  reads the exit status at once (``status``): it races the job's parent, which reaps the zombie (and
  the status with it) as soon as it is scheduled;
- the **parent-death signal** (``prctl(PR_SET_PDEATHSIG)``, Linux): SIGUSR1 when the job dies, which
  only wakes the loop up (it also comes when the *thread* that started the helper ends: the loop then
  sees its parent unchanged and goes on);
- its **parent pid** changing (the helper is re-parented once the job is gone), checked every loop turn:
  everywhere else.

The channel's EOF (``channel.py``) comes first of all, as the dying job's descriptors are closed; the
loop then waits for one of these to confirm the end.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import select
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1


def _set_pdeathsig(sig: int) -> bool:
    """Ask the kernel for ``sig`` when the parent dies (Linux); False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


class Parent:
    """The job whose pid is ``pid`` (this process's parent when it starts). Call from the main thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.pidfd: int | None = None
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
        signal.signal(signal.SIGUSR1, lambda *_: None)  # its default would end the helper
        signal.set_wakeup_fd(self._wake_w)
        self.deathsig = _set_pdeathsig(signal.SIGUSR1)
        if hasattr(os, "pidfd_open"):
            with contextlib.suppress(OSError):
                self.pidfd = os.pidfd_open(pid)
        if os.getppid() != pid and self.pidfd is not None:  # gone before the pidfd was opened: a reused pid
            os.close(self.pidfd)
            self.pidfd = None
        self.stat: bytes | None = None  # /proc/<pid>/stat as read the instant the job exited
        self._exited = threading.Event()
        if self.pidfd is not None:
            try:
                stat_fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
            except OSError:
                stat_fd = -1
            threading.Thread(target=self._watch, args=(self.pidfd, stat_fd), name="job-exit", daemon=True).start()

    def _watch(self, pidfd: int, stat_fd: int) -> None:
        """Wait for the exit; read the zombie's stat before anything else; wake the loop."""
        with contextlib.suppress(OSError, ValueError):
            select.select([pidfd], [], [])
            if stat_fd >= 0:
                with contextlib.suppress(OSError):
                    self.stat = os.pread(stat_fd, 4096, 0)
        if stat_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(stat_fd)
        self._exited.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def fds(self) -> list[int]:
        """What the loop watches for the job's end (readable): the wake-up pipe (a signal, the watching thread)."""
        return [self._wake_r]

    def drain(self) -> None:
        """Empty the wake-up pipe (a signal came)."""
        with contextlib.suppress(OSError):
            while os.read(self._wake_r, 512):
                pass

    def gone(self) -> bool:
        """Whether the job has exited (with a pidfd: once the watching thread has read its status)."""
        if self.pidfd is not None:
            return self._exited.is_set()
        return os.getppid() != self.pid
