"""The spec table is the single source of truth: naming rules, the DESIGN.md contract, the README."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from memexporter import config, metrics

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT.parent / "shared" / "DESIGN.md"


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


def _design_metric_names() -> set[str]:
    text = DESIGN.read_text()
    section = text[text.index("## 4. Metrics") : text.index("## 5.")]
    names = set(re.findall(r"`(memexporter_[a-z_]+)`", section))
    # `memexporter_allocator_{allocated,reserved}_bytes` is shorthand for several names;
    # `memexporter_build_info{version,...}` is one name with its labels.
    for prefix, alts, suffix in re.findall(r"`(memexporter_[a-z_]*)\{([a-z_,]+)\}([a-z_]*)`", section):
        if prefix.endswith("_"):
            names |= {f"{prefix}{a}{suffix}" for a in alts.split(",")}
        else:
            names.add(prefix)
    return names


@pytest.mark.skipif(not DESIGN.exists(), reason="../shared/DESIGN.md is not beside this checkout")
def test_every_contract_metric_is_in_the_table() -> None:
    names = _design_metric_names()
    assert len(names) > 30, "the parser found the contract section"
    missing = names - set(metrics.BY_NAME)
    assert not missing, f"contract metrics missing from metrics.SPECS: {sorted(missing)}"


def _readme_block(marker: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"<!-- {marker}:start -->") + len(f"<!-- {marker}:start -->")
    return text[start : text.index(f"<!-- {marker}:end -->")].strip()


def test_readme_metrics_reference_is_rendered_from_the_table() -> None:
    assert _readme_block("metrics") == metrics.reference_table(), "run: python -m memexporter.docs"


def test_readme_configuration_table_is_rendered_from_knobs() -> None:
    assert _readme_block("config") == config.reference_table(), "run: python -m memexporter.docs"


def test_families_skip_empty() -> None:
    assert metrics.families({"memexporter_host_rss_bytes": []}) == []
    (fam,) = metrics.families({"memexporter_steps_total": [(("0",), 5.0)]})
    assert fam.type == "counter"
    assert fam.samples[0].name == "memexporter_steps_total"
