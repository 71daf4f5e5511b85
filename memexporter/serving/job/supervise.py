"""When to start the helper again after it exited or hung: the restart policy (pure: an injected clock), and
the one line that says each restart.

The job supervises its helper as systemd's ``Restart=on-failure`` with ``StartLimitBurst`` does a service, and
gunicorn's arbiter its workers: a helper that exits while the job runs (the OOM killer on a full node, an
operator's ``kill``, a crash) is started again on the same port; one that has not answered the job's heartbeat
for ``heartbeat`` seconds (stopped, deadlocked) is killed first. Restarts back off, ``first`` second doubling
to ``most``, so a helper that cannot live does not cost the job a fork and an interpreter's start every moment;
a helper that served ``steady`` seconds in a row starts the pace over. After ``burst`` restarts within
``window`` seconds the job gives up: training goes on without the endpoint, which a restart storm would not
bring back anyway.

``POLICY`` is what a new ``Link`` takes; a test swaps it for shorter times.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from memexporter.serving.job.running import Running

log = logging.getLogger("memexporter")


@dataclass(frozen=True)
class Policy:
    """Restart timing, in seconds (``burst``: a count)."""

    first: float = 1.0  # wait before the first restart: the helper answers again within ~2 s of its exit
    most: float = 60.0  # the longest wait between restarts (the doubling stops here)
    burst: int = 10  # restarts within ``window`` after which the job gives up
    window: float = 600.0
    steady: float = 60.0  # a helper up this long before it exits starts the backoff over at ``first``
    heartbeat: float = 10.0  # a helper that has not answered a ping for this long is killed and replaced
    ping: float = 1.0  # seconds between the job's pings


POLICY = Policy()


class Restarts:
    """The restarts of one job's helper: ``exited()`` says when to start the next one, or that it is over."""

    def __init__(self, policy: Policy, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy, self._clock = policy, clock
        self.count = 0  # restarts so far (memexporter_helper_restarts_total)
        self._delay = policy.first
        self._times: deque[float] = deque()  # when each restart within the window happened

    def exited(self, uptime: float) -> float | None:
        """A helper that ran ``uptime`` seconds exited (or was killed): the seconds to wait before starting the
        next one, or None when ``burst`` restarts happened within ``window`` (give up)."""
        now = self._clock()
        while self._times and now - self._times[0] >= self.policy.window:
            self._times.popleft()
        if len(self._times) >= self.policy.burst:
            return None
        if uptime >= self.policy.steady:
            self._delay = self.policy.first
        delay, self._delay = self._delay, min(self.policy.most, 2 * self._delay)
        return delay

    def restarted(self) -> int:
        """A new helper was started; returns the count of restarts so far."""
        self._times.append(self._clock())
        self.count += 1
        return self.count


class Supervisor:
    """The publishing thread's view of restarts: ``exited()`` says a helper's end and plans the next start
    (``restart_at``, monotonic seconds), or gives up."""

    def __init__(self, policy: Policy, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy, self._clock = policy, clock
        self.restarts = Restarts(policy, clock)
        self.restart_at: float | None = None

    def exited(self, helper: Running, code: int | None, hung: bool, where: str | None) -> bool:
        """Say in one line that ``helper`` exited with ``code`` (or was killed, ``hung``) and when the next one
        starts; False (said once) when it will not: ``burst`` restarts happened within ``window``."""
        policy = self.policy
        why = f"did not answer for {policy.heartbeat:g} s and was killed" if hung else f"exited with status {code}"
        if helper.failure is not None:
            why += f" (it could not bind: {helper.failure})"
        delay = self.restarts.exited(helper.uptime())
        if delay is None:
            self.restart_at = None
            log.error(
                "memexporter: the HTTP helper (pid %d) %s; it was started again %d times within %g minutes, so it "
                "is not started again: %s no longer answers for the rest of this run. Training continues. %s",
                helper.pid, why, policy.burst, policy.window / 60, where, helper.tail(),
            )  # fmt: skip
            return False
        log.error(
            "memexporter: the HTTP helper (pid %d) %s; starting another on %s in %g s (restart %d). "
            "Training continues. %s",
            helper.pid, why, where, delay, self.restarts.count + 1, helper.tail(),
        )  # fmt: skip
        self.restart_at = self._clock() + delay
        return True

    def due(self) -> bool:
        """Whether the next helper is to start now; the caller starts it (``restarted()``) or says why not."""
        return self.restart_at is not None and self._clock() >= self.restart_at

    def restarted(self) -> None:
        self.restart_at = None
        self.restarts.restarted()

    def failed_to_start(self, error: OSError) -> None:
        """The next helper could not be started (no process left, say): as an exit, with its backoff."""
        log.error("memexporter: cannot start the HTTP helper again: %s", error)
        delay = self.restarts.exited(0.0)
        self.restart_at = None if delay is None else self._clock() + delay
