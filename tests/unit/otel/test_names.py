"""Every OpenTelemetry instrument translates back to its Prometheus family, by otlptranslator's rules
(ported in tests/support/otlp_names.py, checked here first against the library's own test cases)."""

from __future__ import annotations

import re

import pytest

from memexporter import metrics
from memexporter.metrics import BY_NAME, SPECS
from memexporter.otel import names
from tests.support.otlp_names import KIND_TO_TYPE, families_read_by_shipped_queries, label, translate

# --- the port against otlptranslator's own test cases --------------------------------------------


@pytest.mark.parametrize(
    ("name", "unit", "metric_type", "want"),
    [  # metric_namer_test.go, UTF8Allowed=false, WithMetricSuffixes=true
        ("requests", "", "monotonic_counter", "requests_total"),
        ("cpu_usage", "1", "gauge", "cpu_usage_ratio"),
        ("items", "1", "monotonic_counter", "items_total"),
        ("response_time", "ms", "gauge", "response_time_milliseconds"),
        ("memory_usage", "By", "gauge", "memory_usage_bytes"),
        ("requests", "1/s", "gauge", "requests_per_second"),
        ("throughput", "By/s", "gauge", "throughput_bytes_per_second"),
        ("custom_metric", "custom_unit", "gauge", "custom_metric_custom_unit"),
        ("custom_metric", "{custom}", "gauge", "custom_metric"),
        ("custom_metric", "By/{custom}", "gauge", "custom_metric_bytes"),
        ("requests_total", "", "monotonic_counter", "requests_total"),
        ("cpu_usage_ratio", "1", "gauge", "cpu_usage_ratio"),
        ("response_time_seconds", "s", "gauge", "response_time_seconds"),
        (
            "metric__with__multiple__underscores",
            "unit__multiple__underscores",
            "gauge",
            "metric_with_multiple_underscores_unit_multiple_underscores",
        ),
        ("custom_metric", "unit@with#special/chars", "gauge", "custom_metric_unit_with_special_per_chars"),
        ("active_connections", "", "non_monotonic_counter", "active_connections"),
        ("uptime", "d", "gauge", "uptime_days"),
        ("http.server.duration", "s", "histogram", "http_server_duration_seconds"),  # the doc comment's example
        ("memory.usage", "By", "gauge", "memory_usage_bytes"),
    ],
)
def test_port_matches_otlptranslator_cases(name: str, unit: str, metric_type: str, want: str) -> None:
    assert translate(name, unit, metric_type) == want


@pytest.mark.parametrize(
    ("name", "want"),
    [  # label_namer_test.go
        ("label:with:colons", "label_with_colons"),
        ("LabelWithCapitalLetters", "LabelWithCapitalLetters"),
        ("label!with&special$chars)", "label_with_special_chars_"),
        ("label.with.dots", "label_with_dots"),
        ("123label", "key_123label"),
        ("_label_starting_with_underscore", "_label_starting_with_underscore"),
        ("label__with__double__underscores", "label_with_double_underscores"),
        ("__reserved__label__name__", "__reserved_label_name__"),
    ],
)
def test_label_port_matches_otlptranslator_cases(name: str, want: str) -> None:
    assert label(name) == want


# --- the spec table through the translation -------------------------------------------------------

ROW_INSTRUMENTS = [i for i in names.instruments() if i.semconv is None]


@pytest.mark.parametrize("inst", ROW_INSTRUMENTS, ids=[i.name for i in ROW_INSTRUMENTS])
def test_every_instrument_translates_to_its_prometheus_family(inst: names.Instrument) -> None:
    assert translate(inst.name, inst.unit, KIND_TO_TYPE[inst.kind]) == inst.spec.name
    assert [label(a) for a in inst.attributes] == list(inst.spec.labels)
    # A counter is an observable counter (a monotonic sum), whatever else it could be.
    assert (inst.kind == "counter") == (inst.spec.type == "counter")


def test_one_instrument_per_row_and_names_unique() -> None:
    assert [i.spec for i in ROW_INSTRUMENTS] == list(SPECS)
    all_names = [i.name for i in names.instruments()]
    assert len(all_names) == len(set(all_names))
    translated = [translate(i.name, i.unit, KIND_TO_TYPE[i.kind]) for i in names.instruments()]
    assert len(translated) == len(set(translated)), "two instruments would land on one Prometheus name"


def test_the_previous_names_would_have_broken_and_this_check_sees_it() -> None:
    # The checks above must be able to fail: the names of the previous adapter did not survive.
    assert translate("memexporter.build.info", "1", "gauge") == "memexporter_build_info_ratio"
    assert translate("memexporter.leak.per_step", "By/{step}", "gauge") == "memexporter_leak_per_step_bytes"
    assert translate("hw.gpu.memory.usage", "By", "gauge") != BY_NAME["memexporter_device_used_bytes"].name


def test_every_family_the_rules_and_dashboards_read_has_an_instrument() -> None:
    read = families_read_by_shipped_queries()
    assert {"memexporter_run_info", "memexporter_steps_total", "memexporter_oom_eta_seconds"} <= read
    translated = {translate(i.name, i.unit, KIND_TO_TYPE[i.kind]) for i in ROW_INSTRUMENTS}
    assert read <= translated, sorted(read - translated)


def test_units_are_ucum_and_annotations_only_on_counters() -> None:
    for s in SPECS:
        if s.type == "gauge":
            assert s.otel_unit == metrics.UCUM[s.unit], s.name
        else:  # what a counter counts: a UCUM annotation, which the translation drops
            assert re.fullmatch(r"\{[a-z]+\}", s.otel_unit), s.name


# --- the semantic-convention instruments against the conventions' own package --------------------


class _RecordingMeter:
    """Records which create_* call the semconv package's generated helper makes."""

    def __getattr__(self, method: str):  # type: ignore[no-untyped-def]
        def create(name: str, description: str = "", unit: str = "") -> tuple[str, str, str]:
            return method.removeprefix("create_"), name, unit

        return create


@pytest.mark.parametrize(
    ("module", "helper"),
    [
        ("opentelemetry.semconv._incubating.metrics.hw_metrics", "create_hw_gpu_memory_usage"),
        ("opentelemetry.semconv._incubating.metrics.hw_metrics", "create_hw_gpu_memory_limit"),
        ("opentelemetry.semconv._incubating.metrics.process_metrics", "create_process_memory_usage"),
    ],
)
def test_semconv_instruments_follow_the_conventions_package(module: str, helper: str) -> None:
    mod = pytest.importorskip(
        module, reason="opentelemetry-semantic-conventions is not installed (pip install memexporter[otel])"
    )
    kind, name, unit = getattr(mod, helper)(_RecordingMeter())
    (ours,) = [i for i in names.instruments() if i.name == name]
    assert ours.semconv is not None
    assert (ours.kind.replace("_", ""), ours.unit) == (kind.replace("_", ""), unit)
    if name.startswith("hw."):  # hw.id is required; hw.type names the component
        assert {"hw.id", "hw.type"} <= set(ours.attributes)


def test_schema_url_is_a_published_semconv_release() -> None:
    schemas = pytest.importorskip(
        "opentelemetry.semconv.schemas", reason="opentelemetry-semantic-conventions is not installed"
    )
    assert names.SCHEMA_URL in {s.value for s in schemas.Schemas}
