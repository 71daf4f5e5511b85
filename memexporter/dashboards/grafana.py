"""Grafana's classic dashboard JSON model (schemaVersion 39, loads in Grafana 10 and 11), from panel tables.

A ``Panel`` is a row of a table (title, type, unit, description, queries); ``dashboard()`` lays the
panels out on the 24-column grid (a ``Row`` folds panels under a header, collapsed by default: Grafana
runs their queries only once it is opened) and adds the variables (``variables.py``). A panel whose
every query needs a CUDA-only metric (``cuda_only`` in the spec table) gets the suffix ``(GPU only)``
in its description, so readers and tests know it stays empty on a CPU job; one whose every query
needs a metric of sharded models only (``sharded_only``) gets ``(sharded models only)``; one that
reads the whole run (``run_wide``: per-run recording rules, or every rank of the run) says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from memexporter.dashboards.variables import DS, JSON, variables
from memexporter.metrics import BY_NAME

GPU_ONLY = " (GPU only)"
SHARDED_ONLY = " (sharded models only)"
RUN_WIDE = " Whole run: the instance and rank selection does not apply."
SCHEMA_VERSION = 39
# An exporter series, not a recording rule that names one (``run_device_kind:memexporter_...:max``).
_METRIC = re.compile(r"(?<![\w:])memexporter_[a-z0-9_]+(?![\w:])")


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
    run_wide: bool = False  # reads the whole run: $instance and $rank do not apply


@dataclass(frozen=True)
class Row:
    """A row header with its panels under it; collapsed, Grafana queries none of them until opened."""

    title: str
    panels: tuple[Panel, ...]
    collapsed: bool = True


def metrics_of(expr: str) -> set[str]:
    """The exporter's metrics a query reads (recording rules, ``level:metric:op``, excluded)."""
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
    return {
        "datasource": DS,
        "editorMode": "code",
        "expr": expr,
        "legendFormat": legend,
        "refId": ref,
        "range": not p.instant,
        "instant": p.instant,
        **({"format": "table"} if p.kind == "table" else {}),
    }


def _options(p: Panel) -> JSON:
    reduce = {"calcs": ["lastNotNull"], "fields": "", "values": False}
    if p.kind == "timeseries":
        return {
            "legend": {
                "calcs": ["lastNotNull", "max"],
                "displayMode": "table",
                "placement": "bottom",
                "showLegend": True,
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    if p.kind == "stat":
        return {
            "colorMode": "value",
            "graphMode": "none",
            "justifyMode": "auto",
            "orientation": "auto",
            "reduceOptions": reduce,
            "textMode": "value_and_name",
        }
    if p.kind == "bargauge":
        return {
            "displayMode": "gradient",
            "orientation": "horizontal",
            "reduceOptions": reduce,
            "showUnfilled": True,
            "valueMode": "color",
        }
    return {"cellHeight": "sm", "showHeader": True, "sortBy": [{"desc": True, "displayName": "activation"}]}


def _panel(pid: int, p: Panel, pos: JSON) -> JSON:
    exprs = [e for e, _ in p.targets]
    defaults: JSON = {
        "unit": p.unit,
        "thresholds": {"mode": "absolute", "steps": [{"color": c, "value": v} for c, v in p.thresholds]},
    }
    if p.kind == "timeseries":
        defaults["custom"] = {
            "fillOpacity": 30 if p.stack else 10,
            "lineWidth": 1,
            "showPoints": "never",
            "stacking": {"group": "A", "mode": "normal" if p.stack else "none"},
        }
    out: JSON = {
        "datasource": DS,
        "description": p.description + _suffix(exprs) + (RUN_WIDE if p.run_wide else ""),
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "gridPos": pos,
        "id": pid,
        "options": _options(p),
        "targets": [_target(chr(65 + i), e, lg, p) for i, (e, lg) in enumerate(p.targets)],
        "title": p.title,
        "type": p.kind,
    }
    if p.kind == "table":  # merge the instant queries on their labels: one column per query, named by its legend
        rename = {f"Value #{t['refId']}": t["legendFormat"] for t in out["targets"]}
        out["transformations"] = [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True}, "renameByName": rename}},
        ]
    return out


def _flow(panels: list[Panel], y: int) -> tuple[list[JSON], int]:
    """Flow panels left to right into the 24-column grid from ``y``, wrapping when a line is full;
    returns them (ids still 0) and the ``y`` below the last line."""
    out: list[JSON] = []
    x, line_h = 0, 0
    for p in panels:
        if x + p.w > 24:
            x, y, line_h = 0, y + line_h, 0
        out.append(_panel(0, p, {"h": p.h, "w": p.w, "x": x, "y": y}))
        x, line_h = x + p.w, max(line_h, p.h)
    return out, y + line_h


def _layout(items: Sequence[Panel | Row]) -> list[JSON]:
    """Panels in order; a ``Row`` starts a new line with its header. A collapsed row holds its panels
    (Grafana lays them out below it when opened), so what follows it starts right under the header."""
    out: list[JSON] = []
    y, loose = 0, list[Panel]()
    for item in [*items, Row("", ())]:  # the sentinel flushes the last loose panels
        if isinstance(item, Panel):
            loose.append(item)
            continue
        placed, y = _flow(loose, y)
        out, loose = out + placed, []
        if not item.title:
            break
        children, below = _flow(list(item.panels), y + 1)
        out.append(
            {
                "collapsed": item.collapsed,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "id": 0,
                "panels": children if item.collapsed else [],
                "title": item.title,
                "type": "row",
            }
        )
        out, y = (out, y + 1) if item.collapsed else (out + children, below)
    for pid, panel in enumerate([q for p in out for q in (p, *p.get("panels", []))], start=1):
        panel["id"] = pid
    return out


def dashboard(
    uid: str,
    title: str,
    panels: Sequence[Panel | Row],
    annotations: list[JSON] | None = None,
    detail_ranks: bool = False,
) -> JSON:
    """One dashboard; ``detail_ranks``: its rank variable offers only the ranks that export module rows."""
    builtin = {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }
    return {
        "annotations": {"list": [builtin, *(annotations or [])]},
        "description": f"memexporter: {title}",
        "editable": True,
        "graphTooltip": 1,
        "id": None,
        "links": [
            {
                "asDropdown": True,
                "includeVars": True,
                "keepTime": True,
                "tags": ["memexporter"],
                "title": "memexporter",
                "type": "dashboards",
            }
        ],
        "panels": _layout(panels),
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "tags": ["memexporter"],
        "templating": {"list": variables(detail_ranks)},
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "title": f"memexporter / {title}",
        "uid": uid,
        "version": 1,
    }


def render(dash: JSON) -> str:
    """The committed form: sorted keys, two-space indent, trailing newline."""
    return json.dumps(dash, indent=2, sort_keys=True) + "\n"
