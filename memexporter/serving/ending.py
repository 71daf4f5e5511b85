"""How the training process ended, as far as its helper can establish it (the helper is not its parent).

Four sources, each read at the moment it can be:

- **The exit status**, from ``/proc/<pid>/stat`` (its 52nd field, ``exit_code``, as ``waitpid`` gives it),
  read the instant the job's pidfd says it exited: the process is then a zombie until its parent reaps it.
  A parent that reaps at once (a shell waiting on it) may win that race; then the status is gone for good,
  and no other process can learn it.
- **The job's last words** on the board (``board.record_end``): written at ``atexit`` (the interpreter
  ended normally; ``exception`` names an uncaught one, from ``sys.last_value``) and when the allocator's OOM
  observer fires (``cuda_oom``, with the step it happened in). A SIGKILL, ``os._exit`` or a crash writes
  none: their absence says the interpreter did not end normally.
- **The last snapshot**: ``memexporter_allocator_ooms_total`` rose after ``memexporter_steps_total`` last did
  (an OOM that no completed step followed).
- **The memory cgroup's OOM kills**: ``oom_kill`` in ``memory.events`` (cgroup v2) or ``memory.oom_control``
  (v1) of the job's cgroup, read when the helper starts and when the job ends.

``cause`` (the precedence, first that holds): ``oom_kill`` (the cgroup's OOM killer killed a process of the
job's cgroup while the job ran), ``cuda_oom`` (an uncaught CUDA out-of-memory error, or one that no step
completed after), ``signal``, ``exit``, ``unknown`` (gone without last words and without a readable status:
SIGKILL, ``os._exit``, a crash, reaped before the helper looked).
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric

from memexporter.metrics import families

_STEPS = re.compile(rb"^memexporter_steps_total\{[^}]*\} (\S+)$", re.M)
_OOMS = re.compile(rb"^memexporter_allocator_ooms_total\{[^}]*\} (\S+)$", re.M)
_OOM_ERRORS = ("OutOfMemoryError",)  # torch.OutOfMemoryError (torch.cuda.OutOfMemoryError is the same class)


@dataclass(frozen=True)
class End:
    """How the job ended: ``cause``, and ``exit_code`` / ``signal`` where established ("" where not)."""

    cause: str
    exit_code: str
    signal: str
    at: float  # Unix time the helper saw it
    how: str  # in words, for the live page

    def series(self, rank: str) -> bytes:
        """The end's rows of the spec table (``memexporter_job_end_*``) in the text format."""
        rows = families(
            {
                "memexporter_job_end_info": [((rank, self.cause, self.exit_code, self.signal), 1.0)],
                "memexporter_job_end_timestamp_seconds": [((rank,), self.at)],
            }
        )
        return generate_latest(_Rows(rows))


class _Rows:
    def __init__(self, rows: list[Metric]) -> None:
        self._rows = rows

    def collect(self) -> list[Metric]:
        return self._rows


def exit_status(
    pid: int, proc: Path = Path("/proc"), stat: bytes | None = None
) -> tuple[int | None, int | None] | None:
    """``(exit code, signal number)`` of ``pid`` while it is a zombie (one of them None), from ``stat``
    (``/proc/<pid>/stat`` as read already) or read now; None when the process is gone (reaped), still
    running, or not ours to read."""
    if stat is None:
        try:
            stat = (proc / str(pid) / "stat").read_bytes()
        except OSError:
            return None
    text = stat.decode("utf-8", "replace")
    fields = text[text.rfind(")") + 2 :].split()  # after "pid (comm) ": field 3 (state) on
    if len(fields) < 50 or fields[0] != "Z":
        return None
    status = int(fields[49])  # field 52, exit_code (Linux 3.5+), in waitpid's encoding
    if status & 0x7F:
        return None, status & 0x7F
    return (status >> 8) & 0xFF, None


def _counter(path: Path) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


class OomKills:
    """The ``oom_kill`` counter of ``pid``'s memory cgroup; ``read()`` is None where there is none."""

    def __init__(self, pid: int, root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc")) -> None:
        self.path: Path | None = None
        try:
            lines = (proc / str(pid) / "cgroup").read_text().splitlines()
        except OSError:
            return
        for line in lines:
            _, controllers, rel = [*line.split(":", 2), "", ""][:3]
            if controllers == "":
                candidate = root / rel.lstrip("/") / "memory.events"
            elif "memory" in controllers.split(","):
                candidate = root / "memory" / rel.lstrip("/") / "memory.oom_control"
            else:
                continue
            if _counter(candidate) is not None:
                self.path = candidate
                return

    def read(self) -> int | None:
        return _counter(self.path) if self.path is not None else None


class SnapshotOoms:
    """Whether the last snapshot counted an allocator OOM after the last step it counted."""

    def __init__(self) -> None:
        self._steps: float | None = None
        self._ooms_at_step = 0.0
        self.ooms = 0.0

    def seen(self, text: bytes) -> None:
        steps = sum(float(v) for v in _STEPS.findall(text))
        self.ooms = sum(float(v) for v in _OOMS.findall(text))
        if self._steps is None or steps != self._steps:
            self._steps, self._ooms_at_step = steps, self.ooms

    @property
    def since_last_step(self) -> bool:
        return self.ooms > self._ooms_at_step

    @property
    def steps(self) -> float | None:
        return self._steps


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def establish(
    status: tuple[int | None, int | None] | None,
    last_words: Mapping[str, Any] | None,
    oom_kills: tuple[int | None, int | None],
    snapshot: SnapshotOoms,
) -> End:
    """The end, from the exit status (None: not read), the job's last words (None: none), the cgroup's
    ``oom_kill`` counter at the helper's start and now, and the snapshots seen."""
    words = dict(last_words or {})
    code, sig = status if status is not None else (None, None)
    before, after = oom_kills
    killed = before is not None and after is not None and after > before
    exception = str(words.get("exception") or "")
    oom = words.get("cuda_oom")
    steps_at_end = words.get("steps", snapshot.steps)
    cuda_oom = (
        exception in _OOM_ERRORS
        or (isinstance(oom, Mapping) and (steps_at_end is None or float(oom.get("steps", -1)) >= float(steps_at_end)))
        or snapshot.since_last_step
    )
    exit_code = "" if code is None else str(code)
    sig_name = "" if sig is None else _signal_name(sig)
    if code is None and sig is None and words.get("atexit") and exception and exception != "SystemExit":
        exit_code = "1"  # an uncaught exception ends the interpreter with status 1
    if sig is not None:
        how = f"killed by {sig_name}"
    elif code is not None:
        how = f"exited with status {code}"
    elif words.get("atexit"):
        how = "exited" + (
            f" on an uncaught {exception}" if exception else " (its status was reaped before it was read)"
        )
    else:
        how = "ended without a trace: SIGKILL, os._exit or a crash (its status was reaped before it was read)"
    cause = (
        "oom_kill"
        if killed
        else "cuda_oom"
        if cuda_oom
        else "signal"
        if sig is not None
        else "exit"
        if code is not None or words.get("atexit")
        else "unknown"
    )
    if killed:
        how += f"; the memory cgroup's OOM killer killed {after - before} process(es) while it ran"  # type: ignore[operator]
    elif cuda_oom:
        how += "; a CUDA out-of-memory error was the last thing it recorded"
    return End(cause, exit_code, sig_name, time.time(), how)
