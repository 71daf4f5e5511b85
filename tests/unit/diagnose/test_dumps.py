"""The files in ``oom_dump_dir`` when the disk misbehaves: a failed write is one line naming the
write (never "the census failed" with a traceback) and is retried with backoff until it lands or
the attempts run out; the temporary files a dead writer left are removed at the next start. A slow
fsync and a writer killed mid-write, in real time: tests/integration/test_premortem_disk.py."""

from __future__ import annotations

import errno
import itertools
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

import memexporter
from memexporter.diagnose import writer
from memexporter.diagnose.dumps import RETRY_ATTEMPTS, RETRY_TICKS_MAX, CudaHooks, Premortem
from memexporter.diagnose.writer import STALE_AFTER_S
from tests.unit.diagnose.test_engine import FakeAllocator, Loop, MiB

REAL_FSYNC = os.fsync


pytestmark = pytest.mark.usefixtures("no_exporter")  # tests/support/fixtures.py


def near_oom(directory: Path | str) -> tuple[Loop, Premortem]:
    """A job at 97 % of its limit (a pre-mortem is due at the next watch tick), censuses only on demand."""
    loop = Loop(leak=False, rss_per_step=0, every=10**6)
    premortem = Premortem(loop.diagnosis, str(directory))
    loop.diagnosis.watchers.append(premortem)
    loop.host.value = replace(loop.host.value, rss=int(0.96 * 1e10), available=int(0.03 * 1e10))
    return loop, premortem


def tick(loop: Loop, premortem: Premortem, n: int = 1) -> None:
    """``n`` step boundaries (each a watch tick), each followed by the writer finishing its work."""
    for _ in range(n):
        loop.run(1)
        assert premortem.writer.flush(20)


def failing_fsync(when: Callable[[], bool], code: int = errno.ENOSPC) -> Callable[[int], None]:
    def fsync(fd: int) -> None:
        if when():
            raise OSError(code, os.strerror(code))
        REAL_FSYNC(fd)

    return fsync


def errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR and r.name == "memexporter"]


def test_a_full_disk_is_one_line_about_the_write_and_the_premortem_lands_when_space_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    full = True
    monkeypatch.setattr(os, "fsync", failing_fsync(lambda: full))
    loop, premortem = near_oom(tmp_path)
    with caplog.at_level(logging.DEBUG, logger="memexporter"):
        tick(loop, premortem)
    assert premortem.attempts == 1 and premortem.path is None and not premortem.done
    (line,) = errors(caplog)
    assert line.exc_info is None  # one line, no traceback
    assert line.getMessage().startswith(
        f"memexporter: could not write the pre-mortem to {tmp_path}/memexporter-premortem-"
    )
    assert "No space left on device (ENOSPC)" in line.getMessage() and "attempt 1 of" in line.getMessage()
    assert not [r for r in caplog.records if "census failed" in r.getMessage()]
    assert list(tmp_path.iterdir()) == []  # the temporary file went with the failed write
    full = False  # space returns
    tick(loop, premortem, 3)
    assert premortem.path is not None and premortem.attempts == 2
    assert json.loads(Path(premortem.path).read_text())["reason"].startswith("cpu: 97.0 % of the limit committed")


def test_a_dump_dir_that_became_a_file_is_retried_once_it_is_a_directory_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A real failure, also as root: a component of the path is a regular file.
    parent = tmp_path / "scratch"
    parent.write_text("someone's file")
    loop, premortem = near_oom(parent / "dumps")
    with caplog.at_level(logging.ERROR, logger="memexporter"):
        tick(loop, premortem)
    (line,) = errors(caplog)
    assert "Not a directory (ENOTDIR)" in line.getMessage() and line.exc_info is None
    parent.unlink()
    (parent / "dumps").mkdir(parents=True)
    tick(loop, premortem, 3)
    assert premortem.path is not None and Path(premortem.path).parent == parent / "dumps"


