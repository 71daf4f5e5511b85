"""``memexporter top`` in a pseudo-terminal against two demo ranks, as a user runs it: a row for each
rank, the fuller one first, the module table of the selected rank, a killed rank marked (not a
traceback), and ``q`` exits with status 0. Rank 1 has a budget (``--memory-limit-mib``), so more
of its limit is in use than rank 0's, whose limit is the machine's."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.support import REPO_ROOT
from tests.support.demo import SMALL_MODEL, module_env, running_demo
from tests.support.forkserver import Process
from tests.support.ports import free_port

pytestmark = pytest.mark.integration

TINY = (*SMALL_MODEL, "--step-interval", "0.1")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\r")


class Terminal:
    """A child on a 160x60 pseudo-terminal; ``text`` is everything it printed, without escapes."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, 160, 0, 0))
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=REPO_ROOT, start_new_session=True
        )
        os.close(slave)
        self.master, self.raw = master, b""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.raw += chunk

    @property
    def text(self) -> str:
        """The output without escapes, box lines and line breaks: a cell wrapped in a narrow
        terminal reads as one line."""
        return re.sub(r"[\s│┃]+", " ", ANSI.sub("", self.raw.decode(errors="replace")))

    def wait_for(self, pattern: str, since: int = 0, timeout: float = 60.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if m := re.search(pattern, self.text[since:], re.S):
                return m
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} in the terminal:\n{self.text[-4000:]}")

    def press(self, keys: str) -> None:
        os.write(self.master, keys.encode())


@pytest.fixture
def ranks(tmp_path: Path) -> Iterator[tuple[list[int], list[Process]]]:
    ports = [free_port(), free_port()]
    with ExitStack() as stack:
        procs = [
            # Rank 0 is killed, and its helper reads how it ended from its zombie's /proc/PID/stat: its
            # parent must be this process, which reaps it late, as a launcher may; the fork server
            # reaps at once (tests/support/forkserver.py). A fresh interpreter.
            stack.enter_context(running_demo(ports[0], *TINY, env={"RANK": "0"}, log=tmp_path / "r0.log", fresh=True)),
            stack.enter_context(
                running_demo(ports[1], *TINY, "--memory-limit-mib", "4096", env={"RANK": "1"}, log=tmp_path / "r1.log")
            ),
        ]
        yield ports, procs


def test_top_shows_both_ranks_worst_first_marks_a_killed_one_and_quits_on_q(
    ranks: tuple[list[int], list[Process]],
) -> None:
    ports, procs = ranks
    term = Terminal(
        [sys.executable, "-m", "memexporter", "top", "--interval", "1", *(f"127.0.0.1:{p}" for p in ports)],
        {**module_env(), "TERM": "xterm-256color", "COLUMNS": "160", "LINES": "60"},
    )
    try:
        frame = term.wait_for(r"rank 1 .*? cpu .*? rank 0 .*? cpu ")  # rank 1 holds more of its limit: first
        assert "Traceback" not in term.text
        term.wait_for(r"modules of rank 1 .*?\(root\)|modules of rank 1 .*?blocks", since=frame.start())
        procs[0].kill()  # rank 0 goes away: its helper serves how it ended, for its grace period
        mark = len(term.text)
        term.wait_for(r"rank 0 .*?ended: killed by SIGKILL; \d+ s ago", since=mark)
        term.press("q")
        assert term.proc.wait(timeout=15) == 0
        assert "Traceback" not in term.text
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
