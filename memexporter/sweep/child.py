"""One run of a sweep: a fresh child process with the exporter on, watched over its ``/metrics``.

The exporter starts in the child through the environment (``spawn.child_env``), so a plain
``python train.py`` is measured with no code change, and ``memexporter demo`` / ``memexporter run``
start it themselves from the same variables. The child serves on a loopback port the sweep picks. The sweep polls ``memexporter_steps_total`` every
``Timing.poll`` seconds (less often once steps turn out slow); after K steps it ends the child the way a
user would (SIGINT, as Ctrl-C does, then SIGTERM, then SIGKILL), to its whole process group, so
launchers and workers end too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType

from memexporter.sweep.reading import Observed, parse
from memexporter.sweep.spawn import Tail, child_env, free_port

# Each poll costs the child one scrape (~2 ms of CPU with a tracked model): 10 a second is ~2 % of
# a core, and places each step change within 50 ms.
POLL_SECONDS = 0.1
MAX_POLL_SECONDS = 1.0
SPLIT_SECONDS = 1.0  # the module rows (most of the text) are parsed this often, and at the last poll
# A fast job can pass K steps between two polls (a tiny model does dozens a second), which leaves
# one step change seen and no step time. It then runs on until a second change is seen, this long
# at the most (a job stalled at step K is still ended).
STEP_TIME_WAIT_SECONDS = 2.0
BOOTSTRAP_FAILED = "memexporter bootstrap: not started"
# No proxy for a loopback scrape, whatever http_proxy says.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class Outcome:
    """What one child did. ``exit_code`` is negative for a signal, as ``Popen.returncode``;
    ``stopped_by`` says why the sweep ended it (``steps``, ``timeout``, ``interrupt``,
    ``exporter``) or is ``None`` when it exited by itself."""

    argv: list[str]
    port: int
    observed: Observed = field(default_factory=Observed)
    step_seconds: float | None = None
    exit_code: int | None = None
    stopped_by: str | None = None
    max_rss: int = 0  # bytes, ru_maxrss of the child and its waited-for descendants (wait4)
    interrupted: bool = False  # Ctrl-C reached the sweep during this run
    stderr: str = ""
    stdout: str = ""
    wall_seconds: float = 0.0


def enough(steps: int, target: int, step_seconds: float | None, waited: float) -> bool:
    """Whether a run that has seen ``steps`` of ``target`` steps can be ended: K steps and a step
    time, or K steps and ``STEP_TIME_WAIT_SECONDS`` spent waiting for one (``waited`` seconds)."""
    return steps >= target and (step_seconds is not None or waited >= STEP_TIME_WAIT_SECONDS)


class StepClock:
    """Mean seconds per step from polls: each step count change is placed halfway between the poll
    that last saw the old count and the one that saw the new, so the mean over steps ``a..b`` is
    off by at most one poll interval divided by ``b - a`` (plus the scrape time)."""

    def __init__(self) -> None:
        self._prev: tuple[float, int] | None = None
        self.first: tuple[float, int] | None = None
        self.last: tuple[float, int] | None = None

    def observe(self, t: float, steps: int) -> None:
        if self._prev is not None and steps > self._prev[1] >= 0 and steps >= 1:
            mark = ((self._prev[0] + t) / 2, steps)
            self.first = self.first or mark
            self.last = mark
        self._prev = (t, steps)

    @property
    def seconds(self) -> float | None:
        if self.first is None or self.last is None or self.last[1] <= self.first[1]:
            return None
        return (self.last[0] - self.first[0]) / (self.last[1] - self.first[1])


@dataclass(frozen=True)
class Timing:
    """Seconds: how long a run may take, how long it has to exit after SIGINT, how often it is polled."""

    timeout: float = 900.0
    grace: float = 10.0
    poll: float = POLL_SECONDS


class Child:
    """Run ``argv`` until ``steps`` steps, its exit, the timeout, or Ctrl-C (``KeyboardInterrupt``)."""

    def __init__(
        self,
        argv: Sequence[str],
        steps: int,
        timing: Timing,
        on_poll: Callable[[int], None] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.out = Outcome(list(argv), free_port())
        self.steps, self.timing = steps, timing
        self._on_poll = on_poll or (lambda _steps: None)
        self._env = child_env(self.out.port, env)
        self._clock = StepClock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._last: tuple[str, int] | None = None  # the newest scrape's text and step count
        self._split_steps = -1  # the step count of the newest scrape whose module rows were read

    def run(self) -> Outcome:
        started = time.monotonic()
        # A new session: the terminal's Ctrl-C reaches the sweep only, which then ends the child itself.
        self._proc = subprocess.Popen(
            self.out.argv,
            env=self._env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        err, out = Tail(self._proc.stderr), Tail(self._proc.stdout)
        try:
            self._watch(started, err)
        except KeyboardInterrupt:
            self.out.interrupted = True
            self._stop("interrupt")
        finally:
            if self.out.exit_code is None:  # an unexpected error: never leave the child behind
                self._stop(self.out.stopped_by or "error")
            self.out.stderr, self.out.stdout = err.text(wait=2.0), out.text(wait=2.0)
            self.out.wall_seconds = time.monotonic() - started
            self.out.step_seconds = self._clock.seconds
        return self.out

    def _watch(self, started: float, err: Tail) -> None:
        try:
            self._poll(started, err)
        finally:
            # A run that ends by itself between two reads of the module rows (a fast job, a short
            # --steps) still gets them from its last scrape: the rows read at step 0 have no
            # gradients or optimizer state yet, and were reported as 0 bytes.
            if self._last is not None and self._last[1] > self._split_steps:
                self.out.observed.add(parse(self._last[0]))
                self._split_steps = self._last[1]
            self.out.observed.split_steps = max(self._split_steps, 0)

    def _poll(self, started: float, err: Tail) -> None:
        url, seen, split_at = f"http://127.0.0.1:{self.out.port}/metrics", -1, -SPLIT_SECONDS
        reached: float | None = None  # when K steps were first seen
        while not self._reap(0.0):
            t0 = time.monotonic()
            with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
                with _OPENER.open(url, timeout=5) as resp:
                    text = resp.read().decode("utf-8", errors="replace")
                split_too = t0 - split_at >= SPLIT_SECONDS
                reading = parse(text, split_too)
                if split_too:
                    split_at = t0
                elif reading.steps >= self.steps:  # the last poll: the split must be in it
                    reading = parse(text)
                    split_too = True
                if split_too:
                    self._split_steps = reading.steps
                self._last = (text, reading.steps)
                self.out.observed.add(reading)
                self._clock.observe((t0 + time.monotonic()) / 2, reading.steps)
                self._on_poll(reading.steps)
            if self.out.observed.steps >= self.steps:
                reached = reached if reached is not None else time.monotonic()
                if enough(self.out.observed.steps, self.steps, self._clock.seconds, time.monotonic() - reached):
                    self._stop("steps")
                    return
            if err.version != seen and not self.out.observed.scrapes:
                # Before any answer only: later, it can be another rank's (port + LOCAL_RANK) failure.
                seen = err.version
                if BOOTSTRAP_FAILED in err.text():  # the child runs on, but without an exporter to read
                    self._stop("exporter")
                    return
            if time.monotonic() - started > self.timing.timeout:
                self._stop("timeout")
                return
            time.sleep(max(0.0, self._interval() - (time.monotonic() - t0)))

    def _interval(self) -> float:
        """The poll interval, or a twentieth of a step once steps are known to be slower: the
        step-time error stays within 5 % of one step, and a slow job is scraped less."""
        step, poll = self._clock.seconds, self.timing.poll
        return poll if step is None else max(poll, min(step / 20, MAX_POLL_SECONDS))

    def _signal(self, sig: int) -> None:
        assert self._proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    def _stop(self, why: str) -> None:
        """SIGINT, then SIGTERM, then SIGKILL, to the child's process group; a second Ctrl-C goes straight to SIGKILL."""
        self.out.stopped_by = self.out.stopped_by or why

        def kill_now(signum: int, frame: FrameType | None) -> None:
            self.out.interrupted = True
            self._signal(signal.SIGKILL)

        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, kill_now) if main else None
        try:
            for sig, wait in ((signal.SIGINT, self.timing.grace), (signal.SIGTERM, 5.0), (signal.SIGKILL, None)):
                if self.out.exit_code is not None:
                    break
                self._signal(sig)
                self._reap(wait)
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)

    def _reap(self, wait: float | None) -> bool:
        """Wait up to ``wait`` seconds (``None``: for ever) for the child; record its exit and peak RSS."""
        assert self._proc is not None
        if self.out.exit_code is not None:
            return True
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            pid, status, usage = os.wait4(self._proc.pid, 0 if wait is None else os.WNOHANG)
            if pid:
                self.out.exit_code = self._proc.returncode = os.waitstatus_to_exitcode(status)
                self.out.max_rss = int(usage.ru_maxrss) * (1 if sys.platform == "darwin" else 1024)  # KiB on Linux
                # Orphans of the run (workers, a launcher's children) must not hold memory into the next run.
                self._signal(signal.SIGKILL)
                return True
            if deadline is None or time.monotonic() >= deadline:
                return False
            time.sleep(min(self.timing.poll, 0.05))
