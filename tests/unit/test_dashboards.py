"""Lint, drift and parse checks for the generated Grafana dashboards (grafana/dashboards/*.json).

The lint rules follow grafana/dashboard-linter (not installable here), plus memexporter's own:
a ``rank`` variable, a ``rank`` matcher in every selector, GPU-only panels derived from the spec
table. PromQL is parsed by the real ``promtool``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from memexporter import dashboards
from memexporter.metrics import BY_NAME
from memexporter.tracking.phases import OUT_OF_STEP_PHASES
from tests.support import REPO_ROOT
from tests.support.promql import (
    BUILTINS,
    metric_names,
    promtool_check_exprs,
    recording_rules,
    rule_exprs,
    substitute,
)

BUILT = dashboards.build()
DASHBOARDS = sorted(BUILT.items())
IDS = [name for name, _ in DASHBOARDS]
EXPECTED = {
    "memexporter-overview.json": ("memexporter-overview", "memexporter / Overview"),
    "memexporter-modules.json": ("memexporter-modules", "memexporter / Modules"),
    "memexporter-ranks.json": ("memexporter-ranks", "memexporter / Ranks"),
}
DS_UID = "${datasource}"
MATCHERS = ('job=~"$job"', 'instance=~"$instance"', 'rank=~"$rank"')
GRAFANA_BUILTIN_VARS = {"__rate_interval", "__interval", "__range", "__range_s", "__interval_ms"}
RULE_FILES = sorted((REPO_ROOT / "alerts").glob("*.rules.yml"))


def panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    return list(dash["panels"])


def exprs(dash: dict[str, Any]) -> dict[str, str]:
    """Every PromQL expression in a dashboard: panel targets and annotation queries."""
    out = {f"{p['title']}/{t['refId']}": t["expr"] for p in panels(dash) for t in p["targets"]}
    out |= {f"annotation/{a['name']}": a["expr"] for a in dash["annotations"]["list"] if "expr" in a}
    return out


def variable_selectors(dash: dict[str, Any]) -> dict[str, str]:
    """The series selector inside each ``label_values(selector, label)`` variable query."""
    out = {}
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.+),\s*\w+\)", v["query"])
            assert m, f"variable {v['name']}: unexpected query {v['query']!r}"
            out[f"variable/{v['name']}"] = m.group(1)
    return out


def variables(dash: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dash["templating"]["list"]}


# --- identity and layout -------------------------------------------------------------------------


def test_dashboard_set_uids_and_titles_are_stable() -> None:
    assert {name: (d["uid"], d["title"]) for name, d in BUILT.items()} == EXPECTED
    for d in BUILT.values():
        assert 8 <= len(d["uid"]) <= 40
        assert re.fullmatch(r"[a-z0-9-]+", d["uid"])
        assert d["schemaVersion"] == 39
        assert d["id"] is None


@pytest.mark.parametrize(("name", "dash"), DASHBOARDS, ids=IDS)
def test_panel_ids_unique_and_grid_fits(name: str, dash: dict[str, Any]) -> None:
    ids = [p["id"] for p in panels(dash)]
    assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids {ids}"
    cells: set[tuple[int, int]] = set()
    for p in panels(dash):
        g = p["gridPos"]
        assert min(g["w"], g["h"]) > 0, p["title"]
        assert min(g["x"], g["y"]) >= 0, p["title"]
        assert g["x"] + g["w"] <= 24, f"{name}: {p['title']!r} overflows the 24-column grid: {g}"
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"{name}: {p['title']!r} overlaps another panel"
        cells |= mine


# --- variables -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "dash"), DASHBOARDS, ids=IDS)
def test_datasource_variable(name: str, dash: dict[str, Any]) -> None:
    ds = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
    assert len(ds) == 1, f"{name}: want exactly one datasource variable"
    assert (ds[0]["name"], ds[0]["label"], ds[0]["query"]) == ("datasource", "Data source", "prometheus")


@pytest.mark.parametrize(("name", "dash"), DASHBOARDS, ids=IDS)
@pytest.mark.parametrize("var", ["job", "instance", "rank"])
def test_job_instance_rank_variables(name: str, dash: dict[str, Any], var: str) -> None:
    v = variables(dash).get(var)
    assert v is not None, f"{name}: no {var} variable"
    assert (v["type"], v["label"]) == ("query", var)
    assert v["datasource"]["uid"] == DS_UID
    assert (v["multi"], v["includeAll"], v["allValue"]) == (True, True, ".+")
    assert v["refresh"] == 2, f"{name}: {var} must refresh on time range change"
    assert re.fullmatch(rf"label_values\(.+, {var}\)", v["query"])


@pytest.mark.parametrize(("name", "dash"), DASHBOARDS, ids=IDS)
def test_every_variable_reference_is_defined(name: str, dash: dict[str, Any]) -> None:
    defined = set(variables(dash)) | GRAFANA_BUILTIN_VARS
    for key, expr in {**exprs(dash), **variable_selectors(dash)}.items():
        used = set(re.findall(r"\$\{?([A-Za-z_]\w*)", expr))
        assert used <= defined, f"{name} {key}: undefined variables {used - defined}"


# --- panels and targets --------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "dash"), DASHBOARDS, ids=IDS)
def test_every_panel_has_unit_description_and_templated_datasource(name: str, dash: dict[str, Any]) -> None:
    for p in panels(dash):
        assert p["title"], f"{name}: panel {p['id']} has no title"
        assert p["description"].strip(), f"{name}: {p['title']!r} has no description"
        assert p["fieldConfig"]["defaults"].get("unit"), f"{name}: {p['title']!r} has no unit"
        assert p["datasource"] == {"type": "prometheus", "uid": DS_UID}, p["title"]
        assert p["targets"], f"{name}: {p['title']!r} has no query"
        for t in p["targets"]:
            assert t["datasource"]["uid"] == DS_UID, f"{name}: {p['title']!r}/{t['refId']}"


def _selectors(expr: str) -> list[tuple[str, str]]:
    """``(metric, matchers)`` for every vector selector; matchers is ``""`` for a bare name."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', lambda m: m.group(0) if "$" in m.group(0) else '""', expr)
    names = metric_names(expr)
    out = []
    for m in re.finditer(r"(?<![\w:$])([A-Za-z_:][\w:]*)(\{[^}]*\})?", text):
        if m.group(1) in names:
            out.append((m.group(1), m.group(2) or ""))
    return out


