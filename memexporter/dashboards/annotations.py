"""The Overview dashboard's annotations: firing alerts, a probable fatal OOM, out-of-step phases.

Grafana turns each series of an annotation query into marks: a region over the consecutive steps
where the value is 1 or more (``useValueForTime`` off), or one mark at the time the value holds
(in milliseconds, ``useValueForTime`` on). At 1,024 ranks a series per rank would be 1,024 marks
for one event: each annotation returns one series per run (or per alert and rank only where an
alert is a rank's own).
"""

from __future__ import annotations

from memexporter.dashboards.scope import JOB, KEY, info, with_run
from memexporter.dashboards.variables import DS, JSON
from memexporter.rules.phases import OUT_OF_STEP

FATAL_OOM = "MemexporterFatalOOMSuspected"
_FIRING = f'alertname=~"Memexporter.*", alertname!="{FATAL_OOM}", alertstate="firing", job=~"$job"'
_RUN = "job, namespace, run_id"  # the peer labels: one training run, as the rules name it


def alerts_annotation() -> JSON:
    """The run-wide alerts (``scope="run"``) of the selected runs, and the per-rank ones of the
    selected ranks, except where the run-wide twin fires: a leak on every rank is one mark (the
    run's, as Alertmanager sends one notification), a leak on one rank is that rank's."""
    run = f'ALERTS{{{_FIRING}, scope="run", run_id=~"$run_id"}}'
    ranks = f'(ALERTS{{{_FIRING}, scope!="run"}} and on ({KEY}) {info()})'
    twin = f'ALERTS{{{_FIRING}, scope="run"}}'
    return {
        "datasource": DS,
        "enable": True,
        "iconColor": "red",
        "name": "memexporter alerts",
        "step": "30s",
        "expr": f"{run}\nor\n({ranks} unless on ({_RUN}, alertname) {twin})",
        "titleFormat": "{{alertname}}",
        "textFormat": "{{severity}}: run {{run_id}}, rank {{rank}} on {{instance}} (no rank: the run's ranks)",
        "tagKeys": "severity,scope,rank",
        "useValueForTime": False,
    }


def fatal_oom_annotation() -> JSON:
    """One mark where a target vanished near its limit: ALERTS_FOR_STATE holds the Unix time (s) the
    alert went pending, the first evaluation after the series stopped; Grafana wants milliseconds.
    One per run: the first rank to go (when one rank dies of an OOM the others stop with it, and
    1,024 marks would say one thing), read from the per-rank alerts, which name the rank and device.
    Not kept to the selected ranks: the rank is gone, and with it its ``run_info``."""
    return {
        "datasource": DS,
        "enable": True,
        "iconColor": "dark-red",
        "name": "probable fatal OOM",
        "step": "30s",
        "expr": f'bottomk by ({_RUN}) (1, ALERTS_FOR_STATE{{alertname="{FATAL_OOM}", job=~"$job", scope!="run"}})'
        " * 1000",
        "titleFormat": "probably died of an OOM",
        "textFormat": "rank {{rank}} on {{instance}} ({{device}}) stopped right after a step peak near its limit "
        "(the first of its run)",
        "tagKeys": "rank,device",
        "useValueForTime": True,
    }


def phases_annotation() -> JSON:
    """A region per occurrence of an out-of-step phase (an evaluation, a checkpoint) on any selected
    rank of a run: from the first scrape that saw it open to a rate interval after it completed. A
    phase shorter than a scrape is never seen open: its completion alone marks it. One series per
    run and phase (``max by``), so the two halves join into one region, and 1,024 ranks evaluating
    together are one region, not 1,024. The ranks are selected once (one ``run_info`` selector)."""
    sel = f"{OUT_OF_STEP}, {JOB}"
    # One series per rank and phase before the join: open and just completed would otherwise be
    # two series with the same labels once the join drops the metric name.
    seen = (
        f"max by ({KEY}, phase) (memexporter_phase_active{{{sel}}} == 1 or "
        f"changes(memexporter_phase_completed_total{{{sel}}}[$__rate_interval]) > 0)"
    )
    return {
        "datasource": DS,
        "enable": True,
        "iconColor": "purple",
        "name": "out-of-step phases",
        "step": "30s",
        "expr": f"max by (job, run_id, phase) ({with_run(seen)})",
        "titleFormat": "{{phase}}",
        "textFormat": "{{phase}} on a selected rank of run {{run_id}} (its memory is not in the step peak)",
        "tagKeys": "phase,run_id",
        "useValueForTime": False,
    }
