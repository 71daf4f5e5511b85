"""``python -m memexporter ...`` for the tests, forked from a process that imported torch once.

Each test subprocess that runs a memexporter command spent about 3 CPU-s importing torch, some 130
of them a run. A pytest worker now starts one server (``tests/support/zygote.py``) on first use; it
imports torch and the other heavy third-party modules, then forks a child per command. The child is
a real process of its own (its pid, session, descriptors, environment, signals, exit status and
``atexit``), built as the interpreter builds one (the zygote's docstring), running the checkout's
memexporter freshly imported.

``popen`` and ``run`` stand in for ``subprocess.Popen`` and ``subprocess.run`` on such commands.
What the fork would change is run as a real subprocess instead, by ``eligible``:

- a command that is not ``python -m memexporter`` (other modules, other interpreters), nor, when the
  caller asks with ``scripts=True``, the test's own code: ``python -m tests.support.*``, ``python -c
  CODE`` or ``python script.py`` fork only where the test reads nothing of a fresh process (the healthy
  demo's runs read the RSS of fresh processes, for one);
- an environment whose interpreter or loader settings differ from the server's (``PYTHON*`` but
  the buffering and the path, ``PYTHONPATH`` beyond the checkout, ``LD_*``, ``TORCH*``, ``MALLOC*``):
  they act when the interpreter or torch starts (``CUDA_*`` act when CUDA starts, which the zygote
  never does);
- ``fresh=True``, for the tests of what a fresh interpreter alone shows: the job's end seen by its
  helper, signals to the job, its ``/proc`` children, the helper's parent-death, import costs;
- ``MEMEXPORTER_TEST_FORK=0``, for the whole run.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from tests.support import REPO_ROOT

_SAFE_PYTHON = frozenset({"PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED"})
_AT_START = ("PYTHON", "LD_", "TORCH", "MALLOC", "GLIBC")  # not CUDA_*: read when CUDA starts, never in the zygote


def _at_start(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_AT_START) and k not in _SAFE_PYTHON}


def eligible(argv: Sequence[str], env: Mapping[str, str] | None, scripts: bool = False) -> bool:
    """Whether ``argv`` (with ``env``, None: this process's) can be forked (the module docstring)."""
    if os.environ.get("MEMEXPORTER_TEST_FORK", "1") == "0" or argv[:1] != [sys.executable] or len(argv) < 2:
        return False
    if argv[1] == "-m" and len(argv) >= 3 and argv[2] == "memexporter":
        pass
    elif not scripts:
        return False
    elif argv[1] == "-m":
        if len(argv) < 3 or not argv[2].startswith("tests.support."):
            return False
    elif argv[1].startswith("-") and argv[1] != "-c":
        return False
    env = os.environ if env is None else env
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if any(p != str(REPO_ROOT) for p in path):
        return False
    return _at_start(env) == _at_start(os.environ)


class Forked:
    """A forked command, as much of ``subprocess.Popen`` as the tests use: ``pid``, ``args``,
    ``returncode``, ``poll``, ``wait``, ``communicate``, ``send_signal``, ``terminate``, ``kill``, and
    ``stdin``/``stdout``/``stderr`` where ``popen`` was given ``subprocess.PIPE`` for them (None else)."""

    def __init__(self, args: Sequence[str], pid: int, status: int, pipes: Mapping[str, IO[Any]] | None = None) -> None:
        self.args, self.pid, self._status = list(args), pid, status
        self.returncode: int | None = None
        pipes = pipes or {}
        self.stdin, self.stdout, self.stderr = (pipes.get(name) for name in ("stdin", "stdout", "stderr"))
        self._reading: dict[str, tuple[threading.Thread, list[Any]]] = {}  # communicate()'s, kept across a timeout

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        """As ``subprocess.Popen.communicate``: write ``input`` and close stdin, read stdout and stderr
        to their end (from the files, so what a ``readline()`` before read ahead is kept), and wait.
        ``subprocess.TimeoutExpired`` after ``timeout`` s; a later call goes on where it stopped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.stdin is not None and not self.stdin.closed:
            with contextlib.suppress(OSError, ValueError):  # the command exited without reading it
                if input:
                    self.stdin.write(input)
                self.stdin.close()
        for name in ("stdout", "stderr"):
            stream = getattr(self, name)
            if stream is not None and name not in self._reading:
                got: list[Any] = []
                reader = threading.Thread(target=lambda s=stream, g=got: g.append(s.read()), daemon=True)
                reader.start()
                self._reading[name] = (reader, got)
        for reader, _ in self._reading.values():
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        out = {name: got[0] if got else None for name, (_, got) in self._reading.items()}
        for name in ("stdout", "stderr"):
            stream = getattr(self, name)
            if stream is not None:
                stream.close()
        return out.get("stdout"), out.get("stderr")

    def _read(self, timeout: float | None) -> None:
        if self.returncode is not None:
            return
        ready, _, _ = select.select([self._status], [], [], timeout)
        if ready:
            text = os.read(self._status, 64).decode().strip()
            os.close(self._status)
            # An empty answer: the server died before reaping (never seen; the child is then an orphan).
            self.returncode = int(text) if text else -int(signal.SIGKILL)

    def poll(self) -> int | None:
        self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._read(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> Forked:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                with contextlib.suppress(OSError, ValueError):
                    stream.close()
        self.wait()


Process = Forked | subprocess.Popen[Any]
"""What ``popen`` returns: a forked command, or a real subprocess."""


class _Server:
    """This worker's zygote: started on first use (again if it died), asked one request at a time. It
    is no child of the worker (it leaves its launcher at once): a test that lists or kills the
    worker's children never meets it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._owner = -1
        self.pid: int | None = None  # the server's, once started

    def _start(self) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        launcher = subprocess.Popen(
            [sys.executable, "-m", "tests.support.zygote", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        theirs.close()
        launcher.wait(60)  # it forks the server and exits
        ours.settimeout(120)  # the imports, on a loaded machine
        hello = json.loads(ours.recv(1024) or b"{}")
        if hello.get("ready") is not True:
            raise RuntimeError("the fork server exited before it was ready")
        self.pid = int(hello["pid"])
        ours.settimeout(30)
        self._sock, self._owner = ours, os.getpid()
        return ours

    def _ask(self, request: bytes, fds: list[int]) -> int:
        sock = self._sock if self._sock is not None and self._owner == os.getpid() else self._start()
        socket.send_fds(sock, [request], fds)
        answer = sock.recv(1024)
        if not answer:
            raise ConnectionResetError("the fork server closed its socket")
        return int(json.loads(answer)["pid"])

    def fork(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, fds: list[int], new_session: bool) -> int:
        request = json.dumps({"argv": list(argv[1:]), "env": dict(env), "cwd": cwd, "new_session": new_session})
        with self._lock:
            try:
                return self._ask(request.encode(), fds)
            except OSError:  # the server died (killed with a process group, say): a new one, once
                if self._sock is not None:
                    self._sock.close()
                self._sock = None
                return self._ask(request.encode(), fds)


_server = _Server()


def _pipes(
    streams: dict[str, int | IO[Any] | None], text: bool
) -> tuple[dict[str, int | IO[Any] | None], dict[str, IO[Any]]]:
    """For each stream given as ``subprocess.PIPE``: a pipe, its child's end in the stream's place (a
    descriptor, for ``popen`` to close after the fork) and ours as a file, as ``subprocess`` makes it
    (text: UTF-8, stdin written through)."""
    ours: dict[str, IO[Any]] = {}
    for name, stream in streams.items():
        if stream != subprocess.PIPE:
            continue
        r, w = os.pipe()
        streams[name], mine = (r, w) if name == "stdin" else (w, r)
        raw = open(mine, "wb" if name == "stdin" else "rb")  # noqa: SIM115  # the Forked's to close
        ours[name] = io.TextIOWrapper(raw, encoding="utf-8", write_through=True) if text else raw
    return streams, ours


def _fd(stream: int | IO[Any] | None, default: int) -> tuple[int, bool]:
    """The descriptor for a standard stream (``subprocess`` conventions), and whether it is ours to close."""
    if stream is None:
        return default, False
    if stream == subprocess.DEVNULL:
        return os.open(os.devnull, os.O_RDWR), True
    if isinstance(stream, int):
        return stream, False
    return stream.fileno(), False


def popen(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stdin: int | IO[Any] | None = None,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
    start_new_session: bool = False,
    fresh: bool = False,
    scripts: bool = False,
    text: bool = False,
) -> Process:
    """``subprocess.Popen(argv, ...)``, forked from the worker's zygote where ``eligible``; a stream given
    as ``subprocess.PIPE`` is a pipe there too (``text``: a UTF-8 text file)."""
    if fresh or not eligible(argv, env, scripts):
        return subprocess.Popen(
            list(argv),
            env=None if env is None else dict(env),
            cwd=cwd,
            stdin=stdin,
            stdout=stdout,
            stderr=subprocess.STDOUT if stderr == subprocess.STDOUT else stderr,
            start_new_session=start_new_session,
            text=text,
        )
    streams, pipes = _pipes({"stdin": stdin, "stdout": stdout, "stderr": stderr}, text)
    out, close_out = _fd(streams["stdout"], 1)
    err, close_err = (out, False) if stderr == subprocess.STDOUT else _fd(streams["stderr"], 2)
    inp, close_in = _fd(streams["stdin"], 0)
    status_r, status_w = os.pipe()
    try:
        pid = _server.fork(
            argv,
            os.environ if env is None else env,
            os.fspath(cwd or os.getcwd()),
            [inp, out, err, status_w],
            start_new_session,
        )
    except BaseException:
        for stream in pipes.values():
            stream.close()
        raise
    finally:
        os.close(status_w)
        for fd, mine in ((inp, close_in), (out, close_out), (err, close_err)):
            if mine:
                os.close(fd)
        for name in pipes:  # the child's ends: it has its own copies now
            os.close(int(streams[name]))  # type: ignore[arg-type]
    return Forked(argv, pid, status_r, pipes)


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    input: str | None = None,
    timeout: float | None = None,
    fresh: bool = False,
    scripts: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True, ...)``, forked where ``eligible``. On
    ``timeout`` the command is killed and ``subprocess.TimeoutExpired`` raised, as ``subprocess.run``
    does."""
    if fresh or not eligible(argv, env, scripts):
        return subprocess.run(
            list(argv),
            env=None if env is None else dict(env),
            cwd=cwd,
            input=input,
            timeout=timeout,
            capture_output=True,
            text=True,
            check=False,
        )
    (in_r, in_w), (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe(), os.pipe()
    try:
        proc = popen(argv, env=env, cwd=cwd, stdin=in_r, stdout=out_w, stderr=err_w, scripts=scripts)
    finally:
        for fd in (in_r, out_w, err_w):
            os.close(fd)
    return _communicate(proc, in_w, {out_r: [], err_r: []}, input, timeout)


def _communicate(
    proc: Process, in_w: int, outputs: dict[int, list[bytes]], input: str | None, timeout: float | None
) -> subprocess.CompletedProcess[str]:
    """Feed ``input``, read both outputs to their end and wait, all within ``timeout``."""
    deadline = None if timeout is None else time.monotonic() + timeout
    feeder = threading.Thread(target=_feed, args=(in_w, (input or "").encode()), daemon=True)
    feeder.start()
    pending = set(outputs)
    try:
        while pending:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(proc.args, timeout or 0)
            ready, _, _ = select.select(list(pending), [], [], left)
            for fd in ready:
                chunk = os.read(fd, 65536)
                if chunk:
                    outputs[fd].append(chunk)
                else:
                    pending.discard(fd)
        proc.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    finally:
        for fd in outputs:
            os.close(fd)
    out, err = (b"".join(chunks).decode("utf-8", "replace") for chunks in outputs.values())
    return subprocess.CompletedProcess(list(proc.args), int(proc.returncode or 0), out, err)


def _feed(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):  # the command exited without reading it all
        while data:
            data = data[os.write(fd, data) :]
    os.close(fd)
