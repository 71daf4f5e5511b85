"""Start a subprocess with its output in a file, wait for its HTTP endpoints, stop it for sure; run a
tiny pytest suite in a fresh interpreter."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import psutil

from tests.support import REPO_ROOT
from tests.support.forkserver import Process, popen
from tests.support.ports import free_port
from tests.support.web import http_status


class ProcessError(RuntimeError):
    """A helper process exited early or never became ready; the message carries its output."""


def tail(path: Path, limit: int = 6000) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return text[-limit:]


def wait_ready(proc: Process, urls: Sequence[str], timeout: float, log: Path, what: str) -> None:
    """Poll until every URL answers 200; raise ``ProcessError`` with the log if it exits or times out."""
    deadline = time.monotonic() + timeout
    pending, last = list(urls), ""
    while pending:
        if proc.poll() is not None:
            raise ProcessError(
                f"{what} exited with code {proc.returncode} before {pending[0]} answered.\n"
                f"--- output ({log}) ---\n{tail(log)}"
            )
        if time.monotonic() > deadline:
            raise ProcessError(
                f"{what} not ready after {timeout:.0f} s: {pending[0]} answered {last!r}.\n"
                f"--- output ({log}) ---\n{tail(log)}"
            )
        last = http_status(pending[0])
        if last == "200":
            pending.pop(0)
        else:
            time.sleep(0.2)


def stop(proc: Process, grace: float = 10.0) -> None:
    """SIGTERM the process group we started (torchrun forwards it to its workers), wait, then SIGKILL;
    then the descendants outside the group: each exporter's HTTP helper runs in a session of its own
    and would otherwise serve its job's end for its grace period, holding the port."""
    if proc.poll() is not None:
        return
    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace)
    for child in descendants:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    psutil.wait_procs(descendants, timeout=grace)


@contextlib.contextmanager
def running_command(
    argv: Sequence[str],
    ready_urls: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 60.0,
    log: Path | None = None,
    what: str | None = None,
    fresh: bool = False,
    scripts: bool = False,
) -> Iterator[Process]:
    """Run ``argv`` in its own process group with stdout and stderr in ``log`` (a temporary file by
    default), yield once every URL in ``ready_urls`` answers 200, and stop the whole group on exit.
    ``ProcessError`` carries the tail of the log when it exits early or is not ready in time. A
    memexporter command is forked from the worker's zygote (``tests/support/forkserver.py``) unless
    ``fresh``: a new interpreter, for what only one shows; the test's own code too with ``scripts``."""
    what = what or Path(argv[0]).name
    with contextlib.ExitStack() as stack:
        if log is None:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="memexporter-proc-")))
            log = folder / "output.log"
        with log.open("wb") as out:
            proc = popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=cwd,
                start_new_session=True,
                fresh=fresh,
                scripts=scripts,
            )
        try:
            wait_ready(proc, ready_urls, timeout, log, what)
            yield proc
        finally:
            stop(proc)


def start_on_free_port(
    stack: contextlib.ExitStack,
    argv_for: Callable[[int], Sequence[str]],
    ready_path: str,
    log: Path,
    *,
    what: str,
    timeout: float = 60.0,
    attempts: int = 3,
) -> tuple[int, Process]:
    """Start a server on a free loopback port, entering it into ``stack`` (stopped when it
    closes). Retries with a new port when another process took the port in the meantime."""
    for attempt in range(attempts):
        port = free_port()
        try:
            proc = stack.enter_context(
                running_command(
                    argv_for(port), [f"http://127.0.0.1:{port}{ready_path}"], timeout=timeout, log=log, what=what
                )
            )
        except ProcessError as err:
            if attempt + 1 == attempts or "address already in use" not in str(err):
                raise
            continue
        return port, proc
    raise AssertionError("unreachable")


def run_tiny_suite(
    folder: Path, suite: str, conftest: str, *options: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """pytest, in a fresh interpreter, on a one-file suite written to ``folder`` (``test_tiny.py``,
    with ``conftest``): the harness tests of this suite's own plugins. Only the checkout is on the
    path, and ``folder`` is the root: the repository's pytest settings do not apply."""
    (folder / "test_tiny.py").write_text(suite, encoding="utf-8")
    (folder / "conftest.py").write_text(conftest, encoding="utf-8")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            *options,
            "--rootdir",
            str(folder),
            str(folder),
        ],
        cwd=folder,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
