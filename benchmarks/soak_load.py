"""The soak's load and its probes (``bench_soak.py``): a client process that scrapes every route and asks the debug
routes, and what one sample of a process reads (RSS, descriptors, threads) from ``/proc``.

    SOAK_TOKEN=... python benchmarks/soak_load.py PORT RATE DEBUG_EVERY
        GETs the routes in turn, RATE a second in all, and ``/debug/memory`` every DEBUG_EVERY seconds with the
        debug token (from the environment: not on a command line anyone can read), until its stdin closes; then
        prints one JSON line of counts ({"scrapes": {"ok": N, "err": N}, "debug": {...}}).

A process of its own, as Prometheus is: the training process pays only for serving.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass

ROUTES = (
    ("/metrics", ""),
    ("/metrics", "Accept: application/openmetrics-text;version=1.0.0\r\nAccept-Encoding: gzip\r\n"),
    ("/metrics?name[]=memexporter_steps_total&name[]=memexporter_memory_used_bytes", ""),
    ("/live.json", ""),
    ("/", ""),
    ("/healthz", ""),
)


def get(port: int, path: str, headers: str = "", timeout: float = 10.0) -> int:
    """The status of ``GET path`` on loopback (0: no answer), reading the whole body."""
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{headers}\r\n".encode()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(request)
            data = b""
            while chunk := s.recv(65536):
                data += chunk
    except OSError:
        return 0
    try:
        return int(data.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0


def client(port: int, rate: float, debug_every: float, token: str) -> dict[str, dict[str, int]]:
    """Scrape until stdin closes; the counts."""
    counts = {"scrapes": {"ok": 0, "err": 0}, "debug": {"ok": 0, "err": 0}}
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    n, start, next_debug = 0, time.monotonic(), time.monotonic() + debug_every
    while not done.is_set():
        path, headers = ROUTES[n % len(ROUTES)]
        counts["scrapes"]["ok" if get(port, path, headers) == 200 else "err"] += 1
        n += 1
        if time.monotonic() >= next_debug:
            next_debug += debug_every
            status = get(port, "/debug/memory", f"Authorization: Bearer {token}\r\n", timeout=15)
            counts["debug"]["ok" if status == 200 else "err"] += 1
        done.wait(max(0.0, start + n / rate - time.monotonic()))
    return counts


@dataclass(frozen=True)
class Sample:
    """One look at a process: resident memory (bytes), open descriptors, threads."""

    pid: int
    rss: int
    fds: int
    threads: int


def sample(pid: int) -> Sample | None:
    """``pid``'s figures from ``/proc``; None when it is gone (a helper between its kill and its successor)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        threads = len(os.listdir(f"/proc/{pid}/task"))
    except (OSError, ValueError, IndexError):
        return None
    return Sample(pid, rss, fds, threads)


def zombies(pid: int) -> list[int]:
    """The children of ``pid`` that exited and were not reaped."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == pid:
            found.append(int(entry))
    return found


def as_dict(s: Sample | None) -> dict[str, int] | None:
    return asdict(s) if s is not None else None


if __name__ == "__main__":
    print(json.dumps(client(int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), os.environ["SOAK_TOKEN"])))
