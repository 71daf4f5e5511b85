"""What a sweep's child is started with: a free loopback port, its environment, and its output pipes.

The exporter starts in the child the zero-touch way: ``memexporter.bootstrap`` on ``PYTHONPATH``
and ``MEMEXPORTER_AUTOSTART=1``, as docs/configuration.md's *Zero-touch bootstrap* describes.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO, cast

from memexporter.bootstrap import path as bootstrap_path

TAIL_BYTES = 32 * 1024


def free_port() -> int:
    """A loopback port that is free now, below the kernel's ephemeral range: a child importing torch
    binds seconds later, and an ephemeral port could meanwhile go to some outgoing connection."""
    try:
        high = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text(encoding="ascii").split()[0]) - 1
    except (OSError, ValueError, IndexError):
        high = 32767
    for _ in range(200):
        port = random.randint(10000, max(high, 10001))
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            with contextlib.suppress(OSError):
                s.bind(("127.0.0.1", port))
                return port
    raise OSError("memexporter sweep: no free loopback port found in 200 tries")


def child_env(port: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: the caller's, plus the bootstrap and the exporter's address. TLS
    is turned off and the server forced on: the sweep reads plain HTTP on loopback. OTLP push is
    off: planning runs must not show up in the user's monitoring (and, strict, a collector that
    cannot be reached would fail the run)."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (bootstrap_path(), env.get("PYTHONPATH", "")) if p)
    env.update(
        MEMEXPORTER_AUTOSTART="1",
        MEMEXPORTER_PORT=str(port),
        MEMEXPORTER_ADDR="127.0.0.1",
        MEMEXPORTER_STRICT="1",
        MEMEXPORTER_HTTP="1",
        MEMEXPORTER_OTEL="0",
        MEMEXPORTER_CERTFILE="",
        MEMEXPORTER_KEYFILE="",
    )
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class Tail:
    """The last ``TAIL_BYTES`` of a pipe, read by a daemon thread (the child never blocks on a full pipe)."""

    def __init__(self, stream: object) -> None:
        self._buf = bytearray()
        self._lock = threading.Lock()
        self.version = 0
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: object) -> None:
        # The thread owns the pipe and closes it at EOF: closing it from outside while a read is
        # blocked (a grandchild may hold the write end) could hand the fd number to another file.
        if stream is None:
            return
        with cast(BinaryIO, stream) as pipe:
            while chunk := pipe.read1(65536):  # type: ignore[attr-defined]  # a BufferedReader
                with self._lock:
                    self._buf += chunk
                    del self._buf[:-TAIL_BYTES]
                    self.version += 1

    def text(self, wait: float = 0.0) -> str:
        self._thread.join(wait)
        with self._lock:
            return self._buf.decode("utf-8", errors="replace")
