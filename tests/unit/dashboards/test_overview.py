"""The Overview (dashboards/overview*.py, annotations.py): its top reads only the per-run recording
rules, its ranks sit in a row collapsed by default, and its annotations mark the firing alerts (the run's,
or a rank's where its run's twin does not fire), a probable fatal OOM once per run, and the out-of-step
phases. The lints of every dashboard: test_dashboards.py and the files beside it."""

from __future__ import annotations

from memexporter.tracking.phases import OUT_OF_STEP_PHASES
from tests.support.promql import metric_names
from tests.support.rules import RUN_RECORDS
from tests.unit.dashboards.test_dashboards import BUILT, DS_UID


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
    assert len(row["panels"]) == 16 and all(
        "memexporter_run_info" in t["expr"] for p in row["panels"] for t in p["targets"]
    )
