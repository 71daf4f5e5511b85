"""The OOM view of a device: the bytes in use, the bytes the limit is met by, and the limit (DESIGN.md §4).

Pure functions of what the backends read; ``collectors.scrape.Scrape.views`` calls them once per
scrape. The limit is ``None`` when it cannot be known: no guessed limit is ever exported.

``used`` keeps the meaning users expect (allocated bytes on an accelerator, RSS on ``cpu``);
``committed`` is what fills the limit (``backends.base.committed``: under the native caching
allocator, allocated plus what is stranded in partly used segments). Fullness, the ETA and every
OOM judgement compare ``committed`` with the limit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from memexporter.backends.base import HostSample
from memexporter.units import fmt_bytes


@dataclass(frozen=True)
class MemoryView:
    """One device: ``used`` bytes, the ``limit`` in bytes (``None``: unknown), and the ``committed``
    bytes that fill it (``None``: the same as ``used``)."""

    used: float
    limit: float | None
    committed: float | None = None
    source: str = ""  # what sets the limit: "memory fraction 0.043", "device memory", "memory_limit_bytes"...

    @property
    def held(self) -> float:
        """The bytes the limit is met by: ``committed``, else ``used``."""
        return self.used if self.committed is None else self.committed

    @property
    def stranded(self) -> float:
        """Bytes committed beyond ``used`` (stranded in partly used segments, mapped but unused)."""
        return max(self.held - self.used, 0.0)

    @property
    def fullness(self) -> float | None:
        """``held / limit`` (0..1 and beyond), ``None`` without a limit."""
        return self.held / self.limit if self.limit else None


def host_view(host: HostSample) -> tuple[MemoryView | None, list[str]]:
    """cpu: the process RSS against RSS + available memory (cgroup-aware); what could not be read."""
    if host.rss is None:
        return None, ["cpu: the process RSS could not be read"]
    if host.available is None:
        return MemoryView(float(host.rss), None), ["cpu: the available memory could not be read (no limit)"]
    return MemoryView(float(host.rss), float(host.rss + host.available), source=HOST_SOURCE), []


HOST_SOURCE = "available memory, cgroup-aware"
DEVICE_SOURCE = "device memory"
BUDGET_SOURCE = "memory_limit_bytes"


def device_limit(reserved: int, free: int | None, fraction: float, total: int | None) -> tuple[float | None, str]:
    """Reserved + device free (the driver library's, else the allocator's ``mem_get_info``), capped
    by ``fraction`` x the allocator's ``total`` when a per-process fraction under 1 is set; and what
    set it (``DEVICE_SOURCE``, or ``"memory fraction 0.043"``).

    The allocator refuses to reserve beyond ``fraction * get_device_properties().total_memory``
    (the CUDA total, smaller than NVML's), whatever the device has free. ``None`` when neither a
    free figure nor a cap is known. On MPS the backend's ``mem_get_info`` answers the room left
    under ``recommended_max_memory`` (backends/mps.py), so the limit is that figure.
    """
    limit = float(reserved + free) if free is not None else None
    if fraction < 1.0 and total:
        cap = float(int(fraction * total))
        if limit is None or cap < limit:
            return cap, f"memory fraction {fraction:.3f}"
    return limit, DEVICE_SOURCE


def with_budget(views: dict[str, MemoryView], targets: list[str], budget: int | None) -> dict[str, MemoryView]:
    """``views`` with the soft budget (``memory_limit_bytes``) applied to ``targets``: the devices the
    job trains on. A budget only tightens a limit: one above what the device has must not hide the
    real OOM."""
    if budget is None:
        return views
    out = dict(views)
    for d in (d for d in targets if d in views):
        limit = views[d].limit
        if limit is None or budget < limit:
            out[d] = replace(views[d], limit=float(budget), source=BUDGET_SOURCE)
    return out


def describe_full(view: MemoryView, device: str, asked: float, reserved: float | None = None) -> str:
    """What ran out when ``asked`` bytes could not be had, in words (bytes formatted):

    - ``the 6.0 GiB limit (memory fraction 0.043) of cuda:0 is full: 4.8 GiB allocated, 1.2 GiB
      stranded in partly used segments (6.0 GiB reserved)``: the ask did not fit in what is left;
    - ``more than the whole 136.9 GiB limit (device memory) of cuda:0: ...``: it never could;
    - ``the ... limit ... has 3.0 GiB left by the allocator's count, more than asked: ...``: something
      outside the allocator took the device's memory (another process, a library's own allocations).
    """
    source = f" ({view.source})" if view.source else ""
    limit = (
        f"{fmt_bytes(view.limit)} limit{source} of {device}"
        if view.limit is not None
        else f"limit of {device} (unknown)"
    )
    parts = [f"{fmt_bytes(view.used)} {'resident' if device == 'cpu' else 'allocated'}"]
    if view.stranded > 0:
        parts.append(f"{fmt_bytes(view.stranded)} stranded in partly used segments")
    tail = f" ({fmt_bytes(reserved)} reserved)" if reserved is not None else ""
    if view.limit is None:
        head = f"the {limit}"
    elif asked > view.limit:
        head = f"more than the whole {limit}"
    elif asked > view.limit - view.held:
        head = f"the {limit} is full"
    else:
        left = fmt_bytes(view.limit - view.held)
        head = f"the {limit} has {left} left by the allocator's count, more than asked (memory outside the allocator?)"
    return f"{head}: {', '.join(parts)}{tail}"
