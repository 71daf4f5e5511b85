"""Host memory of the process and its DataLoader workers, cgroup-aware (see backends/host.py).

A figure whose read failed has no series; the others are still exported and the collector
reports the failure (``collector_success`` 0).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from memexporter.collectors.scrape import PartialFailure, Scrape
from memexporter.metrics import families


class HostCollector:
    """``memexporter_host_*`` bytes from ``HostBackend.sample()`` (psutil, capped by the cgroup): the process's
    RSS, its DataLoader workers' RSS, available and limit."""

    name = "host"

    def collect(self, scrape: Scrape) -> Iterable[Metric]:
        labels = (scrape.sources.rank,)
        h = scrape.host
        figures = {
            "memexporter_host_rss_bytes": h.rss,
            "memexporter_host_children_rss_bytes": h.children_rss,
            "memexporter_host_available_bytes": h.available,
            "memexporter_host_limit_bytes": h.limit,
        }
        out = families({name: [(labels, float(v))] if v is not None else [] for name, v in figures.items()})
        if h.failed:
            raise PartialFailure(out, h.failed)
        return out
