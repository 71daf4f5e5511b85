"""Handing the port over: a helper in its grace period gives the port up to the next job's helper.

A job restarted on the same port (``torchrun --max-restarts``, a script run again) must not find the port
held by the previous job's helper, which serves that job's end for a minute. Every helper listens on an
abstract Unix socket named by its port (Linux: no file, gone with the process; per network namespace, as
the port is). A helper whose bind fails with ``EADDRINUSE`` asks there (``ask``); the holder, if its job has
ended and the asker runs as the same user (``SO_PEERCRED``), closes its listening socket, answers yes and
exits; a holder whose job runs answers no, and the bind failure is reported as before. Elsewhere there is
no handover: the port is free again at the end of the grace period.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import sys
from collections.abc import Callable

SUPPORTED = sys.platform.startswith("linux")
_CRED = struct.Struct("3i")  # pid, uid, gid


def address(port: int) -> str:
    """The abstract socket's name for ``port`` (the leading NUL: Linux's abstract namespace)."""
    return f"\0memexporter-port-{port}"


class Offer:
    """The holder's side: ``sock`` is readable when an asker connects; ``answer(gone)`` replies to it."""

    def __init__(self, port: int) -> None:
        self.sock: socket.socket | None = None
        if not SUPPORTED:
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(address(port))
            sock.listen(4)
            sock.setblocking(False)
        except OSError:  # another helper holds the name (another address, same port): no handover offered
            sock.close()
            return
        self.sock = sock

    def answer(self, ended: Callable[[], bool], release: Callable[[], None]) -> bool:
        """Reply to one asker: when ``ended()`` and the asker is this user, ``release()`` the port first,
        then say yes (True: the caller exits); no otherwise (False)."""
        if self.sock is None:
            return False
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return False
        with conn:
            try:
                _, uid, _ = _CRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
            except OSError:
                return False
            yes = uid == os.getuid() and ended()
            if yes:
                release()
            with contextlib.suppress(OSError):
                conn.settimeout(1.0)
                conn.sendall(b"y" if yes else b"n")
            return yes

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def ask(port: int, timeout: float = 2.0) -> bool:
    """Ask the helper holding ``port`` to give it up; True when it said yes (it is closing the port)."""
    if not SUPPORTED:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(address(port))
            return sock.recv(1) == b"y"
    except OSError:
        return False
