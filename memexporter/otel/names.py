"""The OpenTelemetry instruments, derived from the spec table (``metrics.SPECS``); no SDK needed.

Each row gives one instrument: an observable counter for a counter (a cumulative monotonic sum on
the wire), an observable gauge otherwise, named ``otel_name`` with the UCUM unit ``otel_unit``.
The standard OTLP-to-Prometheus translation (prometheus/otlptranslator, with its default
``UnderscoreEscapingWithSuffixes`` strategy: Prometheus' OTLP receiver, the Collector's
Prometheus exporters) gives back the row's ``/metrics`` name, and the attributes are the row's
labels, so dashboards and rules read pushed data unchanged (tests/unit/otel/test_names.py checks
every row). A row with a ``semconv`` column also feeds a semantic-convention instrument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from memexporter.metrics import SPECS, MetricSpec, SemConv

InstrumentKind = Literal["counter", "gauge", "updowncounter"]

# The semantic-conventions release the `semconv` column follows (checked against the
# opentelemetry-semantic-conventions package in the tests).
SCHEMA_URL = "https://opentelemetry.io/schemas/1.44.0"


@dataclass(frozen=True)
class Instrument:
    """One observable instrument and the spec row whose samples it reports."""

    name: str
    unit: str
    kind: InstrumentKind
    spec: MetricSpec
    semconv: SemConv | None = None

    @property
    def attributes(self) -> tuple[str, ...]:
        """Attribute keys on its data points (a row's instrument: the row's labels)."""
        if self.semconv is None:
            return self.spec.labels
        return ("hw.id", "hw.type", "hw.name", "hw.vendor") if self.semconv.attributes == "hw.gpu" else ()


def instruments() -> tuple[Instrument, ...]:
    """Every instrument: one per row, then the semantic-convention ones."""
    rows = [Instrument(s.otel_name, s.otel_unit, "counter" if s.type == "counter" else "gauge", s) for s in SPECS]
    conv = [Instrument(s.semconv.name, s.otel_unit, s.semconv.instrument, s, s.semconv) for s in SPECS if s.semconv]
    return (*rows, *conv)


def reference_table() -> str:
    """The OpenTelemetry table of docs/otel.md, rendered from the spec table."""
    lines = ["| instrument | kind | unit | attributes | Prometheus name after translation |", "|---|---|---|---|---|"]
    for i in instruments():
        attrs = ", ".join(i.attributes) or "-"
        prom = f"`{i.spec.name}`" if i.semconv is None else f"(semantic convention; same value as `{i.spec.name}`)"
        unit = f"`{i.unit}`" if i.unit else "-"
        lines.append(f"| `{i.name}` | {i.kind} | {unit} | {attrs} | {prom} |")
    return "\n".join(lines)
