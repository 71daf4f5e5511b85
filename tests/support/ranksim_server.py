"""The rank simulator's endpoints: one loopback port per rank (``base + rank``), one asyncio loop.

    with RankServers(sim) as servers:      # binds every port, serves from a background thread
        servers.targets                    # ["127.0.0.1:23000", ...] for a Prometheus config

    python -m tests.support.ranksim_server --ranks 64 [--before] [--leak all|RANK]
        serves until interrupted, printing the ports (for a look with curl or a Prometheus by hand)

Each port answers ``GET /metrics`` as memexporter does: OpenMetrics when ``Accept`` asks for it,
else text 0.0.4; gzip when ``Accept-Encoding`` allows; keep-alive. A request costs a dictionary
look-up and a write: bodies are rendered at most once per refresh interval (``RankSim.body``).

Ports are consecutive, as torchrun's ``port + LOCAL_RANK`` on one host, below the kernel's
ephemeral range (``ports.py``). Each rank holds a listening socket and, once scraped, a connection:
the file-descriptor limit is raised to what that needs, or the start fails saying ``ulimit -n``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import resource
import socket
import threading
from types import TracebackType

from tests.support.ranksim import RankSim

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TEXT = "text/plain; version=0.0.4; charset=utf-8"
SPARE_FDS = 256  # Prometheus' own files, the benchmark's clients, the TSDB
LOWEST_PORT = 10000


def ephemeral_start() -> int:
    """The first port the kernel hands to outgoing connections; ours stay below it (``ports.py``)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def ensure_fd_limit(needed: int) -> None:
    """Raise this process's soft ``RLIMIT_NOFILE`` to ``needed`` (children inherit it), or fail clearly."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < needed:
        raise RuntimeError(
            f"the rank simulator needs about {needed} open files (a listening socket and a "
            f"scrape connection per rank) but the hard limit is {hard}: raise it "
            f"(ulimit -Hn {needed} as root, or LimitNOFILE=) and run again with ulimit -n {needed}"
        )


def bind_block(count: int, host: str = "127.0.0.1", attempts: int = 50) -> list[socket.socket]:
    """``count`` listening sockets on consecutive ports, bound for real (no race with other tests)."""
    high = ephemeral_start() - count
    if high <= LOWEST_PORT:
        raise RuntimeError(f"no room for {count} consecutive ports between {LOWEST_PORT} and the ephemeral range")
    for _ in range(attempts):
        base, socks = random.randint(LOWEST_PORT, high), []
        try:
            for i in range(count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((host, base + i))
                s.listen(64)
                s.setblocking(False)
            return socks
        except OSError as err:
            for s in socks:
                s.close()
            if err.errno == 24:  # EMFILE
                raise RuntimeError(f"out of file descriptors binding {count} ports: raise ulimit -n") from err
    raise RuntimeError(f"no block of {count} consecutive free ports on {host} in {attempts} attempts")


class RankServers:
    """Serve ``sim``'s ranks on consecutive ports from a background thread (see the module doc)."""

    def __init__(self, sim: RankSim, host: str = "127.0.0.1") -> None:
        self.sim, self.host = sim, host
        self.requests = [0] * sim.ranks
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ranksim", daemon=True)
        ensure_fd_limit(2 * sim.ranks + SPARE_FDS)
        self._socks = bind_block(sim.ranks, host)
        self.base_port = self._socks[0].getsockname()[1]
        self.targets = [f"{host}:{self.base_port + r}" for r in range(sim.ranks)]

    def __enter__(self) -> RankServers:
        self.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        async def listen() -> list[asyncio.base_events.Server]:
            return [
                await asyncio.start_server(functools.partial(self._serve, rank), sock=s)
                for rank, s in enumerate(self._socks)
            ]

        self._thread.start()
        self._servers = asyncio.run_coroutine_threadsafe(listen(), self._loop).result(timeout=60)

    def stop(self) -> None:
        async def close() -> None:
            for server in self._servers:
                server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        for s in self._socks:
            s.close()

    async def _serve(self, rank: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                path = head[0].split(" ")[1] if head[0].count(" ") >= 2 else ""
                headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:] if h)}
                if path.split("?")[0] != "/metrics":
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                om = "application/openmetrics-text" in headers.get("accept", "")
                gz = "gzip" in headers.get("accept-encoding", "")
                body = self.sim.body(rank, om, gz)
                self.requests[rank] += 1
                writer.write(
                    f"HTTP/1.1 200 OK\r\nContent-Type: {OPENMETRICS if om else TEXT}\r\n"
                    f"{'Content-Encoding: gzip' + chr(13) + chr(10) if gz else ''}"
                    f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    break
        writer.close()


def main() -> None:
    import argparse
    import time

    from tests.support.rank_exposition import adapt, expositions
    from tests.support.ranksim import Template

    p = argparse.ArgumentParser(description="Serve N simulated ranks of memexporter until interrupted.")
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--before", action="store_true", help="the exposition of de4f325 (every rank exports everything)")
    p.add_argument("--leak", default="none", help="all, none or a rank (default none)")
    args = p.parse_args()
    run_id = "ranksim"
    made = expositions(args.before, args.ranks, run_id)
    sim = RankSim(
        {k: Template.parse(k, adapt(m, k, run_id)) for k, m in made.items()},
        args.ranks,
        "before" if args.before else "after",
        run_id,
    )
    sim.set_leak(args.leak if args.leak in ("all", "none") else int(args.leak))
    with RankServers(sim) as servers:
        print(f"serving {args.ranks} ranks on {servers.targets[0]} .. {servers.targets[-1]}; Ctrl-C stops", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)


if __name__ == "__main__":
    main()
