"""A Python port of prometheus/otlptranslator's naming rules, and what the shipped queries read.

``translate()`` and ``label()`` port prometheus/otlptranslator v1.0.0 (tag v1.0.0, commit
57de713e8b6c626d888cefba633272dece33a352; the behaviour of metric_namer.go is unchanged up to
51da773, 2026-07): ``MetricNamer.Build`` with the ``UnderscoreEscapingWithSuffixes`` strategy
(``normalizeName``, ``buildUnitSuffixes``, ``cleanUpUnit``, ``addUnitTokens`` in metric_namer.go
and unit_namer.go) and ``LabelNamer.Build`` (label_namer.go, strconv.go). That library names what
Prometheus' OTLP receiver and the Collector's Prometheus exporters store. tests/unit/otel/test_names.py
checks the port against cases from the library's own tests before relying on it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from memexporter.metrics import BY_NAME
from tests.support import REPO_ROOT

if TYPE_CHECKING:
    from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric

# unit_namer.go / metric_namer.go: unitMap and perUnitMap.
UNIT_MAP = {
    "d": "days",
    "h": "hours",
    "min": "minutes",
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "GiBy": "gibibytes",
    "TiBy": "tibibytes",
    "KBy": "kilobytes",
    "MBy": "megabytes",
    "GBy": "gigabytes",
    "TBy": "terabytes",
    "m": "meters",
    "V": "volts",
    "A": "amperes",
    "J": "joules",
    "W": "watts",
    "g": "grams",
    "Cel": "celsius",
    "Hz": "hertz",
    "1": "",
    "%": "percent",
}
PER_UNIT_MAP = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}

# OTLP data -> otlptranslator.MetricType, as Prometheus' OTLP receiver maps it: a Gauge is a
# gauge, a monotonic Sum a MonotonicCounter, a non-monotonic Sum a NonMonotonicCounter.
KIND_TO_TYPE = {"gauge": "gauge", "counter": "monotonic_counter", "updowncounter": "non_monotonic_counter"}


def _tokens(text: str) -> list[str]:
    # strings.FieldsFunc on !isValidCompliantMetricChar: [a-zA-Z0-9:] runs (underscores split too).
    return [t for t in re.split(r"[^a-zA-Z0-9:]+", text) if t]


def _clean_unit(unit: str) -> str:
    # cleanUpUnit: invalid characters to "_", runs of "_" collapsed, a leading "_" trimmed.
    return re.sub(r"_+", "_", re.sub(r"[^a-zA-Z0-9:]", "_", unit)).removeprefix("_")


def _unit_suffixes(unit: str) -> tuple[str, str]:
    # buildUnitSuffixes: split at the first "/", drop a part holding "{" or "}", map, "per_" prefix.
    main_otel, _, per_otel = unit.partition("/")
    main_otel, per_otel = main_otel.strip(), per_otel.strip()
    main = UNIT_MAP.get(main_otel, main_otel) if main_otel and not re.search(r"[{}]", main_otel) else ""
    per = PER_UNIT_MAP.get(per_otel, per_otel) if per_otel and not re.search(r"[{}]", per_otel) else ""
    return main, f"per_{per}" if per else ""


def translate(name: str, unit: str, metric_type: str) -> str:
    """otlptranslator ``normalizeName`` (UnderscoreEscapingWithSuffixes, no namespace)."""
    tokens = _tokens(name)
    main, per = _unit_suffixes(unit)
    main, per = _clean_unit(main), _clean_unit(per)
    # addUnitTokens
    if main in tokens:
        main = ""
    if per == "per_":
        per = ""
    else:
        per = per.removesuffix("_")
        if per in tokens:
            per = ""
    if per:
        main = main.removesuffix("_")
    tokens += [t for t in (main, per) if t]
    if metric_type == "monotonic_counter":
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if unit == "1" and metric_type == "gauge":
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    out = "_".join(tokens)
    return "_" + out if out[:1].isdigit() else out


def label(name: str) -> str:
    """otlptranslator ``LabelNamer.Build`` (UTF8Allowed false, multiple underscores collapsed)."""
    reserved = len(name) >= 4 and name.startswith("__") and name.endswith("__")
    inner = name[2:-2] if reserved else name
    out = re.sub(r"[^a-zA-Z0-9]+", "_", inner)
    out = f"__{out}__" if reserved else out
    if not out.strip("_"):
        raise ValueError(f"label {name!r} normalises to {out!r}")
    return "key_" + out if out[0].isdigit() else out


def kind_of(metric: Metric) -> str:
    """The otlptranslator metric type of an OTLP metric, as Prometheus' OTLP receiver maps it."""
    data = metric.WhichOneof("data")
    if data == "sum":
        return "monotonic_counter" if metric.sum.is_monotonic else "non_monotonic_counter"
    return str(data)


def families_read_by_shipped_queries() -> set[str]:
    """The metric families the shipped alert rules and Grafana dashboards read (recording rules,
    ``level:memexporter_...:op``, and their parts excluded)."""
    files = [
        *sorted((REPO_ROOT / "alerts").glob("*.rules.yml")),
        *sorted((REPO_ROOT / "grafana/dashboards").glob("*.json")),
    ]
    return _families_named_in(files)


def _families_named_in(files: list[Path]) -> set[str]:
    found: set[str] = set()
    for path in files:
        found |= set(re.findall(r"(?<![\w:])memexporter_[a-z0-9_]+(?![\w:])", path.read_text(encoding="utf-8")))
    return found & set(BY_NAME)
