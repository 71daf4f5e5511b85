"""The Overview dashboard's annotations: firing alerts, a probable fatal OOM, out-of-step phases.

Grafana turns each series of an annotation query into marks: a region over the consecutive steps
where the value is 1 or more (``useValueForTime`` off), or one mark at the time the value holds
(in milliseconds, ``useValueForTime`` on).
"""

from __future__ import annotations

from memexporter.dashboards.grafana import DS, JSON
from memexporter.rules.phases import OUT_OF_STEP

FATAL_OOM = "MemexporterFatalOOMSuspected"


def alerts_annotation() -> JSON:
    return {"datasource": DS, "enable": True, "iconColor": "red", "name": "memexporter alerts", "step": "30s",
            "expr": f'ALERTS{{alertname=~"Memexporter.*", alertname!="{FATAL_OOM}", alertstate="firing", job=~"$job"}}',
            "titleFormat": "{{alertname}}", "textFormat": "{{severity}}: rank {{rank}} on {{instance}}",
            "tagKeys": "severity,rank", "useValueForTime": False}


def fatal_oom_annotation() -> JSON:
    """One mark where a target vanished near its limit: ALERTS_FOR_STATE holds the Unix time (s) the
    alert went pending, the first evaluation after the series stopped; Grafana wants milliseconds."""
    return {"datasource": DS, "enable": True, "iconColor": "dark-red", "name": "probable fatal OOM", "step": "30s",
            "expr": f'ALERTS_FOR_STATE{{alertname="{FATAL_OOM}", job=~"$job"}} * 1000',
            "titleFormat": "probably died of an OOM",
            "textFormat": "rank {{rank}} on {{instance}} ({{device}}) stopped right after a step peak near its limit",
            "tagKeys": "rank,device", "useValueForTime": True}


def phases_annotation(sel: str) -> JSON:
    """A region per occurrence of an out-of-step phase (an evaluation, a checkpoint): from the first
    scrape that saw it open to a rate interval after it completed. A phase shorter than a scrape is
    never seen open: its completion alone marks it. One series per rank and phase (``max by``), so
    the two halves join into one region."""
    by = "max by (job, instance, rank, phase)"
    active = f"{by} (memexporter_phase_active{{{sel}, {OUT_OF_STEP}}}) == 1"
    ended = f"{by} (changes(memexporter_phase_completed_total{{{sel}, {OUT_OF_STEP}}}[$__rate_interval])) > 0"
    return {"datasource": DS, "enable": True, "iconColor": "purple", "name": "out-of-step phases", "step": "30s",
            "expr": f"{active}\nor\n{ended}", "titleFormat": "{{phase}}",
            "textFormat": "rank {{rank}} on {{instance}}: {{phase}} (its memory is not in the step peak)",
            "tagKeys": "phase,rank", "useValueForTime": False}
