"""The spec table is the single source of truth: naming rules, the contract names, the README and docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from memexporter import config, metrics

ROOT = Path(__file__).resolve().parents[3]

# The metric names DESIGN.md §4 fixes as the contract: dashboards, alerts and users' queries rely
# on them. They may only change with a note on the issue (and here).
CONTRACT = (
    "memexporter_memory_used_bytes",
    "memexporter_memory_limit_bytes",
    "memexporter_memory_peak_bytes",
    "memexporter_memory_baseline_bytes",
    "memexporter_leak_rate_bytes_per_second",
    "memexporter_leak_bytes_per_step",
    "memexporter_oom_eta_seconds",
    "memexporter_steps_total",
    *(f"memexporter_allocator_{n}_bytes" for n in ("allocated", "reserved", "active", "inactive_split", "requested")),
    "memexporter_allocator_peak_allocated_bytes",
    "memexporter_allocator_peak_reserved_bytes",
    "memexporter_allocator_alloc_retries_total",
    "memexporter_allocator_ooms_total",
    "memexporter_allocator_device_allocations_total",
    "memexporter_allocator_device_frees_total",
    "memexporter_allocator_fragmentation_ratio",
    "memexporter_device_total_bytes",
    "memexporter_device_used_bytes",
    "memexporter_device_free_bytes",
    "memexporter_device_info",
    "memexporter_host_rss_bytes",
    "memexporter_host_children_rss_bytes",
    "memexporter_host_available_bytes",
    "memexporter_host_limit_bytes",
    "memexporter_module_parameter_bytes",
    "memexporter_module_gradient_bytes",
    "memexporter_module_optimizer_state_bytes",
    "memexporter_module_activation_bytes",
    "memexporter_build_info",
    "memexporter_process_info",
    "memexporter_collector_success",
    "memexporter_collector_duration_seconds",
)

# Docs that name metrics in prose (the README's reference table is rendered, checked below).
PROSE = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "alerts" / "runbook.md")
# A metric name on its own: not part of a recording rule (level:metric:operation), not a prefix
# (`memexporter_module_*`), not the stem of a brace shorthand (`memexporter_allocator_{a,b}_bytes`).
_NAME = re.compile(r"(?<![\w:])memexporter_[a-z0-9_]*[a-z0-9](?![\w:*])")


@pytest.mark.parametrize("spec", metrics.SPECS, ids=lambda s: s.name)
def test_naming_conventions(spec: metrics.MetricSpec) -> None:
    assert re.fullmatch(r"memexporter_[a-z0-9_]+", spec.name)
    assert spec.labels[0] == "rank", "every series carries rank"
    assert (spec.type == "counter") == spec.name.endswith("_total")
    if spec.unit:
        assert spec.name.endswith("_" + spec.unit), "the unit is the name's suffix"
    assert spec.help and spec.otel_name


def test_names_unique() -> None:
    assert len({s.name for s in metrics.SPECS}) == len(metrics.SPECS)


def test_every_contract_metric_is_in_the_table() -> None:
    missing = set(CONTRACT) - set(metrics.BY_NAME)
    assert not missing, f"contract metrics missing from metrics.SPECS: {sorted(missing)}"


@pytest.mark.parametrize("doc", [p for p in PROSE if p.exists()], ids=lambda p: str(p.relative_to(ROOT)))
def test_metrics_named_in_the_docs_exist(doc: Path) -> None:
    names = set(_NAME.findall(doc.read_text(encoding="utf-8")))
    unknown = names - set(metrics.BY_NAME)
    assert not unknown, f"{doc.relative_to(ROOT)} names metrics the exporter does not export: {sorted(unknown)}"


def test_the_name_pattern_finds_names_and_skips_rules_and_prefixes() -> None:
    text = (
        "`memexporter_steps_total` and memexporter_oom_eta_seconds{rank}; rank:memexporter_memory_peak_bytes:max; "
        "`memexporter_module_*`; memexporter_allocator_{allocated,reserved}_bytes"
    )
    assert sorted(_NAME.findall(text)) == ["memexporter_oom_eta_seconds", "memexporter_steps_total"]


def _docs_block(marker: str, page: str) -> str:
    text = (ROOT / "docs" / page).read_text()
    start = text.index(f"<!-- {marker}:start -->") + len(f"<!-- {marker}:start -->")
    return text[start : text.index(f"<!-- {marker}:end -->")].strip()


def test_metrics_reference_is_rendered_from_the_table() -> None:
    assert _docs_block("metrics", "metrics.md") == metrics.reference_table(), (
        "run: python -m memexporter.cli.generate docs"
    )


def test_configuration_table_is_rendered_from_knobs() -> None:
    assert _docs_block("config", "configuration.md") == config.reference_table(), (
        "run: python -m memexporter.cli.generate docs"
    )


def test_families_skip_empty() -> None:
    assert metrics.families({"memexporter_host_rss_bytes": []}) == []
    (fam,) = metrics.families({"memexporter_steps_total": [(("0",), 5.0)]})
    assert fam.type == "counter"
    assert fam.samples[0].name == "memexporter_steps_total"
