"""Files in ``oom_dump_dir``, written off the training thread.

The training thread builds the bytes and hands them to ``DumpWriter.submit``; one daemon thread
writes each to a temporary name in the directory, fsyncs it, renames it into place and fsyncs the
directory. A slow fsync (seconds on NFS) costs the training thread nothing. A reader, or a crash,
sees a whole file or none.

Temporary names carry the host and the pid (``.memexporter-<host>-<pid>-XXXXXXXX.tmp``): a process
killed mid-write (SIGKILL, the OOM killer) leaves one behind, and ``clean_stale`` removes it at the
next start: a temporary file of a dead pid on this host, or any older than ``STALE_AFTER_S``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import queue
import re
import socket
import tempfile
import threading
import time
from collections.abc import Callable

log = logging.getLogger("memexporter")

STALE_AFTER_S = 300.0
EXIT_FLUSH_S = 30.0
"""At interpreter exit (a CUDA OOM that ends the script), wait this long for pending dumps."""
_TMP = re.compile(r"^\.memexporter-(?:(?P<host>.+)-(?P<pid>\d+)-)?[a-z0-9_]+\.tmp$")

Done = Callable[[str, "OSError | None"], None]
"""Called on the writer thread once a file is in place (``None``) or could not be written."""


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader (or a crash) sees all of it or nothing."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".memexporter-{_host()}-{os.getpid()}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # a read-only file system may refuse this too
            os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself must reach the disk
    finally:
        os.close(dir_fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: someone else's process, alive
        pass
    return True


def clean_stale(directory: str, now: float | None = None, alive: Callable[[int], bool] = _alive) -> list[str]:
    """Remove the temporary files that killed writers left in ``directory``; the names removed.

    A file of this host whose pid is gone, or any older than ``STALE_AFTER_S`` (another host's, on
    a shared file system, or one whose pid was reused). Never this process's own; never raises.
    """
    now = time.time() if now is None else now
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    host, me = _host(), os.getpid()
    for name in names:
        m = _TMP.match(name)
        if m is None:
            continue
        path = os.path.join(directory, name)
        pid = int(m["pid"]) if m["pid"] else None
        try:
            old = now - os.stat(path).st_mtime > STALE_AFTER_S
            dead = pid is not None and m["host"] == host and pid != me and not alive(pid)
            if (old and pid != me) or dead:
                os.unlink(path)
                removed.append(name)
        except OSError:
            continue  # gone meanwhile, or a read-only directory: nothing to do about it
    if removed:
        log.info(
            "memexporter: removed %d temporary file(s) that killed writers left in %s: %s",
            len(removed),
            directory,
            ", ".join(removed[:5]),
        )
    return removed


class DumpWriter:
    """One daemon thread that writes the files handed to it, in order."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[str, bytes, Done] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._pending = 0
        self._idle = threading.Condition()
        self._closed = False
        self._at_exit = False

    def submit(self, path: str, data: bytes, done: Done) -> None:
        """Queue ``data`` for ``path`` and return at once; ``done`` says how it went."""
        with self._idle:
            if self._pid != os.getpid():  # a forked child: the parent's thread and jobs are not here
                self._pid, self._pending, self._thread = os.getpid(), 0, None
            if self._thread is None or self._closed:  # each thread drains its own queue, then ends
                self._closed = False
                self._queue = queue.SimpleQueue()
                self._thread = threading.Thread(
                    target=self._run, args=(self._queue,), name="memexporter-dump-writer", daemon=True
                )
                self._thread.start()
                if not self._at_exit:
                    self._at_exit = True
                    atexit.register(self.flush, EXIT_FLUSH_S)
            self._pending += 1
            self._queue.put((path, data, done))

    def flush(self, timeout: float) -> bool:
        """Wait until every file handed over is written (or failed); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._pending and self._pid == os.getpid():
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("memexporter: %d dump file(s) still being written after %.0f s", self._pending, timeout)
                    return False
                self._idle.wait(left)
        return True

    def close(self) -> None:
        """Let the thread finish what it holds, then end (without waiting for it)."""
        with self._idle:
            if self._thread is not None and not self._closed and self._pid == os.getpid():
                self._closed = True
                self._queue.put(None)

    def _run(self, jobs: queue.SimpleQueue[tuple[str, bytes, Done] | None]) -> None:
        while (job := jobs.get()) is not None:
            path, data, done = job
            error: OSError | None = None
            try:
                write_atomic(path, data)
            except OSError as exc:
                error = exc
            except Exception as exc:  # not a file system's answer: a bug, with its traceback once
                log.exception("memexporter: writing %s failed", path)
                error = OSError(f"{type(exc).__name__}: {exc}")
            try:
                done(path, error)
            except Exception:
                log.exception("memexporter: after writing %s", path)
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()
