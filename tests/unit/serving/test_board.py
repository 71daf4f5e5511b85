"""The snapshot board (serving/board.py): what the job publishes is what the helper reads, whole or not at
all; a publish cut short leaves the previous snapshot; the file grows under a reader; nothing is named in
/dev/shm or on disk."""

from __future__ import annotations

import errno
import os
import resource
import signal
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from memexporter.serving.board import HEADER, Board, BoardReader


@pytest.fixture
def board() -> Iterator[tuple[Board, BoardReader]]:
    b = Board(initial=256)
    reader = BoardReader(os.dup(b.fd))  # the helper's own descriptor, as pass_fds gives it
    yield b, reader
    b.close()
    os.close(reader.fd)


def test_nothing_before_the_first_publish_then_each_snapshot_whole(board: tuple[Board, BoardReader]) -> None:
    b, reader = board
    assert reader.read() is None and reader.generation() == 0 and reader.end() is None
    for n in range(1, 6):
        assert b.publish({"text": b"x" * 100 * n, "live": b"{}"}, published=float(n)) == n
        snap = reader.read()
        assert snap is not None and reader.generation() == n
        assert (snap.generation, snap.published, snap.sections) == (
            n,
            float(n),
            {"text": b"x" * 100 * n, "live": b"{}"},
        )


def test_the_file_grows_under_a_reader_that_mapped_it_smaller(board: tuple[Board, BoardReader]) -> None:
    b, reader = board
    b.publish({"text": b"small"})
    assert reader.read() is not None
    big = os.urandom(1 << 20)
    b.publish({"text": big})
    snap = reader.read()
    assert snap is not None and snap.sections["text"] == big


def test_a_publish_cut_short_leaves_the_previous_snapshot(board: tuple[Board, BoardReader]) -> None:
    b, reader = board
    b.publish({"text": b"A" * 300})
    at, length = b._active
    # A job killed while it wrote the next payload: the bytes land where the header does not point.
    target = -(-(at + length) // 4096) * 4096
    b._grow(target + 4096)
    b._map[target : target + 100] = b"\xff" * 100
    snap = reader.read()
    assert snap is not None and snap.sections == {"text": b"A" * 300}


def test_a_header_being_written_or_a_torn_payload_is_never_returned(board: tuple[Board, BoardReader]) -> None:
    b, reader = board
    b.publish({"text": b"B" * 300})
    seq = struct.unpack_from("<Q", b._map, 8)[0]
    struct.pack_into("<Q", b._map, 8, seq + 1)  # odd: the job is writing the header
    assert reader.read() is None and reader.generation() == -1
    struct.pack_into("<Q", b._map, 8, seq)
    at, _ = b._active
    b._map[at + 10 : at + 11] = b"\x00"  # a payload that no longer matches its CRC
    assert reader.read() is None


def test_a_reader_in_another_thread_sees_only_whole_snapshots(board: tuple[Board, BoardReader]) -> None:
    b, reader = board
    seen, done = [], threading.Event()

    def read() -> None:
        while not done.is_set():
            snap = reader.read()
            if snap is not None:
                seen.append(snap)

    thread = threading.Thread(target=read)
    thread.start()
    # Publish until the reader has read during the publishing, 50 times: 400 publishes could all run within
    # one GIL switch interval, the reader never scheduled (a fresh-clone run read nothing).
    n, deadline = 0, time.monotonic() + 30
    while len(seen) < 50 and time.monotonic() < deadline:
        n += 1
        b.publish({"text": bytes([n % 251]) * (n * 37 % 5000 + 1), "n": str(n).encode()})
    done.set()
    thread.join()
    assert len(seen) >= 50, f"the reader read {len(seen)} snapshots during {n} publishes"
    for snap in seen:
        n = int(snap.sections["n"])
        assert snap.sections["text"] == bytes([n % 251]) * (n * 37 % 5000 + 1) and snap.generation == n


def test_last_words_merge_and_survive_the_writer(board: tuple[Board, BoardReader]) -> None:
    b, reader = board
    b.record_end({"cuda_oom": {"steps": 4}})
    b.record_end({"atexit": True, "steps": 4})
    b.close()  # the job is gone: the helper's mapping still reads
    assert reader.end() == {"cuda_oom": {"steps": 4}, "atexit": True, "steps": 4}


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd_create is Linux's")
def test_the_board_is_anonymous_memory_named_nowhere() -> None:
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    b = Board()
    try:
        assert os.readlink(f"/proc/self/fd/{b.fd}").startswith("/memfd:memexporter-board")
        assert (set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()) == before
        assert os.fstat(b.fd).st_size >= HEADER
    finally:
        b.close()


def test_without_memfd_create_the_board_is_an_unlinked_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """A seccomp profile that refuses memfd_create (ENOSYS), as some container runtimes have."""

    def refused(name: str, flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(os, "memfd_create", refused)
    b = Board(initial=256)
    target = os.readlink(f"/proc/self/fd/{b.fd}")
    assert "memfd:" not in target and "memexporter-board-" in target and target.endswith("(deleted)"), target
    reader = BoardReader(os.dup(b.fd))
    b.publish({"text": b"# nothing\n", "live": b"{}"})
    snap = reader.read()
    assert snap is not None and snap.sections["text"] == b"# nothing\n"
    b.close()
    os.close(reader.fd)


def test_a_board_that_cannot_have_its_memory_says_so_at_once_not_with_a_sigbus_later() -> None:
    """RLIMIT_FSIZE, a real limit of the kernel (EFBIG) as a full disk is (ENOSPC): the space is reserved when
    the board is made or grown, so the error comes there, as an OSError."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (HEADER + 512, hard))
        with pytest.raises(OSError) as made:
            Board(initial=4096)
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        b = Board(initial=256)
        resource.setrlimit(resource.RLIMIT_FSIZE, (os.fstat(b.fd).st_size, hard))
        with pytest.raises(OSError) as grown:
            b.publish({"text": b"x" * 65536})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    assert made.value.errno == grown.value.errno == errno.EFBIG
    b.publish({"text": b"fits"})  # the board goes on where it can
    b.close()
