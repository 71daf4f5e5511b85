"""The channel between the job and its helper: one ``socketpair``, messages framed by length.

A message is a JSON head (a dict with ``t``, its kind) and an optional body of bytes: 8 bytes of lengths
(head, body; little-endian), the head, the body. The job sends the helper its settings (``config``), the
answers to debug requests (``answer``) and ``stop``; the helper sends how the bind went (``bound``,
``failed``), its dropped-connection counts (``stats``) and the debug requests it admitted (``debug``).
The snapshots themselves never travel here: they are on the board (``board.py``).

The socket is the helper's first sign of the job's end: when the job's process is gone, reading it
gives EOF (``Channel.receive`` returns None).

The helper sends with ``send`` (blocking, from any thread, bounded by the kernel's send timeout). The job
never blocks on its helper, which may be stopped or deadlocked with the socket's buffer full: it queues with
``post`` and writes what the socket takes with ``pump`` when ``select`` says it is writable, on its
publishing thread; past ``OUTBOX_MAX`` queued bytes a message is dropped (a debug request then times out).
"""

from __future__ import annotations

import json
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

_LENGTHS = struct.Struct("<II")
MAX_HEAD = 1 << 20
MAX_BODY = 1 << 31


SEND_TIMEOUT = 10.0  # seconds a send may wait for the other end to read (SO_SNDTIMEO: the kernel's, per call)
OUTBOX_MAX = 64 << 20  # bytes ``post`` queues for a peer that does not read; past it, messages are dropped
_CHUNK = 1 << 18  # bytes ``pump`` hands the kernel per call (about what a socketpair's buffer takes)


class Channel:
    """One end of the socketpair. ``send`` may be called from any thread; ``receive`` from one only,
    once ``select`` says the socket is readable. The socket stays blocking (a Python timeout is the
    socket's, not the call's: two threads would change each other's), with a kernel send timeout."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.setblocking(True)
        seconds = int(SEND_TIMEOUT)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", seconds, 0))
        self._send_lock = threading.Lock()
        self._buffer = bytearray()
        self._out = bytearray()  # what ``post`` queued; ``_sent`` bytes of it are written already
        self._sent = 0
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, head: dict[str, Any], body: bytes = b"") -> bool:
        """Send one message; False when the other end is gone (or did not read for ``SEND_TIMEOUT``)."""
        data = json.dumps(head, separators=(",", ":")).encode()
        with self._send_lock:
            if self.closed:
                return False
            try:
                self.sock.sendall(_LENGTHS.pack(len(data), len(body)) + data)
                if body:
                    self.sock.sendall(body)
                return True
            except OSError:
                return False

    def post(self, head: dict[str, Any], body: bytes = b"") -> bool:
        """Queue one message and write what the socket takes now, never blocking; ``pump`` writes the rest.
        False when it was dropped: the channel is closed, or it would take the queue past ``OUTBOX_MAX`` bytes
        (an empty queue takes any one message: an allocator snapshot for ``/debug/snapshot`` may be larger)."""
        data = json.dumps(head, separators=(",", ":")).encode()
        with self._send_lock:
            waiting = len(self._out) - self._sent
            if self.closed or (waiting and waiting + len(data) + len(body) > OUTBOX_MAX):
                return False
            self._out += _LENGTHS.pack(len(data), len(body)) + data
            self._out += body
        self.pump()
        return True

    @property
    def pending(self) -> int:
        """Bytes queued by ``post`` that the socket has not taken yet."""
        return len(self._out) - self._sent

    def pump(self) -> None:
        """Write queued bytes until the socket would block (``MSG_DONTWAIT``); a dead peer empties the queue."""
        with self._send_lock:
            while self._sent < len(self._out) and not self.closed:
                try:
                    self._sent += self.sock.send(self._out[self._sent : self._sent + _CHUNK], socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:  # the peer is gone: nothing queued will ever be read
                    self._sent = len(self._out)
            if self._sent == len(self._out):
                self._out.clear()
                self._sent = 0
            elif self._sent > _CHUNK and 2 * self._sent > len(self._out):  # compact now and then, not per call
                del self._out[: self._sent]
                self._sent = 0

    def receive(self) -> list[tuple[dict[str, Any], bytes]] | None:
        """Read what is there (the socket is readable: one ``recv`` that does not block) and return the
        whole messages it completes, in order; None at EOF (the other process is gone, or closed its end)."""
        try:
            data = self.sock.recv(1 << 20)
        except InterruptedError:
            return []
        except OSError:
            return None
        if not data:
            return None
        self._buffer += data
        return list(self._messages())

    def _messages(self) -> Iterator[tuple[dict[str, Any], bytes]]:
        while len(self._buffer) >= _LENGTHS.size:
            n_head, n_body = _LENGTHS.unpack_from(self._buffer)
            if n_head > MAX_HEAD or n_body > MAX_BODY:
                raise ValueError(f"memexporter: a channel message of {n_head} + {n_body} bytes")
            end = _LENGTHS.size + n_head + n_body
            if len(self._buffer) < end:
                return
            head = json.loads(bytes(self._buffer[_LENGTHS.size : _LENGTHS.size + n_head]))
            body = bytes(self._buffer[_LENGTHS.size + n_head : end])
            del self._buffer[:end]
            yield head, body

    def receive_one(self, timeout: float) -> tuple[dict[str, Any], bytes] | None:
        """Block up to ``timeout`` seconds for one message (the helper's first, ``config``); None on EOF
        or timeout."""
        end = time.monotonic() + timeout
        while True:
            messages = list(self._messages())
            if messages:
                first, rest = messages[0], messages[1:]
                for head, body in reversed(rest):  # keep any that came with it (none, in practice)
                    data = json.dumps(head, separators=(",", ":")).encode()
                    self._buffer[:0] = _LENGTHS.pack(len(data), len(body)) + data + body
                return first
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                return None
            try:
                data = self.sock.recv(1 << 20)
            except OSError:
                return None
            if not data:
                return None
            self._buffer += data

    def close(self) -> None:
        with self._send_lock:
            self.closed = True
            self.sock.close()
