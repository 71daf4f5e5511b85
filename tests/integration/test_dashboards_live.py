"""Every dashboard query against a real Prometheus that scrapes the real demo job.

The demo trains on the CPU with per-module tracking on and an evaluation (an ``eval`` phase) every
5 steps, so the phase panels and annotation have an out-of-step phase to show; Prometheus scrapes
it every second and evaluates the shipped rules (the demo preset: short windows), whose per-run
recording rules the Overview's top reads. After about 25 s of data, each panel query (Grafana
variables filled in as Grafana writes them: ``memexporter.dashboards.panel_queries``' formatting)
must return at least one series, of the selected run and rank; a run-wide panel one per run. A GPU-only panel (every query needs a ``cuda_only`` metric of the spec
table) cannot return data on a CPU job, so there Prometheus must accept each query (a parse error
fails, an empty result does not) and every series it names must be in the spec table or a
recording rule of the shipped rules: a typo cannot hide behind "empty on CPU".

The dashboards are read as the operator gets them: the generated JSON files in grafana/dashboards.
The alert annotations are checked against alerts that fire: the Prometheus here also loads one
synthetic, always-firing alert per shipped alert name, over the demo's own series.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from memexporter import dashboards
from memexporter.metrics import SPECS
from tests.support import REPO_ROOT
from tests.support.binaries import require
from tests.support.demo import SMALL_MODEL, module_env, running_demo
from tests.support.ports import free_port
from tests.support.process import running_command
from tests.support.prometheus import Prometheus, running_prometheus
from tests.support.promql import BUILTINS, metric_names, recording_rules
from tests.support.rules import render_preset

# One module-scoped demo + Prometheus serves every test here: keep them on one xdist worker
# (--dist loadgroup), or each worker would start its own.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow(seconds=60, waits=True),
    pytest.mark.xdist_group("dashboards_live"),
]

SECONDS_OF_DATA = 25
DASHBOARDS = {
    p.name: json.loads(p.read_text(encoding="utf-8"))
    for p in sorted((REPO_ROOT / "grafana" / "dashboards").glob("*.json"))
}
# Every panel with queries, those inside the Overview's collapsed row included.
PANELS = [
    (name, p)
    for name, dash in DASHBOARDS.items()
    for row in dash["panels"]
    for p in (row.get("panels", []) if row["type"] == "row" else [row])
]
PANEL_IDS = [f"{name.removeprefix('memexporter-').removesuffix('.json')}/{p['title']}" for name, p in PANELS]
ANNOTATIONS = [(name, a) for name, dash in DASHBOARDS.items() for a in dash["annotations"]["list"] if "expr" in a]
ALERT_ANNOTATIONS = [(name, a) for name, a in ANNOTATIONS if metric_names(a["expr"]) & {"ALERTS", "ALERTS_FOR_STATE"}]
PHASE_ANNOTATIONS = [(name, a) for name, a in ANNOTATIONS if (name, a) not in ALERT_ANNOTATIONS]
# An evaluation forward every 5 steps (a second): the demo's out-of-step phase.
# The small model's modules still fill every module panel; an evaluation every 5 steps gives the phase
# panels and annotation something to show.
# Variable lengths, with the data's largest declared: the input panel's largest seen and declared lines.
DEMO_ARGS = (*SMALL_MODEL, "--eval-every", "5", "--seq-len-min", "8", "--max-input-elements", "4096")
RUN_ID = "dashboards-live"  # the demo's run (MEMEXPORTER_RUN_ID), as a launcher would name it
RUN_ALERT = "MemexporterMemoryLeak"  # fires run-wide in the synthetic rules below
RULE_FILES = sorted((REPO_ROOT / "alerts").glob("*.yml"))  # alerts/ holds rules files only
SPEC_NAMES = {s.name for s in SPECS}
# A second process of another run, whose host collector raises at every scrape: what the panel that
# counts failing collectors (0 on the healthy demo) must count.
FAILING_RUN = "dashboards-live-failing"
FAILING = """
import sys, time
import memexporter
from memexporter.collectors.host import HostCollector

def collect(self, scrape):
    raise RuntimeError("injected by test_dashboards_live: a collector that raises")

HostCollector.collect = collect
memexporter.start(port=int(sys.argv[1]), addr="127.0.0.1")
while True:
    time.sleep(1)
