"""The per-process secret that guards ``/debug/*``: a token in a file only the job's user can read.

As Jupyter does it. The job makes a random token (``secrets.token_urlsafe(32)``, never starting with ``-``; or takes
``MEMEXPORTER_DEBUG_TOKEN`` from its environment) and writes it to
``<runtime dir>/memexporter-<host>-<pid>-<port>.token`` (file 0600, folder 0700, checked to be
this user's and not a symlink), removed at ``stop()`` and at exit. The runtime dir is
``$XDG_RUNTIME_DIR/memexporter`` when that variable names a folder (a per-user tmpfs on systemd
machines), else ``~/.local/share/memexporter/runtime``. A killed job leaves its file behind:
``inspect`` skips the files of dead processes, and the next job on the host removes them. The host name keeps the files of nodes that
share a home folder (NFS) apart. A request to ``/debug/*`` must carry the token
(``Authorization: Bearer <token>`` or ``?token=<token>``), compared in constant time.
``memexporter inspect`` finds the file for a local URL's port (``find()``). The token is never
logged, and its ``repr`` hides it.
"""

from __future__ import annotations

import atexit
import contextlib
import hmac
import logging
import os
import re
import secrets
import socket
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger("memexporter")

TOKEN_ENV = "MEMEXPORTER_DEBUG_TOKEN"
MIN_LENGTH = 16
_VALID = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no spaces: it travels in a header


def runtime_dirs(environ: Mapping[str, str] | None = None) -> list[Path]:
    """Where token files live, the one a job writes first. A job started without
    ``XDG_RUNTIME_DIR`` (a batch scheduler) writes to the second; ``inspect`` looks in both."""
    env = os.environ if environ is None else environ
    dirs = []
    xdg = env.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(xdg) and os.path.isdir(xdg):
        dirs.append(Path(xdg) / "memexporter")
    home = env.get("HOME") or os.path.expanduser("~")
    dirs.append(Path(home) / ".local" / "share" / "memexporter" / "runtime")
    return dirs


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "localhost"


def file_name(pid: int, port: int) -> str:
    """The token file's name, ``memexporter-<host>-<pid>-<port>.token`` (in the host name, ``_`` for any
    character but letters, digits, ``.`` and ``-``)."""
    return f"memexporter-{_host()}-{pid}-{port}.token"


def checked(token: str, source: str) -> str:
    """``token`` when it can be one; ``ValueError`` naming ``source`` (never the value) otherwise."""
    if len(token) < MIN_LENGTH or not _VALID.fullmatch(token):
        raise ValueError(
            f"memexporter: {source} must be at least {MIN_LENGTH} printable characters without "
            "spaces (the value is not shown)"
        )
    return token


def _random() -> str:
    """``secrets.token_urlsafe(32)`` (43 characters, 256 bits) that does not start with ``-``: one in 64
    did, and ``memexporter inspect --token TOKEN`` then read the token as an option (argparse)."""
    while (value := secrets.token_urlsafe(32)).startswith("-"):
        pass
    return value


def _private_dir(path: Path) -> Path:
    """``path``, created 0700, or ``OSError`` when it is not a folder of this user's alone."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{path} is not a folder")
    if st.st_uid != os.getuid():
        raise OSError(f"{path} belongs to uid {st.st_uid}, not to this user")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


class DebugToken:
    """This process's token. ``publish(port)`` writes its file, ``withdraw()`` removes it."""

    def __init__(self, value: str) -> None:
        self._value = value
        self.path: Path | None = None
        self._pid = os.getpid()

    @classmethod
    def create(cls, environ: Mapping[str, str] | None = None) -> DebugToken:
        """From ``MEMEXPORTER_DEBUG_TOKEN`` when set (``ValueError`` when too short), else random."""
        given = (os.environ if environ is None else environ).get(TOKEN_ENV)
        return cls(checked(given, TOKEN_ENV) if given else _random())

    @property
    def value(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"<DebugToken {self.path or 'unpublished'}>"

    def accepts(self, given: str | None) -> bool:
        """Whether ``given`` is the token, in constant time."""
        return given is not None and hmac.compare_digest(given.encode("utf-8", "replace"), self._value.encode())

    def publish(self, port: int, environ: Mapping[str, str] | None = None) -> Path | None:
        """Write the token file for ``port`` (replacing this process's file for another port).
        Logs an error and returns None when no runtime dir can be written."""
        self.withdraw()
        directory = runtime_dirs(environ)[0]
        try:
            _private_dir(directory)
            _remove_stale(directory)
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".memexporter-", suffix=".tmp")  # 0600
            try:
                os.write(fd, self._value.encode() + b"\n")
            finally:
                os.close(fd)
            path = directory / file_name(os.getpid(), port)
            os.replace(tmp, path)
        except OSError as exc:
            log.error(
                "memexporter: cannot write the debug token file in %s (%s): nobody can read /debug/* "
                "without it. Set XDG_RUNTIME_DIR to a private folder, or start the job with %s set and "
                "give the same value to memexporter inspect",
                directory,
                exc,
                TOKEN_ENV,
            )
            return None
        self.path = path
        atexit.register(self.withdraw)
        log.info("memexporter: /debug/* needs this process's token, in %s (memexporter inspect reads it)", path)
        return path

    def withdraw(self) -> None:
        """Remove the token file (in the process that wrote it; a forked child leaves it alone)."""
        path, self.path = self.path, None
        if path is None or os.getpid() != self._pid:
            return
        atexit.unregister(self.withdraw)
        with contextlib.suppress(OSError):
            path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, someone else's (a reused pid)
        return True
    return True


def _remove_stale(directory: Path) -> None:
    """This host's token files whose process is gone (killed: SIGTERM and SIGKILL run no clean-up)."""
    pattern = re.compile(rf"memexporter-{re.escape(_host())}-(\d+)-\d+\.token")
    for entry in os.scandir(directory):
        m = pattern.fullmatch(entry.name)
        if m and not _alive(int(m.group(1))):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


def find(port: int, environ: Mapping[str, str] | None = None) -> list[Path]:
    """This host's token files for ``port`` whose process is alive, oldest first (after a failed
    bind two processes may name one port: the first to bind it wrote its file first)."""
    pattern = re.compile(rf"memexporter-{re.escape(_host())}-(\d+)-{port}\.token")
    found: list[tuple[float, Path]] = []
    for directory in runtime_dirs(environ):
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            m = pattern.fullmatch(entry.name)
            if m and _alive(int(m.group(1))):
                try:
                    found.append((entry.stat(follow_symlinks=False).st_mtime, Path(entry.path)))
                except OSError:
                    continue
    return [p for _, p in sorted(found)]


def read(path: Path) -> str:
    """The token in ``path`` (``OSError`` when it cannot be read, ``ValueError`` when it holds none)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        text = f.read(4096).decode("ascii", "replace").strip()
    return checked(text, str(path))
