"""Every dashboard query as Grafana sends it, its variables filled in: for benchmarks and length checks.

    from memexporter.dashboards import panel_queries
    for q in panel_queries(run_id="exp42", ranks=range(1024)):
        print(q.dashboard, q.panel, len(q.expr))

A variable left out (``None``) is "All": its ``allValue`` (``.+``), as Grafana writes it. A list is
what Grafana writes for several values ticked in a multi-value variable of a Prometheus data source:
each value regex-escaped, joined as ``(a|b|c)``; one value alone, escaped, without the parentheses
(Grafana's ``interpolateQueryExpr`` and ``prometheusSpecialRegexEscape``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from memexporter.dashboards.panels import build
from memexporter.dashboards.variables import ALL, JSON

Values = str | int | Iterable[str | int] | None
_SPECIAL = re.compile(r"[$^*{}\[\]'+?.()|]")
_VAR = re.compile(r"\$\{([A-Za-z_]\w*)(?::\w+)?\}|\$([A-Za-z_]\w*)|\[\[([A-Za-z_]\w*)\]\]")


@dataclass(frozen=True)
class Query:
    """One query of a dashboard: a panel's target (``instant`` or a range query) or an annotation."""

    dashboard: str  # file name, e.g. memexporter-overview.json
    panel: str  # panel title, or "annotation: <name>"
    ref: str  # the target's refId ("A", "B"...), or "" for an annotation
    expr: str  # PromQL with the variables filled in
    instant: bool  # an instant query (stat, bar gauge, table); else a range query
    collapsed: bool  # in a row collapsed by default: Grafana runs it only once the row is opened


def regex_value(value: str) -> str:
    """One value of a multi-value variable as Grafana escapes it for a ``=~`` matcher."""
    return _SPECIAL.sub(lambda m: "\\\\" + m.group(0), value.replace("\\", "\\\\\\\\"))


def formatted(values: Values) -> str:
    """A multi-value variable's text in a query: ``.+`` for All (None), ``(a|b)`` for several."""
    if values is None:
        return ALL
    items = [str(values)] if isinstance(values, str | int) else [str(v) for v in values]
    escaped = [regex_value(v) for v in items]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def interpolate(expr: str, table: Mapping[str, str]) -> str:
    """Replace ``$var``, ``${var}`` and ``[[var]]``; ``$1`` (a ``label_replace`` group) stays."""

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        return table.get(name, m.group(0))

    return _VAR.sub(repl, expr)


def _panels(dash: JSON) -> list[tuple[JSON, bool]]:
    """Every panel with its queries, and whether it sits in a collapsed row."""
    out: list[tuple[JSON, bool]] = []
    for p in dash["panels"]:
        if p["type"] == "row":
            out += [(child, bool(p["collapsed"])) for child in p.get("panels", [])]
        else:
            out.append((p, False))
    return out


def panel_queries(
    *,
    job: Values = None,
    run_id: Values = None,
    instances: Values = None,
    ranks: Values = None,
    topk: int = 10,
    rate_interval: str = "1m",
    annotations: bool = True,
) -> list[Query]:
    """Every panel query (and annotation query) of every dashboard, as Grafana would send it with
    these variables: ``None`` is All; ``rate_interval`` stands for Grafana's ``$__rate_interval``
    (4 x the data source's scrape interval, at least: 1m for 15 s)."""
    table = {
        "job": formatted(job),
        "run_id": formatted(run_id),
        "instance": formatted(instances),
        "rank": formatted(ranks),
        "topk": str(topk),
        "__rate_interval": rate_interval,
    }
    out: list[Query] = []
    for name, dash in sorted(build().items()):
        for panel, collapsed in _panels(dash):
            out += [
                Query(name, panel["title"], t["refId"], interpolate(t["expr"], table), bool(t["instant"]), collapsed)
                for t in panel["targets"]
            ]
        if annotations:
            out += [
                Query(name, f"annotation: {a['name']}", "", interpolate(a["expr"], table), False, False)
                for a in dash["annotations"]["list"]
                if "expr" in a
            ]
    return out
