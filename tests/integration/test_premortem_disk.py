"""The pre-mortem's writer in real time, against a real child: an fsync that takes 3 s (as on NFS)
never holds the training thread, and a writer killed in the middle of its fsync leaves a temporary
file that the next start removes (the rest of the writer's behaviour on a misbehaving disk:
tests/unit/diagnose/test_dumps.py)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from memexporter.diagnose import writer
from memexporter.diagnose.writer import clean_stale, write_atomic
from tests.unit.diagnose.test_dumps import near_oom

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_exporter")]

REAL_FSYNC = os.fsync


def test_a_slow_fsync_does_not_hold_the_training_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def nfs_fsync(fd: int) -> None:  # 3 s per fsync, as measured on NFS; the write makes two
        time.sleep(3)
        REAL_FSYNC(fd)

    monkeypatch.setattr(os, "fsync", nfs_fsync)
    loop, premortem = near_oom(tmp_path)
    started = time.perf_counter()
    loop.run(1)  # the boundary that takes the census and hands the document over
    took = time.perf_counter() - started
    assert premortem.attempts == 1
    assert took < 2.5, f"the training thread waited {took:.1f} s (less than one fsync is the census alone)"
    assert premortem.path is None  # still being written
    assert premortem.writer.flush(30) and premortem.path is not None


def test_a_writer_killed_mid_write_leaves_a_temporary_that_the_next_start_removes(tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    pid = os.fork()
    if pid == 0:  # the child hangs in fsync (a stuck NFS server), then the OOM killer's SIGKILL comes
        try:
            os.fsync = lambda fd: time.sleep(120)  # type: ignore[assignment]
            write_atomic(str(dumps / "memexporter-premortem-rank0-pid1.json"), b"{}" * 4096)
        finally:
            os._exit(0)
    try:
        deadline = time.monotonic() + 20
        while not list(dumps.glob(".memexporter-*.tmp")) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    (left,) = list(dumps.iterdir())
    assert left.name.startswith(f".memexporter-{writer._host()}-{pid}-") and left.name.endswith(".tmp")
    assert clean_stale(str(dumps)) == [left.name]
    assert list(dumps.iterdir()) == []
