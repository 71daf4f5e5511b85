"""The publishing thread's loop (``memexporter-publish``): publish, answer the helper, supervise it.

Its turns: a snapshot every ``PUBLISH_EVERY`` seconds (or at once, woken by ``flush()``); what the helper sent
(the bind's report, its dropped-connection counts, the debug requests it admitted, answered here); what waits
to be sent to it, written when the socket takes it (``Channel.pump``: a stopped helper never holds this
thread); a ping every ``Policy.ping`` seconds, and a helper silent for ``Policy.heartbeat`` seconds killed; the
helper's exit (its channel's EOF) said once and the next one started after a backoff (``supervise.py``).
``Link`` (``link.py``) holds the state and the lifecycle around it.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any

from memexporter.config import Config
from memexporter.serving.conn import ConnectionStats
from memexporter.serving.job.binding import PortAdvice, failed, log_failure
from memexporter.serving.job.debug import Debug, answer
from memexporter.serving.job.running import Running
from memexporter.serving.job.supervise import Supervisor

PUBLISH_EVERY = 1.0  # seconds between snapshots: a scrape's figures are at most about this old
STOP_WAIT = 2.0  # seconds to wait for a helper to exit (after SIGTERM, or after its EOF), before SIGKILL


class Loop:
    """The thread's side of ``Link``: the attributes below are ``Link``'s."""

    config: Config
    advice: PortAdvice
    requested: int
    stats: ConnectionStats
    debug: Debug | None
    on_bound: Callable[[int | None], None] | None
    port: int | None
    error: OSError | None
    helper: Running | None
    supervisor: Supervisor
    _reported: threading.Event
    _lock: threading.Lock
    _closing: bool
    _served: bool
    _wake_r: int

    @property
    def url(self) -> str | None:
        raise NotImplementedError

    def _publish(self) -> None:
        raise NotImplementedError

    def _spawn(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        """The thread: until ``stop()``, or until no helper will run again."""
        policy = self.supervisor.policy
        next_publish = next_ping = time.monotonic()
        while not self._closing:
            helper = self.helper
            reads, writes = [self._wake_r], []
            if helper is not None:
                reads.append(helper.channel.fileno())
                if helper.channel.pending:
                    writes.append(helper.channel.fileno())
            restart_at = self.supervisor.restart_at
            due = min(next_publish, next_ping if helper is not None else math.inf, restart_at or math.inf)
            try:
                ready, writable, _ = select.select(reads, writes, [], max(0.0, due - time.monotonic()))
            except (OSError, ValueError):  # closed by stop()
                return
            if self._closing:
                return
            if self._wake_r in ready:
                with contextlib.suppress(OSError):
                    os.read(self._wake_r, 512)
                next_publish = time.monotonic()
            if helper is not None and writable:
                helper.channel.pump()
            if helper is not None and helper.channel.fileno() in ready:
                messages = helper.channel.receive()
                if messages is None and not self._exited(helper, hung=False):
                    return
                helper.heard()
                for head, body in messages or []:
                    self._handle(helper, head, body)
            now = time.monotonic()
            if self.helper is not None and now >= next_ping:
                next_ping = now + policy.ping
                if self.helper.silent(now, policy.heartbeat) and not self._exited(self.helper, hung=True):
                    return
                if self.helper is not None:
                    self.helper.ping(now)
            if self.supervisor.due():
                self._restart()
            if time.monotonic() >= next_publish:
                self._publish()
                next_publish = time.monotonic() + PUBLISH_EVERY

    def _handle(self, helper: Running, head: dict[str, Any], body: bytes) -> None:
        kind = head.get("t")
        if kind == "bound":
            helper.reported = True
            self.port = int(head["port"])
            if not self._served:
                self._served = True
                if self.on_bound is not None:  # before wait() returns: the "serving" line comes first
                    self.on_bound(self.port)
                self._reported.set()
        elif kind == "failed":
            helper.reported = True
            if self._served:  # a restarted helper: said with its exit, in the restart's one line
                helper.failure = str(head.get("error"))
                return
            self.error = failed(
                int(head.get("errno") or 0), str(head.get("error")), self.config, self.requested, self.advice
            )
            if not self.config.strict:
                log_failure(str(self.error.strerror))
            if self.on_bound is not None:
                self.on_bound(None)
            self._reported.set()
        elif kind == "stats":
            self.stats.set(head.get("dropped") or {})
        elif kind == "debug":
            apps = self.debug.apps if self.debug is not None else {}
            status, headers, answered = answer(apps, str(head.get("path")), str(head.get("query") or ""))
            helper.channel.post({"t": "answer", "id": head.get("id"), "status": status, "headers": headers}, answered)

    def _exited(self, helper: Running, hung: bool) -> bool:
        """The helper exited (its channel's EOF) or is ``hung`` (killed here): reap it, say so once, and plan
        the next one. False when the thread has nothing left to do (no helper will run again)."""
        code = helper.kill() if hung else helper.reap(STOP_WAIT)
        with self._lock:
            if self.helper is helper:
                self.helper = None
        if self._closing:
            return False
        if not self._served:  # the first helper never served: said once, as a failed bind is
            if not helper.reported:
                self.error = OSError(
                    0, f"memexporter: the HTTP helper exited with status {code} before serving: {helper.tail()}"
                )
                if not self.config.strict:
                    log_failure(str(self.error.strerror))
                self._reported.set()
            return False
        return self.supervisor.exited(helper, code, hung, self.url)

    def _restart(self) -> None:
        """Start the next helper: counted first and published, so that it serves the count at once."""
        self.supervisor.restarted()
        self.stats.restarted()
        self._publish()
        try:
            self._spawn()
        except OSError as exc:
            self.supervisor.failed_to_start(exc)
