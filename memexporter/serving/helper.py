"""The helper process: the HTTP server of one training process, in a process of its own.

Started by the job (``job/spawn.py``: ``python -I -c BOOT <channel fd> <board fd> <paths>``, a fresh
interpreter, never a fork of the job; it never imports torch, and a test reads its imports). It binds the
port, reports how that went, and serves every route from the snapshots the job publishes on the board
(``board.py``), with the same hardened server as before (``server.py``: listener, workers, CPU budget,
router); debug requests go to the job (``forward.py``). A scrape runs no Python in the training process.

When the job ends (``parent.py``) it establishes how (``ending.py``), serves the last snapshot with the
end's series for ``grace`` seconds (default two scrapes at a 30 s interval, and some slack), then exits. It
exits at once on SIGTERM (``stop()``), when a restarted job asks for its port (``handover.py``), and when it
cannot bind (after saying why). Ctrl-C at the terminal is the job's to handle: it starts in a session of its
own, and ignores SIGINT.
"""

from __future__ import annotations

import errno
import json
import selectors
import signal
import socket
import sys
import threading
import time
from typing import Any

from memexporter.serving import handover
from memexporter.serving.board import BoardReader, Snapshot
from memexporter.serving.channel import Channel
from memexporter.serving.conn import ConnectionStats
from memexporter.serving.ending import End, OomKills, SnapshotOoms, establish, exit_status
from memexporter.serving.forward import Forwarder, debug_routes
from memexporter.serving.parent import Parent
from memexporter.serving.server import Server, listening_socket, serve
from memexporter.serving.textformat import append

CONFIG_WAIT = 30.0  # seconds to wait for the job's settings before giving up
GRACE = 65.0  # seconds served after the job's end: two scrapes at a 30 s interval, and slack
TICK = 1.0  # seconds between the loop's looks at the job, the board and the counts
HANDOVER_WAIT = 2.0  # seconds to retry the bind after the previous holder agreed to leave


class View:
    """The snapshot the routes serve: the board's latest, or once the job has ended, the last one with
    the end's series (``memexporter_job_end_*``) appended and the end in the live page's data."""

    def __init__(self, reader: BoardReader, rank: str) -> None:
        self._reader, self._rank = reader, rank
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self.ended: End | None = None
        self.ooms = SnapshotOoms()

    def __call__(self) -> Snapshot | None:
        with self._lock:
            if self.ended is None and (
                self._snapshot is None or self._reader.generation() != self._snapshot.generation
            ):
                snapshot = self._reader.read()
                if snapshot is not None:
                    self._snapshot = snapshot
                    self.ooms.seen(snapshot.sections.get("text", b""))
            return self._snapshot

    def end(self, end: End) -> None:
        """From now on, serve the end too."""
        self()
        with self._lock:
            last = self._snapshot
            sections = dict(last.sections) if last is not None else {"text": b"", "live": b"{}"}
            sections["text"] = append(sections.get("text", b""), end.series(self._rank))
            live = json.loads(sections.get("live") or b"{}")
            live["job_end"] = {"cause": end.cause, "exit_code": end.exit_code, "signal": end.signal, "how": end.how}
            live["job_end"]["at"] = end.at
            sections["live"] = json.dumps(live, separators=(",", ":")).encode()
            self._snapshot = Snapshot(last.generation if last else 0, last.published if last else end.at, sections)
            self.ended = end


def bind(addr: str, port: int) -> socket.socket:
    """The listening socket; a port held by an ended job's helper is asked for (``handover.py``)."""
    try:
        return listening_socket(addr, port)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE or port == 0 or not handover.ask(port):
            raise
    end = time.monotonic() + HANDOVER_WAIT
    while True:
        try:
            return listening_socket(addr, port)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() > end:
                raise
            time.sleep(0.05)


