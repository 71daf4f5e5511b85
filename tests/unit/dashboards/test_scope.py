"""What every dashboard query selects (dashboards/scope.py): ``$job`` in every selector, the run and the
ranks selected once per query through ``memexporter_run_info`` (a run-wide panel says it is one), and
at scale only a few ranks: no panel returns a series per rank (``bounded``, a check that can fail), and
a time series picks its Top K ranks once, at the end of the range (``@ end()``). The module panels read
the ranks that export module rows. The dashboards these read: test_dashboards.py; the length of the
queries as Grafana sends them: test_queries.py."""

from __future__ import annotations

import re
from typing import Any

import pytest

from memexporter import dashboards
from memexporter.dashboards.scope import DETAIL, at_end
from tests.support.promql import metric_names
from tests.unit.dashboards.test_dashboards import BUILT, DASHBOARDS, IDS, exprs, panels


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


def test_module_panels_read_the_ranks_that_export_module_rows() -> None:
    for p in panels(BUILT["memexporter-modules.json"]):
        for t in p["targets"]:
            assert "memexporter_run_info{" in t["expr"] and DETAIL in t["expr"], (p["title"], t["expr"])
        if p["title"] != "Ranks with module rows":
            assert "(per_rank)" in p["description"] and "(representative)" in p["description"], p["title"]


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
