"""Snapshots for an in-process ``serving.server.serve()``: the hardened server as the helper runs it, over
a registry rendered at each request (``render()``, as the job publishes it), for the tests of the server
itself (hostile clients, TLS, settings) that need no helper process."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

from prometheus_client.registry import Collector

from memexporter.serving.board import Snapshot
from memexporter.serving.job.render import render


def rendering(registry: Collector) -> Callable[[], Snapshot]:
    """A fresh snapshot of ``registry`` at each call."""
    generations = itertools.count(1)
    return lambda: Snapshot(next(generations), time.time(), render(registry, None))
