"""The snapshot board: the shared memory through which the job hands its renders to the helper.

One anonymous file (``memfd_create``; elsewhere an unlinked temporary file) that the job creates,
maps read-write and passes to the helper, which maps it read-only. Nothing is ever named in
``/dev/shm`` or on disk: the memory is freed when the last of the two processes holding it exits,
whichever dies first and however.

Layout (little-endian; ``HEADER`` bytes of header, then the payloads):

- the snapshot's header, under a seqlock (``seq`` odd while the job writes it): the generation, when
  it was published (wall-clock seconds), and the active payload's offset, length and CRC-32;
- the job's last words (``record_end``: how it is ending, as far as it can tell), under their own seqlock.

The job writes each new payload where it cannot touch the active one (double buffering), then flips the
header. A reader retries while ``seq`` is odd or changed under it, and checks the CRC, so it never returns a
torn snapshot, even on a CPU that orders stores weakly; and a job killed in the middle of a publish leaves
the previous snapshot whole. A payload is named sections (``text``, ``live``...), indexed by a JSON head.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
import tempfile
import threading
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAGIC = b"MEMXPB01"
HEADER = 4096
END_MAX = 2048  # bytes of the job's last words (JSON)
_SNAP = struct.Struct("<QQdQQI")  # seq, generation, published, offset, length, crc  (at 8)
_END = struct.Struct("<QII")  # seq, length, crc  (at _END_AT)
_END_AT = 64
_ALIGN = 4096
_TRIES = 1000


@dataclass(frozen=True)
class Snapshot:
    """One published snapshot: ``generation`` (1, 2, ...), ``published`` (wall-clock seconds) and its
    sections by name (``text``: the Prometheus text exposition; ``live``: the live page's JSON)."""

    generation: int
    published: float
    sections: Mapping[str, bytes]


def _pack(sections: Mapping[str, bytes]) -> bytes:
    index, at = {}, 0
    for name, body in sections.items():
        index[name] = [at, len(body)]
        at += len(body)
    head = json.dumps(index).encode()
    return struct.pack("<I", len(head)) + head + b"".join(sections.values())


def _unpack(payload: bytes) -> dict[str, bytes]:
    (n,) = struct.unpack_from("<I", payload)
    base = 4 + n
    return {name: payload[base + at : base + at + size] for name, (at, size) in json.loads(payload[4:base]).items()}


class Board:
    """The job's side: ``publish()`` a snapshot, ``record_end()`` its last words. Thread-safe. ``fd`` goes
    to the helper (inheritable only through ``pass_fds``)."""

    def __init__(self, initial: int = 1 << 20) -> None:
        """``OSError`` when the memory cannot be had (``ENOSPC``, ``EPERM``, ``EFBIG``...): the job then serves
        no HTTP (``job/starting.py``)."""
        self.fd = _anonymous()
        try:
            _reserve(self.fd, HEADER + initial)
            self._map = mmap.mmap(self.fd, HEADER + initial)
        except BaseException:
            os.close(self.fd)
            raise
        self._size = HEADER + initial
        self._map[:8] = MAGIC
        self._lock = threading.Lock()
        self._generation = 0
        self._active = (HEADER, 0)  # offset, length of the payload the header points at
        self._end_seq = 0
        self.closed = False

    @property
    def generation(self) -> int:
        """The generation of the latest snapshot published (0: none yet)."""
        return self._generation

    def publish(self, sections: Mapping[str, bytes], published: float | None = None) -> int:
        """Write ``sections`` as the next snapshot; returns its generation."""
        payload = _pack(sections)
        with self._lock:
            if self.closed:
                return self._generation
            at, length = self._active
            target = HEADER if at >= HEADER + len(payload) else -(-(at + length) // _ALIGN) * _ALIGN
            if target + len(payload) > self._size:
                self._grow(2 * (target + len(payload)))
            self._map[target : target + len(payload)] = payload
            self._generation += 1
            seq = self._seq() + 1
            struct.pack_into("<Q", self._map, 8, seq)  # odd: the header is being written
            struct.pack_into(
                "<QQdQQI",
                self._map,
                8,
                seq,
                self._generation,
                time.time() if published is None else published,
                target,
                len(payload),
                zlib.crc32(payload),
            )
            struct.pack_into("<Q", self._map, 8, seq + 1)
            self._active = (target, len(payload))
            return self._generation

    def record_end(self, record: Mapping[str, Any]) -> None:
        """Write the job's last words (``ending.py`` reads them): merged into what was recorded before."""
        with self._lock:
            if self.closed:
                return
            merged = {**(read_end(self._map) or {}), **record}
            body = json.dumps(merged, separators=(",", ":")).encode()[:END_MAX]
            self._end_seq += 1
            struct.pack_into("<Q", self._map, _END_AT, 2 * self._end_seq - 1)
            self._map[_END_AT + _END.size : _END_AT + _END.size + len(body)] = body
            struct.pack_into("<QII", self._map, _END_AT, 2 * self._end_seq, len(body), zlib.crc32(body))

    def _seq(self) -> int:
        return int(struct.unpack_from("<Q", self._map, 8)[0])

    def _grow(self, size: int) -> None:
        _reserve(self.fd, size)  # the file grows, nothing moves: the active payload stays where it is
        self._map.close()
        self._map = mmap.mmap(self.fd, size)
        self._size = size

    def close_in_child(self) -> None:
        """In a forked child: drop the inherited mapping and descriptor, without the lock (the
        parent's publishing thread may have held it at the fork; it does not exist here)."""
        self.closed = True
        with contextlib.suppress(OSError, ValueError):
            self._map.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def close(self) -> None:
        """Unmap and close (the helper keeps its own mapping)."""
        with self._lock:
            if not self.closed:
                self.closed = True
                self._map.close()
                os.close(self.fd)


def _anonymous() -> int:
    """``memfd_create``; where the kernel has none (before 3.17, macOS) or refuses it (a seccomp profile: ENOSYS,
    EPERM), an unlinked temporary file, as anonymous."""
    try:
        return os.memfd_create("memexporter-board", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        return _unlinked()


def _unlinked() -> int:
    fd, path = tempfile.mkstemp(prefix="memexporter-board-")
    os.unlink(path)
    return fd


def _reserve(fd: int, size: int) -> None:
    """Make the file ``size`` bytes long with its blocks allocated now: a full file system (``ENOSPC``) or a
    limit (``EFBIG``) is then an ``OSError`` here, never a ``SIGBUS`` on a later write to the mapping."""
    current = os.fstat(fd).st_size
    if size <= current:
        return
    if hasattr(os, "posix_fallocate"):
        os.posix_fallocate(fd, current, size - current)
    else:  # macOS: no posix_fallocate (its file systems allocate on write)
        os.ftruncate(fd, size)


def read_end(view: Any) -> dict[str, Any] | None:
    """The job's last words in a mapped board, or None when it wrote none (or they do not read whole)."""
    for _ in range(_TRIES):
        seq, length, crc = _END.unpack_from(view, _END_AT)
        if seq == 0:
            return None
        if seq % 2 == 0 and length <= END_MAX:
            body = bytes(view[_END_AT + _END.size : _END_AT + _END.size + length])
            if _END.unpack_from(view, _END_AT)[0] == seq and zlib.crc32(body) == crc:
                value = json.loads(body)
                return value if isinstance(value, dict) else None
        time.sleep(0)
    return None


class BoardReader:
    """The helper's side: the latest whole snapshot, read-only."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._map: mmap.mmap | None = None
        self._mapped = 0

    def _view(self) -> mmap.mmap:
        size = os.fstat(self.fd).st_size
        if self._map is None or size != self._mapped:
            if self._map is not None:
                self._map.close()
            self._map = mmap.mmap(self.fd, size, access=mmap.ACCESS_READ)
            self._mapped = size
            if self._map[:8] != MAGIC:
                raise ValueError("memexporter: not a snapshot board")
        return self._map

    def generation(self) -> int:
        """The latest snapshot's generation (0: none yet; -1: the header is being written), without
        copying it."""
        seq, generation = struct.unpack_from("<QQ", self._view(), 8)
        return -1 if seq % 2 else int(generation)

    def read(self) -> Snapshot | None:
        """The latest snapshot, or None before the first."""
        for _ in range(_TRIES):
            view = self._view()
            seq, generation, published, at, length, crc = _SNAP.unpack_from(view, 8)
            if seq == 0:
                return None
            if seq % 2 == 0 and at + length <= self._mapped:
                payload = bytes(view[at : at + length])
                if _SNAP.unpack_from(view, 8)[0] == seq and zlib.crc32(payload) == crc:
                    return Snapshot(generation, published, _unpack(payload))
            time.sleep(0)  # the job is writing the header, or grew the file under us: look again
        return None

    def end(self) -> dict[str, Any] | None:
        """The job's last words, if it wrote any."""
        return read_end(self._view())