@pytest.mark.parametrize(("name", "dash"), DASHBOARDS, ids=IDS)
def test_every_selector_filters_job_instance_and_rank(name: str, dash: dict[str, Any]) -> None:
    for key, expr in exprs(dash).items():
        if key.startswith("annotation/"):
            continue  # ALERTS: alert labels, filtered by job only (checked below)
        selectors = _selectors(expr)
        assert selectors, f"{name} {key}: no metric selector in {expr!r}"
        for metric, matchers in selectors:
            missing = [m for m in MATCHERS if m not in matchers]
            assert not missing, f"{name} {key}: {metric} lacks {missing}"


def _calls(expr: str, func: str) -> list[str]:
    """The argument text of every call to ``func`` (balanced parentheses)."""
    out = []
    for m in re.finditer(rf"\b{func}\s*\(", expr):
        depth, i = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(expr[i], 0)
            i += 1
        out.append(expr[m.end() : i - 1])
    return out


@pytest.mark.parametrize(("name", "dash"), DASHBOARDS, ids=IDS)
def test_rate_and_increase_use_rate_interval(name: str, dash: dict[str, Any]) -> None:
    seen = 0
    for key, expr in exprs(dash).items():
        for func in ("rate", "irate", "increase"):
            for arg in _calls(expr, func):
                seen += 1
                ranges = re.findall(r"\[([^\]]+)\]", arg)
                assert ranges == ["$__rate_interval"], f"{name} {key}: {func}() range {ranges}, want $__rate_interval"
        assert not re.search(r"\[\s*\d+[smhdwy]", expr), f"{name} {key}: hard-coded range in {expr!r}"
    if name != "memexporter-modules.json":
        assert seen, f"{name}: expected at least one rate()/increase() query"


def test_overview_has_alert_and_phase_annotations() -> None:
    notes = [a for a in BUILT["memexporter-overview.json"]["annotations"]["list"] if "expr" in a]
    assert [n["name"] for n in notes] == ["memexporter alerts", "probable fatal OOM", "out-of-step phases"]
    for note in notes:
        assert note["enable"] is True
        assert note["datasource"]["uid"] == DS_UID
    firing, fatal, phases = notes
    assert firing["expr"] == ('ALERTS{alertname=~"Memexporter.*", alertname!="MemexporterFatalOOMSuspected", '
                              'alertstate="firing", job=~"$job"}')
    # The fatal OOM is marked once, at the moment the target vanished (when the alert went pending).
    assert fatal["expr"] == 'ALERTS_FOR_STATE{alertname="MemexporterFatalOOMSuspected", job=~"$job"} * 1000'
    assert fatal["useValueForTime"] is True
    # Out-of-step phases (those the exporter keeps out of the step peak): a region while one is seen
    # open, and a mark where one completed (a phase shorter than a scrape is never seen open).
    out_of_step = 'phase=~"' + "|".join(sorted(OUT_OF_STEP_PHASES)) + '"'
    sel = 'job=~"$job", instance=~"$instance", rank=~"$rank", ' + out_of_step
    assert phases["expr"] == (
        f"max by (job, instance, rank, phase) (memexporter_phase_active{{{sel}}}) == 1\nor\n"
        f"max by (job, instance, rank, phase) (changes(memexporter_phase_completed_total{{{sel}}}[$__rate_interval])) > 0")
    assert phases["useValueForTime"] is False
    assert "{{phase}}" in phases["titleFormat"]


# --- GPU-only panels, derived from the spec table -----------------------------------------------


