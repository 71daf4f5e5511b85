"""The dashboards' queries as Grafana sends them, for ``bench_scale.py``.

Each panel target of each ``grafana/dashboards/*.json`` (the working tree's, or a revision's for
``--before``), each annotation query, and each query variable, with the variables filled in for one
run and All ranks: a variable with ``allValue`` is that (``.+``), one without is the regex of every
value Grafana would list (``(a|b|...)``, asked of Prometheus), a run variable is the simulated run,
any other its default. Today's dashboards come from ``memexporter.dashboards.panel_queries`` when
that helper exists (the same JSON, from the code that writes it).

Grafana's step for a panel about 1,000 px wide over 6 h: 6 h / 1,000 = 21.6 s, rounded up to the
scrape interval: 30 s at 15 s. ``$__rate_interval`` is max(step + scrape, 4 x scrape): 1 m.
Annotation queries run as range queries at a 60 s step (the Prometheus data source's default).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

PANEL_PIXELS = 1000
ANNOTATION_STEP = 60.0
_VAR = re.compile(r"\$\{([A-Za-z_]\w*)(?::\w+)?\}|\$([A-Za-z_]\w*)|\[\[([A-Za-z_]\w*)\]\]")
_LABEL_VALUES = re.compile(r"^\s*label_values\((?:(.*),)?\s*([A-Za-z_]\w*)\s*\)\s*$", re.S)
_SPECIAL = re.compile(r"[$^*{}\[\]'+?.()|\\]")


@dataclass(frozen=True)
class Query:
    """One query of a refresh: ``kind`` is ``range``, ``instant``, ``annotation`` or ``variable``
    (a variable's ``label_values``: asked when the dashboard loads, not at each refresh)."""

    dashboard: str
    panel: str
    kind: str
    expr: str
    step: float  # seconds; 0 for an instant query
    label: str = ""  # the label a variable lists
    collapsed: bool = False  # in a row collapsed by default: run only once the row is opened


def grafana_step(range_s: float, scrape_s: float) -> float:
    return max(scrape_s, math.ceil(range_s / PANEL_PIXELS / scrape_s) * scrape_s)


def rate_interval(step_s: float, scrape_s: float) -> float:
    return max(step_s + scrape_s, 4 * scrape_s)


def _fill(expr: str, table: dict[str, str]) -> str:
    return _VAR.sub(lambda m: table.get(m.group(1) or m.group(2) or m.group(3), m.group(0)), expr)


def _panels(panels: Iterable[dict[str, Any]], collapsed: bool = False) -> Iterable[tuple[dict[str, Any], bool]]:
    for p in panels:
        yield p, collapsed
        yield from _panels(p.get("panels", []), collapsed or bool(p.get("collapsed")))


def _duration(seconds: float) -> str:
    return f"{int(seconds)}s"


def from_json(
    dashboards: dict[str, str], run_id: str, values_of: Callable[[str, str], list[str]], range_s: float, scrape_s: float
) -> list[Query]:
    """The queries of ``dashboards`` (file name -> JSON text); ``values_of(metric_selector, label)``
    lists a variable's values (a ``label_values`` answer) when All has no ``allValue``."""
    step = grafana_step(range_s, scrape_s)
    base = {
        "__interval": _duration(step),
        "__rate_interval": _duration(rate_interval(step, scrape_s)),
        "__range": _duration(range_s),
        "__range_s": str(int(range_s)),
        "__interval_ms": str(int(step * 1000)),
    }
    out: list[Query] = []
    for name, text in sorted(dashboards.items()):
        dash, table = json.loads(text), dict(base)
        for var in dash.get("templating", {}).get("list", []):
            vname, query = var["name"], var.get("query")
            query = query.get("query", "") if isinstance(query, dict) else (query or "")
            if var.get("type") == "query":
                filled = _fill(query, table)
                m = _LABEL_VALUES.match(filled)
                if m:
                    out.append(
                        Query(name, f"variable: {vname}", "variable", (m.group(1) or "").strip(), 0.0, m.group(2))
                    )
                if "run" in vname:
                    table[vname] = run_id
                elif var.get("allValue"):
                    table[vname] = var["allValue"]
                elif m:
                    values = values_of((m.group(1) or "").strip(), m.group(2))
                    table[vname] = "(" + "|".join(_SPECIAL.sub(r"\\\\\g<0>", v) for v in values) + ")"
            elif var.get("type") != "datasource":
                current = var.get("current", {}).get("value", "")
                table[vname] = current[0] if isinstance(current, list) else str(current)
        for panel, collapsed in _panels(dash.get("panels", [])):
            for target in panel.get("targets", []):
                if not target.get("expr"):
                    continue
                instant = bool(target.get("instant")) and not target.get("range")
                out.append(
                    Query(
                        name,
                        panel.get("title", ""),
                        "instant" if instant else "range",
                        _fill(target["expr"], table),
                        0.0 if instant else step,
                        collapsed=collapsed,
                    )
                )
        for ann in dash.get("annotations", {}).get("list", []):
            if ann.get("expr"):
                out.append(
                    Query(
                        name,
                        f"annotation: {ann.get('name', '')}",
                        "annotation",
                        _fill(ann["expr"], table),
                        ANNOTATION_STEP,
                    )
                )
    return out


def from_helper(dashboards: dict[str, str], run_id: str, range_s: float, scrape_s: float) -> list[Query] | None:
    """Today's queries from ``memexporter.dashboards.panel_queries`` (None when it does not exist),
    with the variables' own queries from the JSON."""
    try:
        from memexporter.dashboards.queries import panel_queries
    except ImportError:
        return None
    step = grafana_step(range_s, scrape_s)
    table = {"__interval": _duration(step), "__range": _duration(range_s), "__range_s": str(int(range_s))}
    out = [q for q in from_json(dashboards, run_id, lambda s, label: [], range_s, scrape_s) if q.kind == "variable"]
    for q in panel_queries(run_id=run_id, rate_interval=_duration(rate_interval(step, scrape_s))):
        expr = _fill(q.expr, table)
        if q.panel.startswith("annotation: "):
            out.append(Query(q.dashboard, q.panel, "annotation", expr, ANNOTATION_STEP))
        else:
            out.append(
                Query(
                    q.dashboard,
                    q.panel,
                    "instant" if q.instant else "range",
                    expr,
                    0.0 if q.instant else step,
                    collapsed=q.collapsed,
                )
            )
    return out