"""
CUDA_ONLY = {s.name for s in SPECS if s.cuda_only}
SHARDED_ONLY = {s.name for s in SPECS if s.sharded_only}


def gpu_only(panel: dict[str, Any]) -> bool:
    """Every query of the panel reads at least one CUDA-only series of the spec table."""
    return all(metric_names(t["expr"]) & CUDA_ONLY for t in panel["targets"])


def sharded_only(panel: dict[str, Any]) -> bool:
    """Every query reads a series of sharded models only (the demo's model is not sharded)."""
    return all(metric_names(t["expr"]) & SHARDED_ONLY for t in panel["targets"])


# The capacity needs inputs whose peaks stand out of the host's noise: the small CPU model's do not, so the
# exporter claims none (oom/capacity.py), by design. Its query must still name only real series.
NEEDS_SPREAD = {"memexporter_input_capacity_elements"}


def shipped_alerts() -> set[str]:
    names: set[str] = set()
    for path in RULE_FILES:
        for group in (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("groups", []):
            names.update(r["alert"] for r in group.get("rules", []) if "alert" in r)
    return names


def always_firing_rules(path: Path) -> Path:
    """Two per-rank alerts (``scope="rank"``) per shipped alert name over every demo series: one fires
    at once (what an annotation over ``ALERTS`` must show; the real conditions take hours), one stays
    pending. ``RUN_ALERT`` also fires run-wide (``scope="run"``): its per-rank twin is then no mark."""
    expr, rank = 'memexporter_steps_total{job="memexporter"} > 0', {"scope": "rank", "run_id": RUN_ID}
    rules = [
        rule
        for name in sorted(shipped_alerts())
        for rule in (
            {"alert": name, "expr": expr, "labels": {"severity": "test", **rank}},
            {"alert": name, "expr": expr, "for": "1h", "labels": {"severity": "test-pending", **rank}},  # stays pending
        )
    ]
    rules.append(
        {
            "alert": RUN_ALERT,
            "expr": f"max by (job) ({expr})",
            "labels": {"severity": "test", "scope": "run", "run_id": RUN_ID},
        }
    )
    path.write_text(yaml.safe_dump({"groups": [{"name": "always-firing", "rules": rules}]}), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, dict[str, str]]]:
    require("prometheus")
    port, failing = free_port(), free_port()
    rules = always_firing_rules(tmp_path_factory.mktemp("rules") / "always-firing.rules.yml")
    shipped = render_preset(tmp_path_factory.mktemp("shipped"), "demo")
    with (
        running_demo(port, *DEMO_ARGS, env={"MEMEXPORTER_RUN_ID": RUN_ID}),
        running_command(
            [sys.executable, "-c", FAILING, str(failing)],
            [f"http://127.0.0.1:{failing}/metrics"],
            env=module_env({"MEMEXPORTER_RUN_ID": FAILING_RUN}),
            what="a rank whose collector raises",
            scripts=True,  # its own code, forked: it reads nothing of a fresh interpreter
        ),
        running_prometheus([f"127.0.0.1:{port}", f"127.0.0.1:{failing}"], [shipped, rules]) as prom,
    ):
        prom.wait_targets_up(timeout=30)
        prom.wait_for(
            f'count_over_time(memexporter_steps_total{{job="memexporter"}}[1m]) >= {SECONDS_OF_DATA}',
            timeout=SECONDS_OF_DATA + 30,
        )
        (info,) = prom.query(f'memexporter_run_info{{job="memexporter", run_id="{RUN_ID}"}}')
        assert (info["metric"]["run_id"], info["metric"]["run_id_source"]) == (RUN_ID, "memexporter")
        # What Grafana sends for a selection of job "memexporter", the demo's run, its one instance and rank 0.
        values = {
            "job": "memexporter",
            "run_id": RUN_ID,
            "instance": f"127.0.0.1:{port}",
            "rank": "0",
            "failing_instance": f"127.0.0.1:{failing}",
        }
        yield prom, values


def substitute(expr: str, values: dict[str, str]) -> str:
    """``expr`` as Grafana sends it for ``values`` (each one value ticked, regex-escaped), Top K 10."""
    table = {name: dashboards.formatted(value) for name, value in values.items()}
    return dashboards.interpolate(expr, {**table, "topk": "10", "__rate_interval": "1m"})


def counts_failures(panel: dict[str, Any]) -> bool:
    """The panel that counts the ranks whose collector raised: 0 on a healthy run, per collector."""
    return any("memexporter_collector_success" in metric_names(t["expr"]) for t in panel["targets"])


def _values(result: list[dict[str, Any]]) -> dict[str, set[float]]:
    """``{collector: every value it took}`` of a query's answer (instant or range)."""
    return {
        s["metric"].get("collector", ""): {float(v) for _, v in s.get("values", [s.get("value", [0, "nan"])])}
        for s in result
    }


def run_wide(panel: dict[str, Any]) -> bool:
    return str(panel["description"]).endswith(dashboards.RUN_WIDE)


def _run(prom: Prometheus, expr: str, instant: bool) -> list[dict[str, Any]]:
    """The query as Grafana runs it; raises ``QueryError`` when Prometheus rejects it."""
    if instant:
        return prom.query(expr)
    end = time.time()
    return prom.query_range(expr, end - SECONDS_OF_DATA, end, step="1s")


@pytest.mark.parametrize(("name", "panel"), PANELS, ids=PANEL_IDS)
def test_panel_queries_return_data(live: tuple[Prometheus, dict[str, str]], name: str, panel: dict[str, Any]) -> None:
    prom, values = live
    for target in panel["targets"]:
        expr = substitute(target["expr"], values)
        result = _run(prom, expr, target["instant"])  # a query Prometheus rejects raises here
        if gpu_only(panel) or sharded_only(panel):
            # No data on a CPU job of an unsharded model, so check what can be checked: every name
            # is a real series (tests/integration/distributed/ has a sharded one).
            unknown = metric_names(expr) - SPEC_NAMES - recording_rules(RULE_FILES) - BUILTINS
            assert not unknown, f"{name}: {panel['title']!r} names series nothing exports: {sorted(unknown)}"
            assert result == [], f"panel {panel['title']!r} returned data on a CPU job of an unsharded model: {expr}"
            continue
        if metric_names(expr) & NEEDS_SPREAD:
            unknown = metric_names(expr) - SPEC_NAMES - recording_rules(RULE_FILES) - BUILTINS
            assert not unknown, f"{name}: {panel['title']!r} names series nothing exports: {sorted(unknown)}"
            continue
        if counts_failures(panel):  # 0 on the healthy demo (not "No data"); the other run's failing host counts 1
            healthy = _values(result)
            assert healthy and all(v == {0.0} for v in healthy.values()), f"{panel['title']!r}: {result}"
            failing = {**values, "run_id": FAILING_RUN, "instance": values["failing_instance"]}
            counted = _values(_run(prom, substitute(target["expr"], failing), target["instant"]))
            assert counted.pop("host") == {1.0} and all(v == {0.0} for v in counted.values()), counted
        assert result, f"{name}: {panel['title']!r}/{target['refId']} returned nothing: {expr}"
        for series in result:
            assert series["metric"].get("rank", "0") == "0", f"rank filter ignored: {series['metric']}"
            if run_wide(panel):  # one series per run (and device kind), of the run selected
                assert series["metric"]["run_id"] == values["run_id"], series["metric"]
        if "@ end()" in expr:  # the K ranks picked at the end of the range, the same over the whole range
            assert 0 < len(result) <= 10, expr
        if "topk(" in expr:  # at most K series at any instant
            assert 0 < len(prom.query(expr)) <= 10, expr
        other_run = substitute(target["expr"], {**values, "run_id": "some-other-run"})
        assert _run(prom, other_run, target["instant"]) == [], (
            f"{name}: {panel['title']!r} ignores the run: {other_run}"
        )


def test_every_query_as_the_benchmark_sends_it(live: tuple[Prometheus, dict[str, str]]) -> None:
    """``panel_queries()``, the list the scale benchmark runs, against the real Prometheus: every query
    is accepted, also with 1,024 ranks ticked (Grafana's long regex), and answers as with rank 0 alone
    (the demo has rank 0 only)."""
    prom, values = live
    one, many = (
        dashboards.panel_queries(job=values["job"], run_id=values["run_id"], instances=values["instance"], ranks=ranks)
        for ranks in (["0"], [str(r) for r in range(1024)])
    )
    assert len(one) == len(many) == sum(len(p["targets"]) for _, p in PANELS) + len(ANNOTATIONS)
    for a, b in zip(one, many, strict=True):
        assert len(b.expr) < 16 * 1024, (b.panel, len(b.expr))
        got_one, got_many = prom.query(a.expr), prom.query(b.expr)
        assert _labels(got_one) == _labels(got_many), (a.dashboard, a.panel, a.ref)


def _labels(result: list[dict[str, Any]]) -> list[dict[str, str]]:
    return sorted((s["metric"] for s in result), key=lambda m: sorted(m.items()))


def test_gpu_only_and_cpu_panels_both_exist() -> None:
    # The test above checks both branches; make sure neither is empty.
    marks = [gpu_only(p) for _, p in PANELS]
    assert any(marks)
    assert not all(marks)


def test_variable_queries_list_the_demo(live: tuple[Prometheus, dict[str, str]]) -> None:
    prom, values = live
    for dash in DASHBOARDS.values():
        for var in dash["templating"]["list"]:
            if var["type"] != "query":
                continue
            selector = var["query"].removeprefix("label_values(").rsplit(",", 1)[0]
            found = {s["metric"].get(var["name"]) for s in prom.query(substitute(selector, values))}
            assert values[var["name"]] in found, f"{dash['uid']}: ${var['name']} would not offer {values[var['name']]}"


def test_module_rows_come_from_the_demos_own_rank(live: tuple[Prometheus, dict[str, str]]) -> None:
    prom, values = live
    (panel,) = [p for _, p in PANELS if p["title"] == "Ranks with module rows"]
    ((target),) = panel["targets"]
    (row,) = prom.query(substitute(target["expr"], values))
    # One rank on its own: below 64 ranks every rank exports its own rows.
    assert (row["metric"]["detail"], row["metric"]["run_id"], row["value"][1]) == ("per_rank", values["run_id"], "1")


def test_modules_table_has_a_row_per_module(live: tuple[Prometheus, dict[str, str]]) -> None:
    prom, values = live
    (table,) = [p for name, p in PANELS if p["title"] == "Module breakdown"]
    for target in table["targets"]:
        modules = {s["metric"]["module"] for s in prom.query(substitute(target["expr"], values))}
        assert {"embed", "blocks.0.self_attn", "head"} <= modules, target["expr"]


def test_every_annotation_is_checked_here() -> None:
    # The alert annotations and the phase annotation, each against the live demo below.
    assert ALERT_ANNOTATIONS and PHASE_ANNOTATIONS
    assert [a["name"] for _, a in PHASE_ANNOTATIONS] == ["out-of-step phases"]


@pytest.mark.parametrize(("name", "note"), ALERT_ANNOTATIONS, ids=[f"{n}/{a['name']}" for n, a in ALERT_ANNOTATIONS])
def test_alert_annotations_show_the_jobs_firing_alerts(
    live: tuple[Prometheus, dict[str, str]], name: str, note: dict[str, Any]
) -> None:
    prom, values = live
    names = metric_names(note["expr"])
    assert names & {"ALERTS", "ALERTS_FOR_STATE"}, f"{name}: {note['name']!r} is not an alert annotation"
    alerts = shipped_alerts()
    expr = substitute(note["expr"], values)
    # The synthetic alerts fire within a few evaluations (all at once: one group, no `for`).
    ready: Callable[[list[dict[str, Any]]], bool] = bool
    if "ALERTS" in names:
        ready = lambda r: any(s["metric"]["alertname"] == RUN_ALERT for s in r)  # noqa: E731
    found = prom.wait_for(expr, timeout=30, predicate=ready)
    for series in found:
        labels = series["metric"]
        assert labels["alertname"] in alerts, labels
        assert labels["job"] == values["job"], labels
        if "ALERTS" in names:  # one mark per firing alert, none for a pending one
            assert labels["alertstate"] == "firing", labels
            assert labels["run_id"] == values["run_id"], labels
        else:  # ALERTS_FOR_STATE * 1000: marked at the moment the alert went active (ms)
            assert note["useValueForTime"], note
            assert time.time() - 600 < float(series["value"][1]) / 1000 <= time.time(), series
    if "ALERTS" in names:
        # The run-wide alert is the mark of its name: its per-rank twin is muted, as Alertmanager does;
        # every other alert is its rank's own mark.
        marks = {(s["metric"]["alertname"], s["metric"]["scope"]) for s in found}
        assert (RUN_ALERT, "run") in marks and (RUN_ALERT, "rank") not in marks, marks
        assert {n for n, scope in marks if scope == "rank"} >= alerts - {RUN_ALERT, "MemexporterFatalOOMSuspected"}
    other_job = substitute(note["expr"], {**values, "job": "some-other-job"})
    assert prom.query(other_job) == [], f"{name}: {note['name']!r} ignores the job variable: {other_job}"


@pytest.mark.parametrize(("name", "note"), PHASE_ANNOTATIONS, ids=[f"{n}/{a['name']}" for n, a in PHASE_ANNOTATIONS])
def test_phase_annotation_marks_the_demos_evaluations(
    live: tuple[Prometheus, dict[str, str]], name: str, note: dict[str, Any]
) -> None:
    prom, values = live
    # As Grafana runs it: a range query at the annotation's step; a region where the value is >= 1.
    expr = substitute(note["expr"], values)
    end = time.time()
    found = prom.query_range(expr, end - 60, end, step=note["step"])
    assert found, f"{name}: {note['name']!r} marks nothing while the demo evaluates every second: {expr}"
    for series in found:  # one series per run and phase, however many ranks evaluate
        assert series["metric"]["phase"] == "eval", series["metric"]  # forward, backward, optimizer: not marked
        assert series["metric"] == {"job": values["job"], "run_id": values["run_id"], "phase": "eval"}, series
        assert all(float(v) >= 1 for _, v in series["values"]), series
    other_rank = substitute(note["expr"], {**values, "rank": "7"})
    assert prom.query(other_rank) == [], f"{name}: {note['name']!r} ignores the rank variable: {other_rank}"
