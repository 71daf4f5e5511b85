"""CUDA caching-allocator series from ``torch.cuda.memory_stats()``, one call per device per scrape.

Keys vary across torch versions (``requested_bytes`` arrived in 2.1, for instance), so each
series is emitted only when its key is present: a missing key means no series, not a zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client.core import Metric

from memexporter.metrics import families
from memexporter.scrape import Scrape, cuda_label

# Contract metric name -> memory_stats() key.
KEYS: dict[str, str] = {
    "memexporter_allocator_allocated_bytes": "allocated_bytes.all.current",
    "memexporter_allocator_reserved_bytes": "reserved_bytes.all.current",
    "memexporter_allocator_active_bytes": "active_bytes.all.current",
    "memexporter_allocator_inactive_split_bytes": "inactive_split_bytes.all.current",
    "memexporter_allocator_requested_bytes": "requested_bytes.all.current",
    "memexporter_allocator_peak_allocated_bytes": "allocated_bytes.all.peak",
    "memexporter_allocator_peak_reserved_bytes": "reserved_bytes.all.peak",
    "memexporter_allocator_alloc_retries_total": "num_alloc_retries",
    "memexporter_allocator_ooms_total": "num_ooms",
    "memexporter_allocator_device_allocations_total": "num_device_alloc",
    "memexporter_allocator_device_frees_total": "num_device_free",
}


def fragmentation(stats: Mapping[str, int]) -> float | None:
    """``inactive_split_bytes / reserved_bytes`` (0..1), 0 when nothing is reserved, None if unknown."""
    split, reserved = stats.get("inactive_split_bytes.all.current"), stats.get("reserved_bytes.all.current")
    if split is None or reserved is None:
        return None
    return float(split) / reserved if reserved > 0 else 0.0


class AllocatorCollector:
    name = "allocator"

    def collect(self, scrape: Scrape) -> Iterable[Metric]:
        rank = scrape.sources.rank
        rows: dict[str, list[tuple[tuple[str, ...], float]]] = {m: [] for m in [*KEYS, "memexporter_allocator_fragmentation_ratio"]}
        for index, stats in scrape.cuda_stats.items():
            labels = (rank, cuda_label(index))
            for metric, key in KEYS.items():
                if key in stats:
                    rows[metric].append((labels, float(stats[key])))
            frag = fragmentation(stats)
            if frag is not None:
                rows["memexporter_allocator_fragmentation_ratio"].append((labels, frag))
        return families(rows)
