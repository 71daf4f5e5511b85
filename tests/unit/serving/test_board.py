"""The snapshot board (serving/board.py): what the job publishes is what the helper reads, whole or not at
all; a publish cut short leaves the previous snapshot; the file grows under a reader; nothing is named in
/dev/shm or on disk."""

from __future__ import annotations

import os
import struct
import threading
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
    for n in range(1, 400):
        b.publish({"text": bytes([n % 251]) * (n * 37 % 5000 + 1), "n": str(n).encode()})
    done.set()
    thread.join()
    assert seen
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
