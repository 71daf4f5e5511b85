"""The collector catalogue and the guard that runs it on every scrape.

``GuardedCatalogue`` is the one object registered with prometheus_client. On each scrape it
builds a fresh ``Scrape`` (a per-scrape cache, so each backend is read once, e.g. one
``memory_stats()`` call per device), runs every enabled collector inside a guard that times it,
and exports ``memexporter_collector_success`` and ``memexporter_collector_duration_seconds``.
A collector that raises loses only its own series. A rank that exports the core set only (a run
of 64 ranks or more, ``fleet.py``) skips the collectors whose every series is detail.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from memexporter.collectors import fleet
from memexporter.collectors.scrape import PartialFailure, Scrape, Sources
from memexporter.metrics import families

log = logging.getLogger("memexporter")


class PureCollector(Protocol):
    """A pure collector: reads the scrape context, yields families, keeps no state between scrapes."""

    name: str

    def collect(self, scrape: Scrape) -> Iterable[Metric]: ...


def catalogue() -> list[PureCollector]:
    """Every collector, in exposition order. Each one is cheap when it has nothing to report
    (no CUDA device: the allocator and device collectors yield nothing), so all are on."""
    from memexporter.collectors.allocator import AllocatorCollector
    from memexporter.collectors.device import DeviceCollector
    from memexporter.collectors.exporter import ExporterCollector
    from memexporter.collectors.host import HostCollector
    from memexporter.collectors.inputs import InputsCollector
    from memexporter.collectors.memory import MemoryCollector
    from memexporter.collectors.modules import ModulesCollector
    from memexporter.collectors.phases import PhasesCollector
    from memexporter.collectors.trend import TrendCollector

    return [
        MemoryCollector(),
        TrendCollector(),
        InputsCollector(),
        AllocatorCollector(),
        DeviceCollector(),
        HostCollector(),
        ModulesCollector(),
        PhasesCollector(),
        ExporterCollector(),
    ]


class GuardedCatalogue(Collector):
    """Runs the catalogue under one guard. Registered once per exporter, on a private registry."""

    def __init__(
        self,
        collectors: Sequence[PureCollector],
        sources: Sources,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._collectors = tuple(collectors)
        self._sources = sources
        self._clock = clock
        self._pid = os.getpid()
        self._warned: set[str] = set()

    def describe(self) -> Iterable[Metric]:
        # Without describe(), prometheus_client would call collect() at register time and touch
        # the GPU before the user asked for a scrape.
        return []

    def collect(self) -> Iterator[Metric]:
        if os.getpid() != self._pid:  # a forked child (DataLoader worker) serves nothing
            return
        if self._sources.identity.detail == "core":  # a large run: the detail is the detail ranks'
            yield from fleet.core(self._collect(detail=False))
        else:
            yield from self._collect(detail=True)

    def _collect(self, detail: bool) -> Iterator[Metric]:
        scrape = Scrape(self._sources)
        rank = self._sources.rank
        success: list[tuple[tuple[str, ...], float]] = []
        duration: list[tuple[tuple[str, ...], float]] = []
        for collector in self._collectors:
            if not detail and fleet.detail_only_collector(collector.name):
                continue  # nothing it yields would be exported: do not even read it
            start = self._clock()
            try:
                # Materialise first: a collector that fails half-way must not leave half its series.
                out = list(collector.collect(scrape))
                ok = 1.0
            except PartialFailure as exc:  # what could be read is kept; the failure still shows
                out, ok = exc.families, 0.0
                self._log_failure(collector.name, exc)
            except Exception:
                out, ok = [], 0.0
                self._log_failure(collector.name)
            duration.append(((rank, collector.name), self._clock() - start))
            success.append(((rank, collector.name), ok))
            yield from out
        yield from families(
            {"memexporter_collector_success": success, "memexporter_collector_duration_seconds": duration}
        )

    def _log_failure(self, name: str, partial: PartialFailure | None = None) -> None:
        # Log the traceback once per collector: a broken collector would otherwise flood the
        # training job's log on every scrape. The success gauge keeps counting it.
        if name not in self._warned:
            self._warned.add(name)
            if partial is not None:  # a known failing read, already named: no traceback
                log.warning("memexporter: collector %r exports only part of its series: %s", name, partial)
            else:
                log.exception("memexporter: collector %r failed; its series are dropped from this scrape", name)
        else:
            log.debug("memexporter: collector %r failed again", name)
