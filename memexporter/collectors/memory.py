"""The OOM view, the same for every device: ``used``, ``committed`` and ``limit`` (computed in ``Scrape.views``).

A device whose reading failed (the process RSS, CUDA's ``memory_stats()``) has no view: the
others are still exported, and the collector reports the failure (``collector_success`` 0)
rather than a clean scrape with a device missing.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import Metric

from memexporter.collectors.scrape import PartialFailure, Scrape
from memexporter.metrics import families


class MemoryCollector:
    """``memexporter_memory_{used,committed,limit}_bytes`` per device, from ``Scrape.views``."""

    name = "memory"

    def collect(self, scrape: Scrape) -> Iterable[Metric]:
        rank = scrape.sources.rank
        views = scrape.views
        out = families(
            {
                "memexporter_memory_used_bytes": [((rank, d), v.used) for d, v in views.items()],
                "memexporter_memory_committed_bytes": [((rank, d), v.held) for d, v in views.items()],
                # An unknown limit (no free figure, no cap) is no series rather than a made-up one.
                "memexporter_memory_limit_bytes": [
                    ((rank, d), v.limit) for d, v in views.items() if v.limit is not None
                ],
            }
        )
        if scrape.view_failures:
            raise PartialFailure(out, scrape.view_failures)
        return out
