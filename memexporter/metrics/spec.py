"""The spec table's columns and row builders: ``MetricSpec`` (one exported family), ``SemConv``, the
label tuples, ``UCUM`` (the OpenTelemetry unit of each base unit) and ``_g``/``_c``, the gauge and
counter rows that the family modules (``memory.py``, ``tracking.py``, ``allocator.py``, ``device.py``,
``exporter.py``) are written with. Imports nothing of the package.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

MetricType = Literal["gauge", "counter"]

RANK = ("rank",)
DEVICE = ("rank", "device")
MODULE = ("rank", "module")
MODULE_DEVICE = ("rank", "module", "family", "device")
PHASE = ("rank", "phase")
DEVICE_PHASE = ("rank", "device", "phase")

# The UCUM unit of each Prometheus base unit, as OpenTelemetry spells it. otlptranslator's unit
# suffixes map them back (By -> bytes, s -> seconds, By/s -> bytes_per_second; a `{...}`
# annotation adds nothing; "1" on a gauge adds `_ratio`). "" stays "": a dimensionless value that
# is not a ratio (an `_info` row, a success flag) must not gain `_ratio` on the way.
UCUM: Mapping[str, str] = {
    "bytes": "By",
    "seconds": "s",
    "bytes_per_second": "By/s",
    "bytes_per_step": "By/{step}",
    "ratio": "1",
    "": "",
}


@dataclass(frozen=True)
class SemConv:
    """An OpenTelemetry semantic-convention instrument that reports the same value as a row.

    Emitted beside the row's own instrument (whose name translates back to the Prometheus name).
    ``attributes`` says how its attributes are built: ``"hw.gpu"``: ``hw.id`` (the NVML UUID),
    ``hw.type="gpu"``, ``hw.name`` and ``hw.vendor``, joined from ``memexporter_device_info`` by device;
    ``"process"``: none (the process is the resource). Its unit is the row's OTel unit.
    """

    name: str
    attributes: Literal["hw.gpu", "process"]
    instrument: Literal["updowncounter"] = "updowncounter"


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric family.

        ``name`` is the full exposition name (counters include ``_total``); ``unit`` is the base unit
        (``bytes``, ``seconds``, ``ratio``...) or ``""``; ``help`` says where the value comes from.
        ``cuda_only`` marks series that exist only when a CUDA device is in use, ``sharded_only`` those
        that exist only for a tracked model with sharded (DTensor) parameters, ``needs`` says in words when
    any other conditional one exists (a plain CPU job without it has none of it), ``detail`` those that
        only the detail ranks export once a run has 64 ranks or more (``collectors/fleet.py``: module rows, and
        figures that are diagnostic or derivable from the core set). ``otel_name`` and
        ``otel_unit`` (UCUM) name the OpenTelemetry instrument (an observable counter for a counter, an
        observable gauge otherwise) so that otlptranslator's names give back ``name``; ``semconv`` adds
        a semantic-convention instrument with the same value.
    """

    name: str
    type: MetricType
    unit: str
    help: str
    labels: tuple[str, ...]
    collector: str
    otel_name: str
    cuda_only: bool = False
    otel_unit: str = ""
    semconv: SemConv | None = None
    sharded_only: bool = False  # exported only for a tracked model with DTensor parameters
    detail: bool = False  # at world >= 64, only the detail ranks export it (memexporter/collectors/fleet.py)
    needs: str = ""  # exported only when this holds (in words); "": whenever its collector runs

    def family(self) -> GaugeMetricFamily | CounterMetricFamily:
        """A fresh, empty Prometheus family for this spec (built anew on every scrape)."""
        if self.type == "counter":
            # CounterMetricFamily appends `_total` itself; strip it so the name round-trips.
            return CounterMetricFamily(self.name.removesuffix("_total"), self.help, labels=self.labels)
        # unit= adds the OpenMetrics `# UNIT` line; our names already end with their unit.
        return GaugeMetricFamily(self.name, self.help, labels=self.labels, unit=self.unit)


def _g(
    name: str,
    *,
    unit: str,
    help: str,
    labels: tuple[str, ...],
    collector: str,
    otel: str,
    cuda: bool = False,
    semconv: SemConv | None = None,
    sharded: bool = False,
    detail: bool = False,
    needs: str = "",
) -> MetricSpec:
    return MetricSpec(
        f"memexporter_{name}",
        "gauge",
        unit,
        help,
        labels,
        collector,
        otel,
        cuda,
        UCUM[unit],
        semconv,
        sharded,
        detail,
        needs,
    )


def _c(
    name: str,
    *,
    help: str,
    labels: tuple[str, ...],
    collector: str,
    otel: str,
    cuda: bool = False,
    counts: str = "",
    detail: bool = False,
) -> MetricSpec:
    """A counter; ``counts`` is the UCUM annotation of what it counts (``{step}``), dropped by the translation."""
    return MetricSpec(
        f"memexporter_{name}_total", "counter", "", help, labels, collector, otel, cuda, counts, detail=detail
    )


# Where the allocator's figures come from, as the HELP texts name it.
_MS = "torch.cuda.memory_stats()"
