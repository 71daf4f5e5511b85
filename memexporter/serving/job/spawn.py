"""Starting the helper: a fresh interpreter, never a fork of the job.

``sys.executable -I -c BOOT <channel fd> <board fd> <paths>``: isolated mode (no ``PYTHON*`` variable, no
user site, no script folder on ``sys.path``; so no ``sitecustomize`` autostart either), in a session of its
own (the terminal's signals are the job's), with an environment of what an interpreter needs to start
(``KEEP``) and nothing else: no copy of the job's secrets. It gets exactly two descriptors (``pass_fds``):
its end of the channel and the board. ``sys.path`` gets the folders this job imports memexporter and
prometheus_client from, so a checkout on ``PYTHONPATH`` works as an installed package does. Its stderr
goes to an unlinked temporary file, read only when it fails (nothing reaches the job's terminal).

``Popen`` forks or vforks and then executes at once: no Python runs in the child before ``exec``, so this
is safe from a process with threads, and the job's memory is never copied.

``sys.executable`` is not always a Python: a frozen application (PyInstaller, cx_Freeze: ``sys.frozen``) is
its own executable, and an embedding program (uWSGI, a game engine) may name itself or nothing. Running that
would start a second copy of the job, so ``check_interpreter`` refuses it first (``Unrunnable``).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

import prometheus_client

from memexporter.serving.channel import Channel

BOOT = (
    "import sys; sys.path[:0] = sys.argv[3:]; from memexporter.serving.helper import main; "
    "sys.exit(main(sys.argv[1:3]))"
)
KEEP = ("PATH", "LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH", "SYSTEMROOT", "TMPDIR", "LANG", "LC_ALL")


_PYTHON = re.compile(r"(python|pypy)", re.IGNORECASE)  # python, python3.12, python3.exe, pypy3...


class Unrunnable(OSError):
    """``sys.executable`` is not an interpreter that can run the helper; the message says why."""


def check_interpreter(executable: str | None = None) -> None:
    """``Unrunnable`` when ``executable`` (``sys.executable``) is a frozen application, empty, or not named as a
    Python interpreter: running it could start a second copy of the job."""
    executable = sys.executable if executable is None else executable
    if getattr(sys, "frozen", False):
        raise Unrunnable(f"this is a frozen application: sys.executable ({executable}) is the application itself")
    if not executable:
        raise Unrunnable("sys.executable is empty (an embedded interpreter)")
    if not _PYTHON.match(executable.replace("\\", "/").rsplit("/", 1)[-1]):  # either separator, on any OS
        raise Unrunnable(
            f"sys.executable ({executable}) is not a Python interpreter (an embedded interpreter or a frozen "
            "application, whose executable would run a second copy of the job)"
        )


def paths() -> list[str]:
    """Where this job imports memexporter and prometheus_client from."""
    roots = [Path(__file__).resolve().parents[3], Path(prometheus_client.__file__).resolve().parents[1]]
    return list(dict.fromkeys(str(p) for p in roots))


def command(channel_fd: int, board_fd: int) -> list[str]:
    """The helper's command line (no secret on it: ``/proc/PID/cmdline`` is world-readable)."""
    return [sys.executable, "-I", "-c", BOOT, str(channel_fd), str(board_fd), *paths()]


def spawn(board_fd: int) -> tuple[subprocess.Popen[bytes], Channel, IO[bytes]]:
    """Start the helper: its process, the job's end of the channel, and the file its stderr goes to.
    ``OSError`` when it cannot be started (no interpreter at ``sys.executable``, no process left);
    ``Unrunnable`` when ``sys.executable`` is not a Python (nothing is run)."""
    check_interpreter()
    ours, theirs = socket.socketpair()
    errors = tempfile.TemporaryFile(prefix="memexporter-helper-")  # noqa: SIM115 - the link owns and closes it
    try:
        proc = subprocess.Popen(
            command(theirs.fileno(), board_fd),
            pass_fds=(theirs.fileno(), board_fd),
            env={k: os.environ[k] for k in KEEP if k in os.environ},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=errors,
            start_new_session=True,
        )
    except BaseException:
        ours.close()
        errors.close()
        raise
    finally:
        theirs.close()
    return proc, Channel(ours), errors


def tail(errors: IO[bytes], lines: int = 5) -> str:
    """The last ``lines`` lines the helper wrote on its stderr, on one line."""
    try:
        errors.seek(0)
        text = errors.read()[-4096:].decode("utf-8", "replace")
    except (OSError, ValueError):
        return ""
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])