def test_a_read_only_dump_dir_is_said_and_retried(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    locked = tmp_path / "dumps"
    locked.mkdir(mode=0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as root: a mode-0500 directory is still writable (the ENOTDIR case runs instead)")
        loop, premortem = near_oom(locked)
        with caplog.at_level(logging.ERROR, logger="memexporter"):
            tick(loop, premortem)
        (line,) = errors(caplog)
        assert "Permission denied (EACCES)" in line.getMessage() and line.exc_info is None
    finally:
        locked.chmod(0o700)
    tick(loop, premortem, 3)
    assert premortem.path is not None


def test_retries_back_off_and_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(os, "fsync", failing_fsync(lambda: True))
    loop, premortem = near_oom(tmp_path)
    attempted_at: list[int] = []
    with caplog.at_level(logging.ERROR, logger="memexporter"):
        for t in range(1000):
            before = premortem.attempts
            tick(loop, premortem)
            if premortem.attempts > before:
                attempted_at.append(t)
            if premortem.done:
                break
    assert premortem.done and premortem.path is None and premortem.attempts == RETRY_ATTEMPTS
    gaps = [b - a for a, b in itertools.pairwise(attempted_at)]
    assert gaps == [min(RETRY_TICKS_MAX, 2**k) + 1 for k in range(RETRY_ATTEMPTS - 1)]
    lines = [r.getMessage() for r in errors(caplog)]
    assert len(lines) == RETRY_ATTEMPTS and f"gave up after {RETRY_ATTEMPTS} attempts" in lines[-1]
    tick(loop, premortem, 5)
    assert premortem.attempts == RETRY_ATTEMPTS  # bounded: nothing more


def test_an_oom_dump_that_cannot_be_written_is_one_line_per_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    parent = tmp_path / "scratch"
    parent.write_text("someone's file")
    loop = Loop(leak=False, rss_per_step=0)
    alloc = FakeAllocator()
    alloc.initialized = True
    hooks = CudaHooks(alloc, loop.diagnosis, str(parent / "dumps"), record_history=False)
    hooks.on_boundary(1)
    with caplog.at_level(logging.DEBUG, logger="memexporter"):
        alloc.observers[0](0, 4 * MiB, 80 * 1024 * MiB, MiB)
        assert loop.diagnosis.writer.flush(20)
    lines = errors(caplog)
    assert [r.exc_info for r in lines] == [None, None]
    assert [r.getMessage().rsplit(": ", 1)[-1] for r in lines] == ["Not a directory (ENOTDIR)"] * 2
    assert "could not write" in lines[0].getMessage() and lines[0].getMessage().count(".pickle") == 1


def test_a_failing_premortem_census_is_named_for_the_premortem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    loop, premortem = near_oom(tmp_path)

    def broken(step: int, reason: str = "", prompt: bool = False) -> None:
        raise RuntimeError("census exploded")

    monkeypatch.setattr(loop.diagnosis, "take", broken)
    with caplog.at_level(logging.ERROR, logger="memexporter"):
        tick(loop, premortem, 5)
    said = [r.getMessage() for r in errors(caplog)]
    assert said == ["memexporter: the pre-mortem (its census or document) failed; counting further failures silently"]
    assert premortem.done and loop.diagnosis.errors == 1  # not retried at every tick


def test_stale_temporary_files_are_removed_at_start(tmp_path: Path, dead_pid: int) -> None:
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    host, dead, old = writer._host(), dead_pid, time.time() - STALE_AFTER_S - 60
    files = {  # name: (age, removed?)
        f".memexporter-{host}-{dead}-k3ltq9x_.tmp": (None, True),  # this host, its writer is gone
        f".memexporter-{host}-{os.getppid()}-a1b2c3d4.tmp": (None, False),  # a live writer's
        f".memexporter-{host}-{os.getpid()}-a1b2c3d4.tmp": (old, False),  # never this process's own
        f".memexporter-other.node-{dead}-a1b2c3d4.tmp": (None, False),  # another host's, fresh: may be writing
        f".memexporter-other.node-{dead}-e5f6g7h8.tmp": (old, True),  # another host's, stale
        ".memexporter-q8w7e6r5.tmp": (old, True),  # the old naming, stale
        ".memexporter-z9y8x7w6.tmp": (None, False),  # the old naming, fresh
        "memexporter-premortem-rank0-pid1.json": (old, False),  # a finished dump is the user's
    }
    for name, (age, _) in files.items():
        (dumps / name).write_bytes(b"x")
        if age is not None:
            os.utime(dumps / name, (age, age))
    exp = memexporter.start(http=False, oom_dump_dir=str(dumps))
    assert exp.diagnostics is not None and exp.diagnostics.premortem is not None
    assert sorted(p.name for p in dumps.iterdir()) == sorted(n for n, (_, removed) in files.items() if not removed)


def test_a_premortem_after_the_largest_input_so_far_says_so_and_holds_the_input(tmp_path: Path) -> None:
    loop, premortem = near_oom(tmp_path)
    log = loop.tracker.inputs
    for elements in (1000, 4096):
        log.note(elements, elements // 4, 4)
        loop.host.value = replace(loop.host.value, rss=int(0.5e10))  # far from the limit: nothing due yet
        loop.run(1)
    assert premortem.path is None
    loop.host.value = replace(loop.host.value, rss=int(0.96 * 1e10), available=int(0.03 * 1e10))
    log.note(6000, 1500, 4)  # the step that takes it to 97 % was given the largest input so far
    tick(loop, premortem)
    assert premortem.reason is not None and premortem.reason.endswith(
        "; after the largest input so far: 6,000 elements (the largest before it: 4,096)"
    )
    assert premortem.path is not None
    doc = json.loads(Path(premortem.path).read_text())
    assert doc["input"]["largest_elements"] == 6000 and doc["input"]["largest_length"] == 1500
    assert doc["input"]["before_largest_elements"] == 4096 and doc["input"]["capacity"] == {}  # 3 steps: no claim
