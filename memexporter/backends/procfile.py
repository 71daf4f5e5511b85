"""A ``/proc`` file of this process, read through a descriptor kept open: ``/proc/self/statm`` (the RSS at
every step and phase boundary, ``host.py``) and ``/proc/self/status`` (the own high-water mark,
``highwater.py``). A ``pread`` of an open descriptor takes about 1 us; opening the file for each read, 5 to 10.

- Opened per process: the path names ``self`` when it is opened, so a forked child's inherited descriptor
  reads its parent's file. A child opens its own (and leaves the inherited number alone: the child may have
  closed it and reused the number since).
- Opened once, under a lock: the first reads can come from two threads at once (the training thread at a
  phase or step boundary, the publishing thread's collection). ``os.open`` lets go of the GIL, so each
  thread opened a descriptor and the one kept second left the other open for good, where ``stop()`` could
  not close it (issue 40: the descriptor test's flake, one run in five). The lock is taken on the open
  only, never on a read, and a forked child starts with a new one (another thread may have held it at the
  fork).
- ``close()`` (the exporter's ``stop()``) closes it; a read after that (a phase the user closes later)
  opens, reads and closes again, keeping nothing open.
"""

from __future__ import annotations

import contextlib
import os
import threading

_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_opening = threading.Lock()


def _new_lock() -> None:
    global _opening
    _opening = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock)


class ProcFile:
    """The first ``size`` bytes of ``path``, read again at each call (the module docstring); None when the file
    cannot be opened or read (not Linux, no ``/proc``)."""

    def __init__(self, path: str, size: int) -> None:
        self._path, self._size = path, size
        self._fd: tuple[int, int] | None = None  # (pid, descriptor; -1: it could not be opened in that process)
        self._closed = False

    def read(self) -> bytes | None:
        pid = os.getpid()
        opened = self._fd
        if opened is None or opened[0] != pid:
            opened = self._open(pid)
            if opened is None:  # closed: read once, keep nothing
                return self._read_once()
        if opened[1] < 0:
            return None
        try:
            return os.pread(opened[1], self._size, 0)
        except OSError:
            return None

    def _open(self, pid: int) -> tuple[int, int] | None:
        with _opening:
            if self._closed:
                return None
            if self._fd is None or self._fd[0] != pid:  # another thread may have opened it meanwhile
                try:
                    fd = os.open(self._path, _FLAGS)
                except OSError:
                    fd = -1
                self._fd = (pid, fd)
            return self._fd

    def _read_once(self) -> bytes | None:
        try:
            fd = os.open(self._path, _FLAGS)
        except OSError:
            return None
        try:
            return os.pread(fd, self._size, 0)
        except OSError:
            return None
        finally:
            os.close(fd)

    def release(self) -> None:
        """Close this process's descriptor; a later read opens it again (not needed for now, not stopped)."""
        with _opening:
            opened, self._fd = self._fd, None
        _close_own(opened)

    def close(self) -> None:
        """Close this process's descriptor for good: later reads keep none open (the exporter's ``stop()``)."""
        with _opening:
            self._closed = True
        self.release()

    def __del__(self) -> None:
        # No lock here: a collection can run on any thread, even one inside _open.
        opened, self._fd = self._fd, None
        _close_own(opened)


def _close_own(opened: tuple[int, int] | None) -> None:
    """Close a ``(pid, descriptor)`` this process opened (not one inherited across a fork)."""
    if opened is not None and opened[0] == os.getpid() and opened[1] >= 0:
        with contextlib.suppress(OSError):
            os.close(opened[1])
