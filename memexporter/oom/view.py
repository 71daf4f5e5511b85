"""The OOM view of a device: the bytes in use and the most they can reach before an OOM (DESIGN.md §4).

Pure functions of what the backends read; ``collectors.scrape.Scrape.views`` calls them once per
scrape. The limit is ``None`` when it cannot be known: no guessed limit is ever exported.
"""

from __future__ import annotations

from dataclasses import dataclass

from memexporter.backends.base import HostSample


@dataclass(frozen=True)
class MemoryView:
    """One device: ``used`` bytes, and the ``limit`` in bytes they can reach (``None``: unknown)."""

    used: float
    limit: float | None


def host_view(host: HostSample) -> tuple[MemoryView | None, list[str]]:
    """cpu: the process RSS against RSS + available memory (cgroup-aware); what could not be read."""
    if host.rss is None:
        return None, ["cpu: the process RSS could not be read"]
    if host.available is None:
        return MemoryView(float(host.rss), None), ["cpu: the available memory could not be read (no limit)"]
    return MemoryView(float(host.rss), float(host.rss + host.available)), []


def device_limit(reserved: int, free: int | None, fraction: float, total: int | None) -> float | None:
    """Reserved + device free (the driver library's, else the allocator's ``mem_get_info``), capped
    by ``fraction`` x the allocator's ``total`` when a per-process fraction under 1 is set.

    The allocator refuses to reserve beyond ``fraction * get_device_properties().total_memory``
    (the CUDA total, smaller than NVML's), whatever the device has free. ``None`` when neither a
    free figure nor a cap is known. On MPS the backend's ``mem_get_info`` answers the room left
    under ``recommended_max_memory`` (backends/mps.py), so the limit is that figure.
    """
    limit = float(reserved + free) if free is not None else None
    if fraction < 1.0 and total:
        cap = float(int(fraction * total))
        limit = cap if limit is None else min(limit, cap)
    return limit


def with_budget(views: dict[str, MemoryView], targets: list[str], budget: int | None) -> dict[str, MemoryView]:
    """``views`` with the soft budget (``memory_limit_bytes``) applied to ``targets``: the devices the
    job trains on. A budget only tightens a limit: one above what the device has must not hide the
    real OOM."""
    if budget is None:
        return views
    out = dict(views)
    for d in (d for d in targets if d in views):
        limit = views[d].limit
        out[d] = MemoryView(views[d].used, float(budget) if limit is None else min(limit, float(budget)))
    return out
