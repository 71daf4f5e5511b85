"""What the job publishes: one collection of the registry, rendered as the bodies the helper serves.

``text``: the Prometheus text format 0.0.4 (``prometheus_client.generate_latest``); the helper derives
OpenMetrics and the ``?name[]=`` filter from it (``serving/textformat.py``), and gzips. ``live``: the live
page's JSON (``live.py``), from the same collection, so the page and ``/metrics`` agree. One collection and
two encodings a publish: on the launch-bound stand-in with 126 tracked modules, about 4 ms of CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from memexporter.serving.job.live import encode
from memexporter.tracking.history import History


class _Collected:
    """The families of one collection, as a collector ``generate_latest`` can walk."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def render(
    registry: Collector, history: History | None, levers: list[dict[str, Any]] | None = None
) -> dict[str, bytes]:
    """The sections of one snapshot: ``text`` and ``live`` (with ``levers``: what would fit, largest first)."""
    families = list(registry.collect())
    return {"text": generate_latest(_Collected(families)), "live": encode(families, history, levers)}
