"""Lint, drift and parse checks for the generated Grafana dashboards (grafana/dashboards/*.json).

The lint rules follow grafana/dashboard-linter (not installable here), plus memexporter's own. Here:
stable uids, the grid, a unit and a description on every panel, ``$__rate_interval``, GPU-only panels
derived from the spec table, the committed files and their drift, only exported metrics named, the
provisioning files and the docs; and the dashboards built once (``BUILT``) with the helpers that read
them, for the files beside this one. There: the run and rank variables (test_variables.py); the run
and ranks selected once per query through ``memexporter_run_info``, and a bounded number of series per
panel whatever the rank count (test_scope.py); queries under VictoriaMetrics' 16 KiB cap with 1,024
ranks ticked (test_queries.py); the Overview's top, its ranks row and its annotations
(test_overview.py). The real ``promtool`` parses every query in
tests/integration/test_dashboards_promql.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from memexporter import dashboards
from memexporter.cli import dashboards as generate_dashboards
from memexporter.metrics import BY_NAME
from tests.support import REPO_ROOT
from tests.support.promql import (
    BUILTINS,
    metric_names,
    recording_rules,
    rule_exprs,
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
RULE_FILES = sorted((REPO_ROOT / "alerts").glob("*.rules.yml"))


def panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel with queries: the top-level ones and those inside rows (collapsed or not)."""
    out: list[dict[str, Any]] = []
    for p in dash["panels"]:
        out += p.get("panels", []) if p["type"] == "row" else [p]
    return out


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


def _fits(name: str, group: list[dict[str, Any]], below: int = 0) -> None:
    """The panels of one layer (the top level, or one collapsed row's) fit the grid without overlap."""
    cells: set[tuple[int, int]] = set()
    for p in group:
        g = p["gridPos"]
        assert min(g["w"], g["h"]) > 0, p["title"]
        assert g["x"] >= 0 and g["y"] >= below, p["title"]
        assert g["x"] + g["w"] <= 24, f"{name}: {p['title']!r} overflows the 24-column grid: {g}"
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"{name}: {p['title']!r} overlaps another panel"
        cells |= mine


@pytest.mark.parametrize(("name", "dash"), DASHBOARDS, ids=IDS)
def test_panel_ids_unique_and_grid_fits(name: str, dash: dict[str, Any]) -> None:
    ids = [q["id"] for p in dash["panels"] for q in (p, *p.get("panels", []))]
    assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids {ids}"
    _fits(name, dash["panels"])
    for row in [p for p in dash["panels"] if p["type"] == "row"]:
        assert row["gridPos"] == {"h": 1, "w": 24, "x": 0, "y": row["gridPos"]["y"]}, row
        # Collapsed, it holds its panels (laid out below its header when opened); open, it holds none.
        assert bool(row["panels"]) == row["collapsed"], row["title"]
        _fits(name, row["panels"], below=row["gridPos"]["y"] + 1)


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


# --- GPU-only panels, derived from the spec table -----------------------------------------------


def test_gpu_only_marking_follows_the_spec_table() -> None:
    marked = []
    for _, dash in DASHBOARDS:
        for p in panels(dash):
            needs = [metric_names(t["expr"]) & set(BY_NAME) for t in p["targets"]]
            # the builder's own metric extraction agrees with the test's PromQL tokenizer
            assert [dashboards.metrics_of(t["expr"]) for t in p["targets"]] == needs, p["title"]
            want = all(any(BY_NAME[n].cuda_only for n in names) for names in needs)
            assert p["description"].removesuffix(dashboards.RUN_WIDE).endswith(dashboards.GPU_ONLY) == want, p["title"]
            if want:
                marked.append(p["title"])
    assert set(marked) == {
        "Allocator reserved vs allocated",
        "Allocator fragmentation",
        "Allocator retries and OOMs",
        "GPU memory, all processes (NVML)",
        "Memory outside the allocator",
    }


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
    assert generate_dashboards.main(["--out", str(tmp_path)]) == 0
    assert generate_dashboards.main(["--check", "--out", str(tmp_path)]) == 0
    victim = tmp_path / "memexporter-ranks.json"
    victim.write_text(victim.read_text(encoding="utf-8").replace("Ranks", "Rankz"), encoding="utf-8")
    assert generate_dashboards.main(["--check", "--out", str(tmp_path)]) == 1
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
            text = p["description"].removesuffix(dashboards.RUN_WIDE)
            mark = (
                " *(GPU only)*"
                if text.endswith(dashboards.GPU_ONLY)
                else " *(sharded models only)*"
                if text.endswith(dashboards.SHARDED_ONLY)
                else ""
            )
            mark += " *(whole run)*" if text != p["description"] else ""
            assert f"| {p['title']}{mark} |" in doc, f"docs/dashboards.md does not describe {p['title']!r}"
