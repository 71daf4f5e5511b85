"""The server's CPU budget, and the request-rate limit of the expensive routes.

``Budget`` meters the CPU time the server's own threads spend (the acceptor and the workers: every
accept, read, parse, render and write, kernel time included, from ``time.thread_time()``) against
a share of one core. It is a token bucket in CPU seconds: ``SHARE`` seconds flow in per second,
up to ``BURST``. While it is in debt the acceptor accepts nothing (new connections wait in the
kernel's listen queue, which pushes back on the client), ``/metrics`` serves its latest render
and the other routes but ``/healthz`` answer 429. So whatever clients do, the server's average
CPU use stays near ``SHARE`` of one core, and the training thread keeps the GIL and its core.

``RateLimit`` is a plain token bucket in requests (the ``/debug`` endpoints: 429 above it).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

SHARE = 0.02  # of one core, averaged: what the server may take from the job, whatever clients do
BURST = 0.25  # CPU seconds spent at once before throttling: a burst of scrapes, a test reading every step
MAX_DEBT = 0.1  # CPU seconds: a huge answer pauses accepting for MAX_DEBT / SHARE = 5 s at most (< scrape_timeout)
RESUME = 0.001  # CPU seconds in hand before accepting again (else waking up would spend them all)


class Budget:
    """A token bucket of CPU seconds, shared by the server's threads. Thread-safe."""

    def __init__(
        self,
        share: float = SHARE,
        burst: float = BURST,
        max_debt: float = MAX_DEBT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.share, self.burst, self.max_debt, self._clock = share, burst, max_debt, clock
        self._lock = threading.Lock()
        self._level = burst
        self._at = clock()
        self._debt_at = -math.inf  # when the level was last below 0
        self.spent = 0.0  # CPU seconds charged in all (for tests and benchmarks)

    def _refill(self) -> float:
        now = self._clock()
        self._level = min(self.burst, self._level + (now - self._at) * self.share)
        self._at = now
        return self._level

    def charge(self, cpu: float) -> None:
        """``cpu`` seconds were spent; the level may go into debt, at most ``max_debt`` deep."""
        with self._lock:
            self._level = max(-self.max_debt, self._refill() - cpu)
            self.spent += cpu
            if self._level < 0:
                self._debt_at = self._at

    def wait(self, margin: float = 0.0) -> float:
        """0.0 when the budget is not in debt; else the seconds until it holds ``margin`` CPU
        seconds again (a pause that ends at 0 would be spent by the waking up alone)."""
        with self._lock:
            level = self._refill()
        return 0.0 if level >= 0 else (margin - level) / self.share

    def busy(self, within: float) -> bool:
        """In debt now, or at some time in the last ``within`` seconds."""
        with self._lock:
            return self._refill() < 0 or self._clock() - self._debt_at < within


class Meter:
    """Charges one thread's CPU time to a budget: ``tick()`` charges what the thread spent since
    the previous tick (call it from that thread only)."""

    def __init__(self, budget: Budget) -> None:
        self._budget = budget
        self._last = time.thread_time()

    def tick(self) -> None:
        now = time.thread_time()
        if now > self._last:
            self._budget.charge(now - self._last)
        self._last = now


class RateLimit:
    """A token bucket of requests: ``rate`` per second, up to ``burst`` at once. Thread-safe."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._lock = threading.Lock()
        self._tokens = burst
        self._at = clock()

    def take(self) -> float:
        """Take a token: 0.0 when one was there, else the seconds until the next one (none taken)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            if self._tokens >= 1:
                self._tokens -= 1
                return 0.0
            return (1 - self._tokens) / self.rate


def retry_after(seconds: float) -> str:
    """A ``Retry-After`` value: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))