def test_gpu_only_marking_follows_the_spec_table() -> None:
    marked = []
    for _, dash in DASHBOARDS:
        for p in panels(dash):
            needs = [metric_names(t["expr"]) for t in p["targets"]]
            # the builder's own metric extraction agrees with the test's PromQL tokenizer
            assert [dashboards.metrics_of(t["expr"]) for t in p["targets"]] == needs, p["title"]
            want = all(any(BY_NAME[n].cuda_only for n in names) for names in needs)
            assert p["description"].endswith(dashboards.GPU_ONLY) == want, p["title"]
            if want:
                marked.append(p["title"])
    assert set(marked) == {"Allocator reserved vs allocated", "Allocator fragmentation", "Allocator retries and OOMs",
                           "GPU memory, all processes (NVML)"}


# --- committed files and drift -------------------------------------------------------------------


@pytest.mark.parametrize(("name", "dash"), DASHBOARDS, ids=IDS)
def test_committed_json_is_the_builder_output(name: str, dash: dict[str, Any]) -> None:
    path = REPO_ROOT / "grafana" / "dashboards" / name
    assert path.is_file(), f"{path} missing: run python -m memexporter.dashboards"
    assert path.read_text(encoding="utf-8") == dashboards.render(dash), "stale: run python -m memexporter.dashboards"
    assert json.loads(path.read_text(encoding="utf-8")) == dash


def test_no_extra_dashboard_files() -> None:
    on_disk = {p.name for p in (REPO_ROOT / "grafana" / "dashboards").glob("*.json")}
    assert on_disk == set(BUILT)


def test_check_flag_detects_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert dashboards.main(["--out", str(tmp_path)]) == 0
    assert dashboards.main(["--check", "--out", str(tmp_path)]) == 0
    victim = tmp_path / "memexporter-ranks.json"
    victim.write_text(victim.read_text(encoding="utf-8").replace("Ranks", "Rankz"), encoding="utf-8")
    assert dashboards.main(["--check", "--out", str(tmp_path)]) == 1
    assert "memexporter-ranks.json" in capsys.readouterr().err


def _allowed_names() -> set[str]:
    return set(BY_NAME) | recording_rules(RULE_FILES) | BUILTINS


@pytest.mark.parametrize(("name", "dash"), DASHBOARDS, ids=IDS)
def test_dashboards_name_only_exported_metrics(name: str, dash: dict[str, Any]) -> None:
    allowed = _allowed_names()
    for key, expr in {**exprs(dash), **variable_selectors(dash)}.items():
        unknown = metric_names(expr) - allowed
        assert not unknown, f"{name} {key}: {sorted(unknown)} not in memexporter.metrics.BY_NAME"


def test_alert_rules_name_only_exported_metrics() -> None:
    if not RULE_FILES:
        pytest.skip("no alerts/*.rules.yml yet: nothing to check")
    allowed = _allowed_names()
    for key, expr in rule_exprs(RULE_FILES).items():
        unknown = metric_names(expr) - allowed
        assert not unknown, f"{key}: {sorted(unknown)} not an exported metric (counters end in _total) or rule"


def test_drift_check_catches_an_unknown_metric() -> None:
    # The checks above must not pass vacuously: a misspelt counter is caught.
    assert metric_names('rate(memexporter_steps{job=~"$job"}[$__rate_interval])') - _allowed_names() == {
        "memexporter_steps"
    }


# --- PromQL parses (real promtool) ---------------------------------------------------------------


def test_every_query_parses_with_promtool() -> None:
    queries = {
        f"{name}/{key}": substitute(expr)
        for name, dash in DASHBOARDS
        for key, expr in {**exprs(dash), **variable_selectors(dash)}.items()
    }
    result = promtool_check_exprs(queries)
    assert result.returncode == 0, f"promtool check rules failed:\n{result.stdout}\n{result.stderr}"
    assert f"{len(queries)} rules found" in result.stdout


def test_promtool_parse_check_rejects_bad_promql() -> None:
    result = promtool_check_exprs({"bad": 'sum(rate(memexporter_steps_total{job=~".+"}[1m])'})
    assert result.returncode != 0


# --- provisioning --------------------------------------------------------------------------------


def test_provisioning_files_load_the_dashboards() -> None:
    prov = REPO_ROOT / "grafana" / "provisioning"
    ds = yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text(encoding="utf-8"))
    assert ds["apiVersion"] == 1
    (source,) = ds["datasources"]
    assert (source["type"], source["access"]) == ("prometheus", "proxy")
    assert source["url"].startswith("http")
    dash = yaml.safe_load((prov / "dashboards" / "memexporter.yml").read_text(encoding="utf-8"))
    assert dash["apiVersion"] == 1
    (provider,) = dash["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards/memexporter"


def test_docs_describe_every_panel() -> None:
    doc = (REPO_ROOT / "docs" / "dashboards.md").read_text(encoding="utf-8")
    for name, dash in DASHBOARDS:
        assert f"## {dash['title']}" in doc, f"docs/dashboards.md has no section for {name}"
        for p in panels(dash):
            gpu = (" *(GPU only)*" if p["description"].endswith(dashboards.GPU_ONLY)
                   else " *(sharded models only)*" if p["description"].endswith(dashboards.SHARDED_ONLY) else "")
            assert f"| {p['title']}{gpu} |" in doc, f"docs/dashboards.md does not describe {p['title']!r}"
