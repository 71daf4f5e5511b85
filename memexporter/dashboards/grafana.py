"""Grafana's classic dashboard JSON model (schemaVersion 39, loads in Grafana 10 and 11), from panel tables.

A ``Panel`` is a row of a table (title, type, unit, description, queries); ``dashboard()`` lays the
panels out on the 24-column grid and adds the data source, job, instance and rank variables. A
panel whose every query needs a CUDA-only metric (``cuda_only`` in the spec table) gets the suffix
``(GPU only)`` in its description, so readers and tests know it stays empty on a CPU job; one whose
every query needs a metric of sharded models only (``sharded_only``) gets ``(sharded models only)``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from memexporter.metrics import BY_NAME

JSON = dict[str, Any]
DS: JSON = {"type": "prometheus", "uid": "${datasource}"}
GPU_ONLY = " (GPU only)"
SHARDED_ONLY = " (sharded models only)"
SCHEMA_VERSION = 39
_METRIC = re.compile(r"\bmemexporter_[a-z0-9_]+\b")


@dataclass(frozen=True)
class Panel:
    """One panel: ``targets`` are ``(expr, legend)``; ``w``/``h`` in grid units (24 columns)."""

    title: str
    kind: str  # timeseries | stat | bargauge | table
    unit: str
    description: str
    targets: tuple[tuple[str, str], ...]
    w: int = 12
    h: int = 8
    stack: bool = False
    instant: bool = False
    thresholds: tuple[tuple[str, float | None], ...] = (("green", None),)


def metrics_of(expr: str) -> set[str]:
    """The memexporter metrics a query reads (the dashboards use no recording rules)."""
    return set(_METRIC.findall(expr))


def gpu_only(exprs: list[str]) -> bool:
    """True when every query needs at least one CUDA-only metric: the panel is empty on a CPU job."""
    return bool(exprs) and all(any(BY_NAME[n].cuda_only for n in metrics_of(e)) for e in exprs)


def sharded_only(exprs: list[str]) -> bool:
    """True when every query needs a metric of sharded models: the panel is empty for other jobs."""
    return bool(exprs) and all(any(BY_NAME[n].sharded_only for n in metrics_of(e)) for e in exprs)


def _suffix(exprs: list[str]) -> str:
    return GPU_ONLY if gpu_only(exprs) else SHARDED_ONLY if sharded_only(exprs) else ""


def _target(ref: str, expr: str, legend: str, p: Panel) -> JSON:
    return {"datasource": DS, "editorMode": "code", "expr": expr, "legendFormat": legend, "refId": ref,
            "range": not p.instant, "instant": p.instant, **({"format": "table"} if p.kind == "table" else {})}


def _options(p: Panel) -> JSON:
    reduce = {"calcs": ["lastNotNull"], "fields": "", "values": False}
    if p.kind == "timeseries":
        return {"legend": {"calcs": ["lastNotNull", "max"], "displayMode": "table", "placement": "bottom",
                           "showLegend": True},
                "tooltip": {"mode": "multi", "sort": "desc"}}
    if p.kind == "stat":
        return {"colorMode": "value", "graphMode": "none", "justifyMode": "auto", "orientation": "auto",
                "reduceOptions": reduce, "textMode": "value_and_name"}
    if p.kind == "bargauge":
        return {"displayMode": "gradient", "orientation": "horizontal", "reduceOptions": reduce,
                "showUnfilled": True, "valueMode": "color"}
    return {"cellHeight": "sm", "showHeader": True, "sortBy": [{"desc": True, "displayName": "activation"}]}


def _panel(pid: int, p: Panel, pos: JSON) -> JSON:
    exprs = [e for e, _ in p.targets]
    defaults: JSON = {"unit": p.unit, "thresholds": {"mode": "absolute", "steps": [
        {"color": c, "value": v} for c, v in p.thresholds]}}
    if p.kind == "timeseries":
        defaults["custom"] = {"fillOpacity": 30 if p.stack else 10, "lineWidth": 1, "showPoints": "never",
                              "stacking": {"group": "A", "mode": "normal" if p.stack else "none"}}
    out: JSON = {
        "datasource": DS, "description": p.description + _suffix(exprs),
        "fieldConfig": {"defaults": defaults, "overrides": []}, "gridPos": pos, "id": pid,
        "options": _options(p), "targets": [_target(chr(65 + i), e, lg, p) for i, (e, lg) in enumerate(p.targets)],
        "title": p.title, "type": p.kind,
    }
    if p.kind == "table":  # merge the instant queries on their labels: one column per query, named by its legend
        rename = {f"Value #{t['refId']}": t["legendFormat"] for t in out["targets"]}
        out["transformations"] = [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True}, "renameByName": rename}}]
    return out


def _layout(panels: list[Panel]) -> list[JSON]:
    """Flow the panels left to right into the 24-column grid, wrapping to a new row when full."""
    out, x, y, row_h = [], 0, 0, 0
    for i, p in enumerate(panels, start=1):
        if x + p.w > 24:
            x, y, row_h = 0, y + row_h, 0
        out.append(_panel(i, p, {"h": p.h, "w": p.w, "x": x, "y": y}))
        x, row_h = x + p.w, max(row_h, p.h)
    return out


def _query_var(name: str, query: str, sort: int) -> JSON:
    return {"name": name, "label": name, "type": "query", "datasource": DS, "definition": query, "query": query,
            "refresh": 2, "multi": True, "includeAll": True, "allValue": ".+", "sort": sort, "regex": "",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "hide": 0, "options": []}


def _variables(extra: list[JSON]) -> list[JSON]:
    info = "memexporter_build_info"
    return [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "options": [], "refresh": 1, "regex": ""},
        _query_var("job", f"label_values({info}, job)", 1),
        _query_var("instance", f'label_values({info}{{job=~"$job"}}, instance)', 1),
        _query_var("rank", f'label_values({info}{{job=~"$job", instance=~"$instance"}}, rank)', 3),
        *extra,
    ]


def dashboard(uid: str, title: str, panels: list[Panel], extra_vars: list[JSON] | None = None,
              annotations: list[JSON] | None = None) -> JSON:
    builtin = {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
               "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"}
    return {
        "annotations": {"list": [builtin, *(annotations or [])]}, "description": f"memexporter: {title}",
        "editable": True, "graphTooltip": 1, "id": None, "links": [{"asDropdown": True, "includeVars": True,
        "keepTime": True, "tags": ["memexporter"], "title": "memexporter", "type": "dashboards"}],
        "panels": _layout(panels), "refresh": "30s", "schemaVersion": SCHEMA_VERSION, "tags": ["memexporter"],
        "templating": {"list": _variables(extra_vars or [])}, "time": {"from": "now-1h", "to": "now"},
        "timepicker": {}, "timezone": "browser", "title": f"memexporter / {title}", "uid": uid, "version": 1,
    }


def render(dash: JSON) -> str:
    """The committed form: sorted keys, two-space indent, trailing newline."""
    return json.dumps(dash, indent=2, sort_keys=True) + "\n"
