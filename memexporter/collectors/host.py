"""Host memory of the process and its DataLoader workers, cgroup-aware (see backends/host.py)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from memexporter.metrics import families
from memexporter.scrape import Scrape


class HostCollector:
    name = "host"

    def collect(self, scrape: Scrape) -> Iterable[Metric]:
        labels = (scrape.sources.rank,)
        h = scrape.host
        return families({
            "memexporter_host_rss_bytes": [(labels, float(h.rss))],
            "memexporter_host_children_rss_bytes": [(labels, float(h.children_rss))],
            "memexporter_host_available_bytes": [(labels, float(h.available))],
            "memexporter_host_limit_bytes": [(labels, float(h.limit))],
        })
