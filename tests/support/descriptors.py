"""A process's open descriptors, each with what it is open on (Linux ``/proc/PID/fd``): for the tests that
check the exporter keeps nothing open after ``stop()``, in tests/unit as in tests/integration (it starts
nothing)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def descriptors(pid: int | str = "self") -> dict[int, str]:
    """A process's open descriptors (Linux), each with what it is open on (``socket:[123]``, a path)."""
    found = {}
    folder = Path("/proc") / str(pid) / "fd"
    for name in os.listdir(folder):
        with contextlib.suppress(OSError):  # closed meanwhile (the listing's own, for one)
            found[int(name)] = os.readlink(folder / name)
    return found


def open_on(path: os.PathLike[str] | str) -> list[int]:
    """This process's descriptors open on ``path``."""
    return [fd for fd, target in descriptors().items() if target == os.fspath(path)]


def changed(before: dict[int, str], after: dict[int, str]) -> dict[int, tuple[str | None, str | None]]:
    """The descriptors that differ between two ``descriptors()``: ``{fd: (before, after)}``, None where closed."""
    return {
        fd: (before.get(fd), after.get(fd))
        for fd in sorted(before.keys() | after.keys())
        if before.get(fd) != after.get(fd)
    }