class Helper:
    """The loop: the channel, the job's end, the handover offer, the counts sent to the job."""

    def __init__(self, channel: Channel, config: dict[str, Any], view: View, server: Server, parent: Parent) -> None:
        self.channel, self.config, self.view, self.server, self.parent = channel, config, view, server, parent
        self.oom_kills = OomKills(self.parent.pid)
        self.oom_kills_before = self.oom_kills.read()
        self.forwarder: Forwarder | None = None
        self.grace = float(config.get("grace", GRACE))
        self._sent: dict[str, int] = {}

    def run(self, reader: BoardReader) -> int:
        sel = selectors.DefaultSelector()
        sel.register(self.channel.sock, selectors.EVENT_READ, "channel")
        for fd in self.parent.fds():
            sel.register(fd, selectors.EVENT_READ, "parent")
        offer = handover.Offer(self.server.port)
        if offer.sock is not None:
            sel.register(offer.sock, selectors.EVENT_READ, "offer")
        channel_open, next_tick = True, 0.0
        try:
            while True:
                ended = self.view.ended
                if ended is None:
                    timeout = 0.01 if not channel_open else max(0.0, next_tick - time.monotonic())
                else:
                    timeout = max(0.0, ended.at + self.grace - time.time())
                    if timeout == 0.0:
                        return 0
                events = sel.select(timeout)
                if ended is None and self.parent.gone():
                    self._ended(reader)  # at once: the exit status is readable only until the parent reaps
                    continue
                for key, _ in events:
                    if key.data == "channel":
                        messages = self.channel.receive()
                        if messages is None:
                            sel.unregister(self.channel.sock)
                            channel_open = False
                        elif any(head.get("t") == "stop" for head, _ in messages):
                            return 0
                        for head, body in messages or []:
                            if head.get("t") == "answer" and self.forwarder is not None:
                                self.forwarder.answered(head, body)
                            elif head.get("t") == "ping":  # the job's heartbeat: this loop still turns
                                self.channel.send({"t": "pong"})
                    elif key.data == "parent":
                        self.parent.drain()
                    elif key.data == "offer" and offer.answer(lambda: self.view.ended is not None, self.server.stop):
                        return 0
                if ended is None and time.monotonic() >= next_tick:
                    next_tick = time.monotonic() + TICK
                    self.view()  # follow the snapshots (the OOM count against the steps)
                    if channel_open and (dropped := self.server.stats.dropped()) != self._sent:
                        self._sent = dropped if self.channel.send({"t": "stats", "dropped": dropped}) else self._sent
        finally:
            offer.close()
            self.server.stop()

    def _ended(self, reader: BoardReader) -> None:
        status = exit_status(self.parent.pid, stat=self.parent.stat)
        if status is None and self.parent.stat is None:  # no pidfd: read it now (it may have been reaped)
            status = exit_status(self.parent.pid)
        end = establish(status, reader.end(), (self.oom_kills_before, self.oom_kills.read()), self.view.ooms)
        self.view.end(end)
        if self.forwarder is not None:
            self.forwarder.job_gone()


def main(argv: list[str]) -> int:
    """``argv``: the channel's and the board's descriptors. Returns the exit status."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C is the job's to handle
    channel = Channel(socket.socket(fileno=int(argv[0])))
    reader = BoardReader(int(argv[1]))
    got = channel.receive_one(CONFIG_WAIT)
    if got is None or got[0].get("t") != "config":
        return 2
    config = got[0]
    parent = Parent(int(config["pid"]))  # first: its pidfd must name the job, not a later process with its pid
    view = View(reader, str(config.get("rank", "0")))
    forwarder = Forwarder(channel)
    debug = config.get("debug") or {}
    routes = debug_routes(
        debug.get("routes", {}), forwarder, debug.get("allow", []), debug.get("token"), debug.get("hint", "")
    )
    try:
        sock = bind(str(config["addr"]), int(config["port"]))
        server = serve(
            view,
            int(config["port"]),
            str(config["addr"]),
            config.get("certfile"),
            config.get("keyfile"),
            routes=routes,
            stats=ConnectionStats(),
            sock=sock,
        )
    except ValueError as exc:
        channel.send({"t": "failed", "errno": 0, "error": str(exc)})
        return 1
    except OSError as exc:
        channel.send({"t": "failed", "errno": exc.errno or 0, "error": exc.strerror or str(exc)})
        return 1
    helper = Helper(channel, config, view, server, parent)
    helper.forwarder = forwarder
    channel.send({"t": "bound", "port": server.port})
    return helper.run(reader)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
