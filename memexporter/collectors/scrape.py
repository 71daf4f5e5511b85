"""What a scrape reads: the exporter's sources, and a per-scrape cache over them.

``Sources`` is built once by the exporter. ``Scrape`` is built anew for every scrape and thrown
away after it, so collectors stay pure while each backend is still read at most once per scrape
(one ``memory_stats()`` call per device). It also computes the OOM view (used and limit per
device), which the memory and trend collectors share.

A collector that could read only part of its series raises ``PartialFailure`` with what it has:
the guard (``registry.py``) exports those series and sets its ``collector_success`` to 0, so a
failing read shows on the dashboard while the other devices' figures stay.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

from prometheus_client.core import Metric

from memexporter.backends.base import (
    CUDA,
    AllocatorSource,
    DeviceMemory,
    DriverSource,
    HostSample,
    HostSource,
    ProcessMemory,
    committed,
)
from memexporter.config import Config
from memexporter.oom.view import MemoryView, device_limit, host_view, with_budget
from memexporter.tracking.phases import PhaseTracker
from memexporter.tracking.steps import StepTracker

__all__ = [
    "AllocatorSource",
    "DriverSource",
    "HostSource",
    "HttpSource",
    "Identity",
    "MemoryView",
    "PartialFailure",
    "Scrape",
    "Sources",
]


class PartialFailure(Exception):
    """A collector read only part of what it reports: ``families`` are still exported, and its
    ``memexporter_collector_success`` reads 0. The message says what failed."""

    def __init__(self, families: Iterable[Metric], failed: Iterable[str]) -> None:
        self.families = list(families)
        self.failed = tuple(failed)
        super().__init__("; ".join(self.failed))


class HttpSource(Protocol):
    """What the exporter collector needs from ``serving.conn.ConnectionStats``."""

    def dropped(self) -> dict[str, int]: ...

    def restarts(self) -> int: ...


@dataclass(frozen=True)
class Identity:
    """Who this process is in the job (from torchrun's environment)."""

    rank: str
    local_rank: str
    world_size: str
    hostname: str
    run_id: str = ""  # the training run (memexporter_run_info), from fleet.run_identity
    run_id_source: str = ""
    detail: str = "per_rank"  # what this rank exports: per_rank, representative or core (fleet.py)


@dataclass(frozen=True)
class Sources:
    """Everything a scrape may read. Built once per exporter."""

    identity: Identity
    config: Config
    allocator: AllocatorSource  # the accelerator's caching allocator (backends/select.py picks it)
    driver: DriverSource  # the same devices as their driver library sees them
    host: HostSource
    steps: StepTracker | None = None
    version: str = field(default="")
    http: HttpSource | None = None  # the HTTP server's dropped-connection counts and its helper's restarts
    phases: PhaseTracker | None = None

    @property
    def rank(self) -> str:
        return self.identity.rank

    def close(self) -> None:
        """Close what the readings hold open (the exporter's ``stop()``); a reading after it keeps nothing open."""
        self.host.close()
        if self.steps is not None:
            self.steps.close()


class Scrape:
    """Lazy, memoised reads for one scrape. Never outlives the scrape."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources
        self.view_failures: list[str] = []  # why a device's view is missing or lacks its limit (views)

    @cached_property
    def allocator_stats(self) -> dict[int, Mapping[str, int]]:
        """``memory_stats()`` of each accelerator device in use, read once for the whole scrape.

        ``{}`` for a device whose allocator cannot report (see ``TorchBackend.device_stats``).
        """
        return self.sources.allocator.device_stats()

    @property
    def devices(self) -> list[int]:
        return list(self.allocator_stats)

    def label(self, index: int) -> str:
        """The ``device`` label of an accelerator ordinal: ``cuda:0``, ``xpu:0``, ``mps``."""
        return self.sources.allocator.label(index)

    @cached_property
    def allocator_backend(self) -> str:
        """``torch.cuda.get_allocator_backend()`` (``native``, ``cudaMallocAsync``, ``pluggable``)."""
        return self.sources.allocator.allocator_backend()

    @cached_property
    def expandable_segments(self) -> bool:
        """Whether the allocator maps expandable segments (``expandable_segments:True``)."""
        return self.sources.allocator.expandable_segments()

    @cached_property
    def uuids(self) -> dict[int, str | None]:
        """Each device's UUID (torch's spelling), read once a scrape: the driver is asked by it."""
        return {i: self.sources.allocator.uuid(i) for i in self.devices}

    @cached_property
    def driver(self) -> dict[int, DeviceMemory | None]:
        """Each device in use as its driver library sees it (NVML, amdsmi, torch.xpu)."""
        return {i: self.sources.driver.memory(uuid, i) if uuid else None for i, uuid in self.uuids.items()}

    @cached_property
    def driver_process(self) -> dict[int, ProcessMemory | None]:
        """This process's memory on each device in use, as the driver counts it."""
        pid = os.getpid()  # per scrape: a forked child asks for its own
        return {i: self.sources.driver.process_memory(uuid, pid) if uuid else None for i, uuid in self.uuids.items()}

    @cached_property
    def host(self) -> HostSample:
        return self.sources.host.sample()

    @cached_property
    def views(self) -> dict[str, MemoryView]:
        """``{device label: MemoryView}`` for ``cpu`` and each accelerator device in use (DESIGN.md §4).

        A failing source costs only its own devices' views (or their limits), and says so in
        ``view_failures``: the memory collector reports them on its success gauge.
        """
        views: dict[str, MemoryView] = {}
        try:
            host = self.host
        except Exception as exc:
            self.view_failures.append(f"cpu: the host read failed ({type(exc).__name__}: {exc})")
        else:
            cpu, failed = host_view(host)
            self.view_failures += failed
            if cpu is not None:
                views["cpu"] = cpu
        try:
            stats_of = self.allocator_stats
        except Exception as exc:
            family = getattr(self.sources.allocator, "family", CUDA)
            self.view_failures.append(f"{family}: memory_stats() failed ({type(exc).__name__}: {exc})")
            stats_of = {}
        for i, stats in stats_of.items():
            used = stats.get("allocated_bytes.all.current")
            if used is None:  # the allocator cannot say (a pluggable allocator): no device view
                continue
            held = committed(stats, self.allocator_backend, self.expandable_segments)
            limit, source = self._device_limit(i, stats)
            views[self.label(i)] = MemoryView(float(used), limit, None if held is None else float(held), source)
        # The budget applies to the devices the job trains on: the accelerator when it is in use
        # (even where its view is unknown, under a pluggable allocator), else cpu.
        targets = [self.label(i) for i in stats_of] or ["cpu"]
        return with_budget(views, targets, self.sources.config.memory_limit_bytes)

    def _device_limit(self, index: int, stats: Mapping[str, int]) -> tuple[float | None, str]:
        """``oom.view.device_limit`` of this device: the driver's free figure, else the allocator's."""
        allocator = self.sources.allocator
        driver = self.driver.get(index)
        free: int | None = driver.free if driver is not None else None
        if free is None:
            info = allocator.mem_get_info(index)
            free = info[0] if info is not None else None
        fraction = allocator.memory_fraction(index)
        total = allocator.total_memory(index) if fraction < 1.0 else None
        return device_limit(stats.get("reserved_bytes.all.current", 0), free, fraction, total)
