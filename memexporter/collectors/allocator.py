"""Caching-allocator series from ``memory_stats()``, one call per device per scrape: torch.cuda's on
NVIDIA and ROCm, torch.xpu's on Intel, and MPS's figures in the same vocabulary (backends/mps.py).

Keys vary across torch versions (torch 1.13 reports neither ``requested_bytes`` nor
``num_device_alloc``), so each series is emitted only when its key is present: a missing key means
no series, not a zero. Under ``cudaMallocAsync`` the driver's pool answers only allocated, active
and reserved bytes; torch reports the native allocator's other statistics as zeros there, so
they, and the fragmentation ratio built on them, are not exported rather than exported as zeros
that look measured. A pluggable allocator reports nothing: only ``allocator_info`` says why. The pinned host memory
of the host caching allocator comes with them (``host_memory_stats()``, torch 2.6 and later).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client.core import Metric

from memexporter.backends.base import ALLOCATOR_ASYNC
from memexporter.collectors.scrape import Scrape
from memexporter.metrics import families

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
FRAGMENTATION = "memexporter_allocator_fragmentation_ratio"
INFO = "memexporter_allocator_info"

# Measured by the native caching allocator only; cudaMallocAsync leaves them at zero
# (c10/cuda/CUDAMallocAsyncAllocator.cpp, getDeviceStats: "Many stat types are specific to the
# native allocator ... Their struct Stats will contain zeroed values").
NATIVE_ONLY: frozenset[str] = frozenset(
    {
        "memexporter_allocator_inactive_split_bytes",
        "memexporter_allocator_requested_bytes",
        "memexporter_allocator_alloc_retries_total",
        "memexporter_allocator_ooms_total",
        "memexporter_allocator_device_allocations_total",
        "memexporter_allocator_device_frees_total",
        FRAGMENTATION,
    }
)


def fragmentation(stats: Mapping[str, int]) -> float | None:
    """``inactive_split_bytes / reserved_bytes`` (0..1), 0 when nothing is reserved, None if unknown."""
    split, reserved = stats.get("inactive_split_bytes.all.current"), stats.get("reserved_bytes.all.current")
    if split is None or reserved is None:
        return None
    return float(split) / reserved if reserved > 0 else 0.0


# The pinned host caching allocator (torch.cuda.host_memory_stats()): metric -> key.
PINNED: dict[str, str] = {
    "memexporter_host_pinned_bytes": "allocated_bytes.current",
    "memexporter_host_pinned_active_bytes": "active_bytes.current",
}


class AllocatorCollector:
    """The caching allocator per device: ``memexporter_allocator_*`` from ``memory_stats()`` (``KEYS``: bytes
    and counts; the fragmentation ratio; ``allocator_info``), and ``memexporter_host_pinned_*`` bytes from
    ``host_memory_stats()``. No series when no accelerator device reports."""

    name = "allocator"

    def collect(self, scrape: Scrape) -> Iterable[Metric]:
        rank = scrape.sources.rank
        rows: dict[str, list[tuple[tuple[str, ...], float]]] = {m: [] for m in [*KEYS, FRAGMENTATION, INFO, *PINNED]}
        if not scrape.allocator_stats:
            return []
        pinned = scrape.sources.allocator.host_pinned_stats()
        for metric, key in PINNED.items():
            if key in pinned:
                rows[metric].append(((rank,), float(pinned[key])))
        backend = scrape.allocator_backend
        skip = NATIVE_ONLY if backend == ALLOCATOR_ASYNC else frozenset()
        for index, stats in scrape.allocator_stats.items():
            labels = (rank, scrape.label(index))
            rows[INFO].append(((*labels, backend), 1.0))
            for metric, key in KEYS.items():
                if key in stats and metric not in skip:
                    rows[metric].append((labels, float(stats[key])))
            frag = fragmentation(stats)
            if frag is not None and FRAGMENTATION not in skip:
                rows[FRAGMENTATION].append((labels, frag))
        return families(rows)
