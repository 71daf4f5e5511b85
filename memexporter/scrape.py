"""What a scrape reads: the exporter's sources, and a per-scrape cache over them.

``Sources`` is built once by the exporter. ``Scrape`` is built anew for every scrape and thrown
away after it, so collectors stay pure while each backend is still read at most once per scrape
(one ``memory_stats()`` call per device). It also computes the OOM view (used and limit per
device), which the memory and trend collectors share.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Protocol

from memexporter.backends.host import HostSample
from memexporter.backends.nvml import NvmlMemory
from memexporter.config import Config

if TYPE_CHECKING:
    from memexporter.tracking.steps import StepTracker


class CudaSource(Protocol):
    """What collectors need from ``backends.torch.TorchBackend`` (fakes implement the same)."""

    def cuda_devices(self) -> list[int]: ...
    def device_stats(self) -> dict[int, Mapping[str, int]]: ...
    def allocated(self, index: int) -> tuple[int, int]: ...
    def uuid(self, index: int) -> str | None: ...
    def total_memory(self, index: int) -> int: ...
    def memory_fraction(self, index: int) -> float: ...
    def mem_get_info(self, index: int) -> tuple[int, int] | None: ...
    def versions(self) -> tuple[str, str]: ...


class NvmlSource(Protocol):
    def memory(self, uuid: str) -> NvmlMemory | None: ...


class HostSource(Protocol):
    def rss(self) -> int: ...
    def peak_rss(self) -> int: ...
    def sample(self) -> HostSample: ...


@dataclass(frozen=True)
class Identity:
    """Who this process is in the job (from torchrun's environment)."""

    rank: str
    local_rank: str
    world_size: str
    hostname: str


@dataclass(frozen=True)
class Sources:
    """Everything a scrape may read. Built once per exporter."""

    identity: Identity
    config: Config
    cuda: CudaSource
    nvml: NvmlSource
    host: HostSource
    steps: StepTracker | None = None
    version: str = field(default="")

    @property
    def rank(self) -> str:
        return self.identity.rank


@dataclass(frozen=True)
class MemoryView:
    """The OOM view of one device: bytes in use and the most they can reach before an OOM."""

    used: float
    limit: float


def cuda_label(index: int) -> str:
    return f"cuda:{index}"


class Scrape:
    """Lazy, memoised reads for one scrape. Never outlives the scrape."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources

    @cached_property
    def cuda_stats(self) -> dict[int, Mapping[str, int]]:
        """``memory_stats()`` of each CUDA device in use, read once for the whole scrape."""
        return self.sources.cuda.device_stats()

    @property
    def cuda_devices(self) -> list[int]:
        return list(self.cuda_stats)

    @cached_property
    def nvml(self) -> dict[int, NvmlMemory | None]:
        out: dict[int, NvmlMemory | None] = {}
        for i in self.cuda_devices:
            uuid = self.sources.cuda.uuid(i)
            out[i] = self.sources.nvml.memory(uuid) if uuid else None
        return out

    @cached_property
    def host(self) -> HostSample:
        return self.sources.host.sample()

    @cached_property
    def views(self) -> dict[str, MemoryView]:
        """``{device label: MemoryView}`` for ``cpu`` and each CUDA device in use (DESIGN.md §4)."""
        views: dict[str, MemoryView] = {}
        try:
            host = self.host
            views["cpu"] = MemoryView(used=host.rss, limit=host.rss + host.available)
        except Exception:  # reported by the host collector's own success gauge; CUDA views still count
            pass
        for i, stats in self.cuda_stats.items():
            reserved = stats.get("reserved_bytes.all.current", 0)
            nv = self.nvml.get(i)
            if nv is not None:
                free, total = nv.free, nv.total
            else:
                info = self.sources.cuda.mem_get_info(i)
                free, total = info if info is not None else (0, self.sources.cuda.total_memory(i))
            limit = reserved + free
            fraction = self.sources.cuda.memory_fraction(i)
            if fraction < 1.0 and total > 0:
                # The allocator refuses to reserve beyond fraction * total, whatever the device has free.
                limit = min(limit, int(fraction * total))
            views[cuda_label(i)] = MemoryView(used=stats.get("allocated_bytes.all.current", 0), limit=limit)
        budget = self.sources.config.memory_limit_bytes
        if budget is not None:
            # The soft budget applies to the devices the job trains on: CUDA when it is in use.
            # It can only tighten the limit: a budget above what the device has must not hide
            # the real OOM.
            targets = [d for d in views if d != "cpu"] or [d for d in views if d == "cpu"]
            for d in targets:
                views[d] = MemoryView(used=views[d].used, limit=min(views[d].limit, float(budget)))
        return views
