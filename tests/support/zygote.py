"""The fork server's process: imports torch once, then forks a child per command it is sent.

``python -m tests.support.zygote FD``, started by ``tests/support/forkserver.py`` (one per pytest
worker), with ``FD`` its end of a Unix socket pair. It imports what every ``python -m memexporter``
command pays 3 CPU-s for (torch, numpy, prometheus_client), runs no torch operation (a GNU OpenMP
pool started before a fork hangs the child's first parallel region), starts no thread, then answers
requests one at a time:

- a request is a JSON message (argv after the interpreter, the environment, the folder, whether to
  start a new session) with four descriptors: the child's stdin, stdout, stderr, and the write end of
  a pipe that carries its exit status;
- the server forks, answers the child's pid, and when it reaps the child writes its status to that
  pipe as ``subprocess.Popen.returncode`` has it (the exit code, or minus the signal) and closes it.

The child becomes the command: its own session when asked, the descriptors as 0, 1 and 2, the folder,
the environment, ``sys.path`` as ``python -m`` builds it from ``PYTHONPATH``, standard streams
rebuilt over the new descriptors (unbuffered under ``PYTHONUNBUFFERED``, as the interpreter makes
them), the default signal handlers, OpenMP's thread count from the environment. Then it runs the
module, the ``-c`` code or the script as ``__main__`` and leaves through the interpreter's own exit: ``atexit`` handlers, non-daemon
threads joined, streams flushed, as a fresh process would.

The process the worker starts forks the server and exits, so the server is no child of the worker (a
test that lists or kills the worker's children never meets it). When the socket closes (the worker
is gone), the server exits; children still running are left to
the tests that started them (each test stops its own).
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import select
import signal
import socket
import sys
import types
import warnings
from dataclasses import dataclass
from typing import Any

MAX_MESSAGE = 1 << 20
PRELOADED = ("torch", "torch.nn", "torch.optim", "torch.utils.data", "numpy", "prometheus_client", "psutil", "yaml")
"""What the server imports before it forks: third-party modules only. memexporter's own modules are
imported by each child (about 0.2 CPU-s), so the code under test is always the checkout's, as loaded
by the command, with its import-time state fresh."""


@dataclass(frozen=True)
class Command:
    """What a child runs (the request's fields)."""

    argv: list[str]  # after the interpreter: ["-m", "memexporter", "demo", ...]
    env: dict[str, str]
    cwd: str
    new_session: bool


def _base_path() -> list[str]:
    """``sys.path`` without the script folder and ``PYTHONPATH``'s entries: the interpreter's own."""
    ours = set(filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    return [p for p in sys.path[1:] if p not in ours]


def _streams(env: dict[str, str]) -> None:
    """New ``sys.stdin/stdout/stderr`` over descriptors 0-2, made as the interpreter makes them."""
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))

    def make(fd: int, mode: str, errors: str) -> io.TextIOWrapper:
        raw = io.FileIO(fd, mode, closefd=False)
        tty = raw.isatty()
        buffer: Any = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
        return io.TextIOWrapper(
            buffer, encoding="utf-8", errors=errors, line_buffering=tty, write_through=unbuffered and mode == "w"
        )

    sys.stdin = sys.__stdin__ = make(0, "r", "strict")
    sys.stdout = sys.__stdout__ = make(1, "w", "strict")
    sys.stderr = sys.__stderr__ = make(2, "w", "backslashreplace")


def become(command: Command, fds: list[int], base_path: list[str]) -> None:
    """In the forked child: turn this process into ``python ARGV`` (the module docstring), then run it.
    Leaves by raising ``SystemExit`` to the top of the module, where the interpreter exits."""
    if command.new_session:
        os.setsid()
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in fds:
        os.close(fd)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.set_wakeup_fd(-1)
    os.chdir(command.cwd)
    os.environ.clear()
    os.environ.update(command.env)
    extra = [p for p in command.env.get("PYTHONPATH", "").split(os.pathsep) if p]
    _streams(command.env)
    threads = command.env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))  # libgomp read the server's variable when it loaded
    _run(command.argv, command.cwd, [*extra, *base_path])


def _run(argv: list[str], cwd: str, path: list[str]) -> None:
    """Run ``python ARGV`` here, as the interpreter would: ``-m MODULE``, ``-c CODE`` or a script,
    with ``sys.argv`` and ``sys.path[0]`` as it sets them (``path``: the rest of ``sys.path``)."""
    import runpy

    if argv[:1] == ["-m"] and len(argv) >= 2:
        sys.path[:] = [cwd, *path]  # what `python -m` puts first: the current folder
        sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's file in argv[0]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[:1] == ["-c"] and len(argv) >= 2:
        sys.path[:] = ["", *path]
        sys.argv = ["-c", *argv[2:]]
        main = types.ModuleType("__main__")
        main.__builtins__ = builtins  # type: ignore[attr-defined]
        sys.modules["__main__"] = main
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    elif argv and not argv[0].startswith("-"):
        sys.path[:] = [os.path.dirname(os.path.abspath(argv[0])), *path]
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")
    else:
        raise SystemExit(f"zygote: cannot run python {argv!r}")
    raise SystemExit(0)


def _reap(status_pipes: dict[int, int]) -> None:
    """Write the status of every child that ended to its pipe, and close it."""
    while status_pipes:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        fd = status_pipes.pop(pid, None)
        if fd is not None:
            with contextlib.suppress(OSError):  # the client is gone
                os.write(fd, f"{code}\n".encode())
            os.close(fd)


def serve(sock: socket.socket) -> tuple[Command, list[int]] | None:
    """Answer requests until the socket closes (returns None), or, in a forked child, return what
    the child must become and its three standard descriptors."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that SIGCHLD writes to the wakeup fd
    status_pipes: dict[int, int] = {}
    sock.sendall(json.dumps({"ready": True, "pid": os.getpid()}).encode())
    while True:
        ready, _, _ = select.select([sock, wake_r], [], [], 1.0)
        if wake_r in ready:
            os.read(wake_r, 4096)
        _reap(status_pipes)
        if sock not in ready:
            continue
        try:
            message, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 4)
        except OSError:
            message, fds = b"", []
        if not message:
            return None
        request = json.loads(message)
        command = Command(request["argv"], request["env"], request["cwd"], request["new_session"])
        with warnings.catch_warnings():  # Python 3.12+ warns of torch's idle native thread: it holds no lock
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            sock.close()
            os.close(wake_r)
            os.close(wake_w)
            for fd in status_pipes.values():
                os.close(fd)
            os.close(fds[3])
            return command, fds[:3]
        for fd in fds[:3]:
            os.close(fd)
        status_pipes[pid] = fds[3]
        sock.sendall(json.dumps({"pid": pid}).encode())


def main() -> None:
    """Preload, serve, and in a child, run the command."""
    sock = socket.socket(fileno=int(sys.argv[1]))
    if os.fork() > 0:  # the launcher: the worker reaps it, and the server is no child of the worker
        os._exit(0)
    base_path = _base_path()
    for name in PRELOADED:
        __import__(name)
    todo = serve(sock)
    if todo is not None:
        become(*todo, base_path)


if __name__ == "__main__":
    main()
