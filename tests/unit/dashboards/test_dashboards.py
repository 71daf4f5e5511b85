"""Lint, drift and parse checks for the generated Grafana dashboards (grafana/dashboards/*.json).

The lint rules follow grafana/dashboard-linter (not installable here), plus memexporter's own: the
run and rank variables, the run and ranks selected once per query (through ``memexporter_run_info``),
queries under VictoriaMetrics' 16 KiB cap with 1,024 ranks ticked, a bounded number of series per
panel whatever the rank count, GPU-only panels derived from the spec table. The real ``promtool``
parses every query in tests/integration/test_dashboards_promql.py.
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
from memexporter.dashboards.scope import DETAIL, at_end
from memexporter.metrics import BY_NAME
from memexporter.tracking.phases import OUT_OF_STEP_PHASES
from tests.support import REPO_ROOT
from tests.support.promql import (
    BUILTINS,
    metric_names,
    recording_rules,
    rule_exprs,
)
from tests.support.rules import RUN_RECORDS

BUILT = dashboards.build()
DASHBOARDS = sorted(BUILT.items())
IDS = [name for name, _ in DASHBOARDS]
EXPECTED = {
    "memexporter-overview.json": ("memexporter-overview", "memexporter / Overview"),
    "memexporter-modules.json": ("memexporter-modules", "memexporter / Modules"),
    "memexporter-ranks.json": ("memexporter-ranks", "memexporter / Ranks"),
}
DS_UID = "${datasource}"
GRAFANA_BUILTIN_VARS = {"__rate_interval", "__interval", "__range", "__range_s", "__interval_ms"}
RULE_FILES = sorted((REPO_ROOT / "alerts").glob("*.rules.yml"))
RANKS_1024 = [str(r) for r in range(1024)]
VM_MAX_QUERY_LEN = 16 * 1024  # VictoriaMetrics' -search.maxQueryLen default: "too long query" past it


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


# --- variables -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "dash"), DASHBOARDS, ids=IDS)
def test_datasource_variable(name: str, dash: dict[str, Any]) -> None:
    ds = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
    assert len(ds) == 1, f"{name}: want exactly one datasource variable"
    assert (ds[0]["name"], ds[0]["label"], ds[0]["query"]) == ("datasource", "Data source", "prometheus")


@pytest.mark.parametrize(("name", "dash"), DASHBOARDS, ids=IDS)
@pytest.mark.parametrize(
    ("var", "label", "multi"),
    [("job", "job", True), ("run_id", "run", True), ("instance", "instance", False), ("rank", "rank", True)],
)
def test_job_run_instance_rank_variables(name: str, dash: dict[str, Any], var: str, label: str, multi: bool) -> None:
    v = variables(dash).get(var)
    assert v is not None, f"{name}: no {var} variable"
    assert (v["type"], v["label"]) == ("query", label)
    assert v["datasource"]["uid"] == DS_UID
    # "All" is two characters in a query, never the list of every value; instance is one or All
    # (1,024 host:port values ticked would be about 31 KiB, past VictoriaMetrics' cap).
    assert (v["multi"], v["includeAll"], v["allValue"]) == (multi, True, ".+")
    assert v["refresh"] == 2, f"{name}: {var} must refresh on time range change"
    assert re.fullmatch(rf"label_values\(memexporter_run_info.*, {var}\)", v["query"])


@pytest.mark.parametrize(("name", "dash"), DASHBOARDS, ids=IDS)
def test_variables_are_scoped_to_the_run(name: str, dash: dict[str, Any]) -> None:
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names == ["datasource", "job", "run_id", "instance", "rank", "topk"]
    selectors = variable_selectors(dash)
    assert selectors["variable/run_id"] == 'memexporter_run_info{job=~"$job"}'
    assert selectors["variable/instance"] == 'memexporter_run_info{job=~"$job", run_id=~"$run_id"}'
    # The Modules dashboard lists the ranks that export module rows; the others every rank of the run.
    detail = f", {DETAIL}" if name == "memexporter-modules.json" else ""
    assert selectors["variable/rank"] == (
        f'memexporter_run_info{{job=~"$job", run_id=~"$run_id", instance=~"$instance"{detail}}}'
    )
    topk = variables(dash)["topk"]
    assert (topk["type"], topk["current"]["value"]) == ("custom", "10")


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
def test_every_query_selects_the_run_and_the_ranks_once(name: str, dash: dict[str, Any]) -> None:
    """Every selector filters ``$job``; every query selects the run (``$run_id``); a query of per-rank
    series selects the ranks in one ``memexporter_run_info`` selector, so Grafana's regex of the
    ranks ticked is written once. A run-wide panel (per-run rules, or every rank of the run) says so."""
    run_wide = {p["title"] for p in panels(dash) if p["description"].endswith(dashboards.RUN_WIDE)}
    for key, expr in exprs(dash).items():
        selectors = _selectors(expr)
        assert selectors, f"{name} {key}: no metric selector in {expr!r}"
        for metric, matchers in selectors:
            assert 'job=~"$job"' in matchers, f'{name} {key}: {metric} lacks job=~"$job"'
        if key == "annotation/probable fatal OOM":
            continue  # the rank is gone, and with it its run_info: job only (checked below)
        assert 'run_id=~"$run_id"' in expr, f"{name} {key}: does not select the run"
        ranks = [(m, s) for m, s in selectors if 'rank=~"$rank"' in s]
        if key.split("/")[0] in run_wide:
            assert "$rank" not in expr and "$instance" not in expr, f"{name} {key}: run-wide, yet reads $rank"
            continue
        assert expr.count("$rank") == expr.count("$instance") == 1, f"{name} {key}: select the ranks once"
        ((metric, matchers),) = ranks
        assert metric == "memexporter_run_info" and 'instance=~"$instance"' in matchers, f"{name} {key}"


def test_run_wide_panels_are_marked() -> None:
    marked = {
        (n, p["title"]) for n, d in DASHBOARDS for p in panels(d) if p["description"].endswith(dashboards.RUN_WIDE)
    }
    top = {p["title"] for p in BUILT["memexporter-overview.json"]["panels"] if p["type"] != "row"}
    assert marked == {("memexporter-overview.json", t) for t in top} | {
        ("memexporter-ranks.json", "Peak spread across ranks (max - min)")
    }


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
    ranks = 'memexporter_run_info{job=~"$job", run_id=~"$run_id", instance=~"$instance", rank=~"$rank"}'
    alerts = 'alertname=~"Memexporter.*", alertname!="MemexporterFatalOOMSuspected", alertstate="firing", job=~"$job"'
    # The run-wide alerts of the selected runs; the per-rank ones of the selected ranks, except where
    # their run-wide twin fires (a leak on every rank: one mark, the run's, not 1,024).
    assert firing["expr"] == (
        f'ALERTS{{{alerts}, scope="run", run_id=~"$run_id"}}\nor\n'
        f'((ALERTS{{{alerts}, scope!="run"}} and on (job, instance, rank) {ranks}) '
        f'unless on (job, namespace, run_id, alertname) ALERTS{{{alerts}, scope="run"}})'
    )
    # The fatal OOM is marked once per run, at the moment its first target vanished (when the alert
    # went pending): the others stop with it.
    assert fatal["expr"] == (
        "bottomk by (job, namespace, run_id) (1, ALERTS_FOR_STATE{"
        'alertname="MemexporterFatalOOMSuspected", job=~"$job", scope!="run"}) * 1000'
    )
    assert fatal["useValueForTime"] is True
    # Out-of-step phases (those the exporter keeps out of the step peak): a region while one is seen
    # open, and a mark where one completed (a phase shorter than a scrape is never seen open); one
    # series per run and phase, however many ranks evaluate.
    sel = 'phase=~"' + "|".join(sorted(OUT_OF_STEP_PHASES)) + '", job=~"$job"'
    seen = (
        f"max by (job, instance, rank, phase) (memexporter_phase_active{{{sel}}} == 1 or "
        f"changes(memexporter_phase_completed_total{{{sel}}}[$__rate_interval]) > 0)"
    )
    assert phases["expr"] == (
        f"max by (job, run_id, phase) (({seen} * on (job, instance, rank) group_left (run_id) "
        f"max by (job, instance, rank, run_id) ({ranks})))"
    )
    assert phases["useValueForTime"] is False
    assert "{{phase}}" in phases["titleFormat"]


# --- scale: query length, series per panel, the Overview's run and its ranks ---------------------


def test_queries_stay_under_victoriametrics_cap_with_1024_ranks_ticked() -> None:
    """Grafana writes the ranks ticked as a regex, ``(0|1|...|1023)``: 4,011 bytes. Each query holds
    it once at most, so it grows by that alone; with "All" it holds ``.+``."""
    regex = dashboards.formatted(RANKS_1024)
    assert len(regex) == 4011
    every = dashboards.panel_queries(run_id="8f2c1d7e-train-exp42")
    node = "gpu-node-127.cluster.local:9407"  # one instance (or All): the variable is single-select
    ticked = dashboards.panel_queries(run_id="8f2c1d7e-train-exp42", ranks=RANKS_1024, instances=node)
    assert [(q.dashboard, q.panel, q.ref) for q in every] == [(q.dashboard, q.panel, q.ref) for q in ticked]
    assert len(every) == 63
    for a, b in zip(every, ticked, strict=True):
        grew = len(b.expr) - len(a.expr)
        assert grew in (0, len(regex) - 2 + len(dashboards.formatted(node)) - 2), (a.panel, grew)
    longest_all = max(len(q.expr.encode()) for q in every)
    longest = max(len(q.expr.encode()) for q in ticked)
    print(f"longest query: {longest_all} bytes with All, {longest} bytes with 1,024 ranks ticked")
    assert longest_all < 1024
    assert longest < VM_MAX_QUERY_LEN
    # Before issue 25 $rank stood in every selector, up to 3 times a query (12,495 bytes here).
    assert longest < 5000


def test_grafana_formatting_of_variables() -> None:
    # As Grafana's Prometheus data source writes them (prometheusSpecialRegexEscape, "(a|b)").
    assert dashboards.formatted(None) == ".+"
    assert dashboards.formatted(["3"]) == "3"
    assert dashboards.formatted(["0", "1", "12"]) == "(0|1|12)"
    assert dashboards.formatted("10.0.0.1:9400") == "10\\\\.0\\\\.0\\\\.1:9400"
    assert dashboards.formatted(["a|b", "c"]) == "(a\\\\|b|c)"
    assert (
        dashboards.interpolate('x{rank=~"$rank"}[$__rate_interval] "$1"', {"rank": "(1|2)", "__rate_interval": "1m"})
        == 'x{rank=~"(1|2)"}[1m] "$1"'
    )


_AGG = re.compile(r"(sum|min|max|avg|count|quantile|topk|bottomk)\s*(by\s*\(([^)]*)\))?\s*\(")
_OPS = re.compile(
    r"\s(or|unless|and|[-+*/]|==|>|<)\s+(?:(?:on|ignoring)\s*\([^)]*\)\s*)?"
    r"(?:(?:group_left|group_right)\s*\([^)]*\)\s*)?"
)


def _top_level(expr: str) -> str:
    """``expr`` with everything inside brackets and strings blanked: what is left is the top level."""
    out, depth, quote = [], 0, ""
    for ch in expr:
        if quote:
            quote = "" if ch == quote else quote
            out.append("_")
            continue
        if ch == '"' and depth:
            quote = ch
        depth -= ch in ")]}"
        out.append(ch if depth == 0 else "_")
        depth += ch in "([{"
    return "".join(out)


def bounded(expr: str) -> bool:
    """True when the query's series count does not grow with the rank count: a topk/bottomk, an
    aggregation by labels other than rank and instance, a per-run rule, or an operation whose
    result is limited by such a side (``and``: either; ``or``: both; ``unless``: the left)."""
    e = expr.strip()
    top = _top_level(e)
    ops = list(_OPS.finditer(top))
    if ops:
        weakest = min(ops, key=lambda m: {"or": 0, "unless": 1, "and": 1}.get(m.group(1), 2))
        left, right, op = e[: weakest.start()], e[weakest.end() :], weakest.group(1)
        if op == "or":
            return bounded(left) and bounded(right)
        if op == "unless":
            return bounded(left)
        scalar = re.fullmatch(r"\s*([\d.]+|time\(\))\s*", left) or re.fullmatch(r"\s*[\d.]+\s*", right)
        return (
            bounded(right if re.fullmatch(r"\s*([\d.]+|time\(\))\s*", left) else left)
            if scalar
            else bounded(left) or bounded(right)
        )
    if e.startswith("(") and top.endswith(")") and top.count("(") == 1:
        return bounded(e[1:-1])
    if re.fullmatch(r"[a-z_]+:[\w:]+\{[^}]*\}", e):
        return e.startswith("run")  # a per-run recording rule: one series per run and device kind
    m = _AGG.match(e)
    if m and top.count("(") == 1 + bool(m.group(2)) and top.endswith(")"):
        if m.group(1) in ("topk", "bottomk"):
            return True
        return m.group(2) is not None and not {"rank", "instance"} & {x.strip() for x in m.group(3).split(",")}
    return False


def test_the_bound_check_can_fail() -> None:
    assert not bounded('memexporter_memory_used_bytes{job=~"$job"}')
    assert not bounded('max by (rank, device) (memexporter_memory_peak_bytes{job=~"$job"})')
    assert not bounded('rate(memexporter_steps_total{job=~"$job"}[1m]) or topk(5, x)')
    assert not bounded("1 - memexporter_memory_peak_bytes / memexporter_memory_limit_bytes")
    assert bounded("1 - topk(5, memexporter_memory_peak_bytes / memexporter_memory_limit_bytes)")
    assert bounded("x and on (job, instance, rank) topk($topk, y)")
    assert bounded("max by (job, phase) (a) - min by (job) (b)")


@pytest.mark.parametrize(("name", "dash"), DASHBOARDS, ids=IDS)
def test_no_panel_returns_a_series_per_rank(name: str, dash: dict[str, Any]) -> None:
    """At 1,024 ranks a series per rank is 1,024 series (tens of MiB over a range): every panel query
    is bounded by Top K, by an aggregation, or by the runs. The alert annotation is left out: a rank's
    own alert is its own mark (run-wide alerts hide their per-rank twins)."""
    for key, expr in exprs(dash).items():
        if key != "annotation/memexporter alerts":
            assert bounded(expr), f"{name} {key}: a series per rank: {expr}"


def test_overview_reads_the_run_and_drills_into_ranks_on_request() -> None:
    dash = BUILT["memexporter-overview.json"]
    top = [p for p in dash["panels"] if p["type"] != "row"]
    (row,) = [p for p in dash["panels"] if p["type"] == "row"]
    # The top reads the per-run recording rules only: a refresh costs one series per run and device kind.
    read = {n for p in top for t in p["targets"] for n in metric_names(t["expr"])}
    assert read == set(RUN_RECORDS)
    # The ranks are in a row collapsed by default: Grafana runs none of its queries until it is opened.
    assert row["collapsed"] is True
    assert dash["panels"][-1] is row
    assert len(row["panels"]) == 15 and all(
        "memexporter_run_info" in t["expr"] for p in row["panels"] for t in p["targets"]
    )


def test_module_panels_read_the_ranks_that_export_module_rows() -> None:
    for p in panels(BUILT["memexporter-modules.json"]):
        for t in p["targets"]:
            assert "memexporter_run_info{" in t["expr"] and DETAIL in t["expr"], (p["title"], t["expr"])
        if p["title"] != "Ranks with module rows":
            assert "(per_rank)" in p["description"] and "(representative)" in p["description"], p["title"]


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


def test_at_end_reads_every_selector_at_the_end_of_the_range() -> None:
    expr = 'rate(memexporter_steps_total{job=~"$job"}[1m]) and on (job) memexporter_run_info{rank=~"$rank"}'
    assert at_end(expr) == (
        'rate(memexporter_steps_total{job=~"$job"}[1m] @ end()) and on (job) '
        'memexporter_run_info{rank=~"$rank"} @ end()'
    )


@pytest.mark.parametrize("name", ["memexporter-overview.json", "memexporter-ranks.json"])
def test_per_rank_time_series_pick_their_ranks_once(name: str) -> None:
    # A topk at each of a 6 h range's 720 steps joins every rank's series to run_info each time
    # (3 to 5 s a query at 1,024 ranks) and draws whichever ranks led at each step: the time series
    # pick their Top K at the end of the range instead, and draw those over the whole range.
    for panel in panels(BUILT[name]):
        for target in panel["targets"]:
            if not target["instant"] and re.search(r"\b(topk|bottomk)\(", target["expr"]):
                assert "@ end()" in target["expr"], f"{panel['title']}: {target['expr']}"
