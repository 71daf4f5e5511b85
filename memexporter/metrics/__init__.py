"""The metric spec table: the single source of truth for every series memexporter exports.

Collectors build their families from these specs, the OTel adapter and the metrics
reference (docs/metrics.md) are derived from them, and tests check dashboards and rules against them. Add a row
here and nowhere else: in the family's module, whose tuple ``SPECS`` joins in the table's order (the order of
docs/metrics.md and of the other generated files). ``spec.py`` holds the columns (``MetricSpec``, ``SemConv``,
``UCUM``, the label tuples) and the row builders; ``memory.py`` the OOM view; ``inputs.py`` the step's input and the capacity; ``tracking.py`` the phases and the
per-module breakdown; ``allocator.py`` the CUDA caching allocator; ``device.py`` the device and the host;
``exporter.py`` the exporter itself, the job's end and the collectors' guard. A leaf: it imports nothing of the
package outside itself (the helper process imports it: never torch).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client.core import Metric

from memexporter.metrics.allocator import ALLOCATOR_SPECS
from memexporter.metrics.device import DEVICE_SPECS, HOST_SPECS
from memexporter.metrics.exporter import EXPORTER_SPECS, GUARD_SPECS, JOB_END_SPECS, REASONS
from memexporter.metrics.inputs import INPUT_SPECS
from memexporter.metrics.memory import OOM_VIEW_SPECS
from memexporter.metrics.spec import (
    DEVICE,
    DEVICE_PHASE,
    MODULE,
    PHASE,
    RANK,
    UCUM,
    MetricSpec,
    MetricType,
    SemConv,
)
from memexporter.metrics.tracking import MODULE_SPECS, PHASE_SPECS

__all__ = [
    "BY_NAME",
    "DEVICE",
    "DEVICE_PHASE",
    "MODULE",
    "PHASE",
    "RANK",
    "REASONS",
    "SPECS",
    "UCUM",
    "MetricSpec",
    "MetricType",
    "SemConv",
    "families",
    "reference_table",
    "spec",
    "specs_for",
]

SPECS: tuple[MetricSpec, ...] = (
    *OOM_VIEW_SPECS,
    *INPUT_SPECS,
    *PHASE_SPECS,
    *ALLOCATOR_SPECS,
    *DEVICE_SPECS,
    *HOST_SPECS,
    *MODULE_SPECS,
    *EXPORTER_SPECS,
    *JOB_END_SPECS,
    *GUARD_SPECS,
)

BY_NAME: Mapping[str, MetricSpec] = {s.name: s for s in SPECS}


def spec(name: str) -> MetricSpec:
    """Look up a spec by its full exposition name; KeyError names the missing metric."""
    return BY_NAME[name]


def specs_for(collector: str) -> tuple[MetricSpec, ...]:
    """The specs one collector emits, in table order."""
    return tuple(s for s in SPECS if s.collector == collector)


def families(rows: Mapping[str, Iterable[tuple[tuple[str, ...], float]]]) -> list[Metric]:
    """Build families from ``{metric name: [(label values, value), ...]}``.

    Families without rows are still emitted only if they have rows: a collector with no data
    (say, no CUDA device) yields nothing rather than empty families.
    """
    out: list[Metric] = []
    for name, samples in rows.items():
        fam = spec(name).family()
        for labels, value in samples:
            fam.add_metric(list(labels), value)
        if fam.samples:
            out.append(fam)
    return out


def reference_table() -> str:
    """The metrics reference of docs/metrics.md, rendered from the table (a test keeps them equal)."""
    lines = ["| name | type | unit | labels | help |", "|---|---|---|---|---|"]
    for s in SPECS:
        labels = ", ".join(s.labels)
        extra = " (CUDA only)" if s.cuda_only else " (sharded models only)" if s.sharded_only else ""
        extra += " (detail: at 64 ranks and more, the detail ranks only)" if s.detail else ""
        lines.append(f"| `{s.name}` | {s.type} | {s.unit or '-'} | {labels} | {s.help}{extra} |")
    return "\n".join(lines)
