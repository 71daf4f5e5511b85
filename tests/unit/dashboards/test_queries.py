"""The queries as Grafana sends them (dashboards/queries.py): the variables written as Grafana's
Prometheus data source writes them, and every query under VictoriaMetrics' 16 KiB cap with 1,024
ranks ticked (``$rank`` and ``$instance`` once per query, checked in test_scope.py)."""

from __future__ import annotations

from memexporter import dashboards

RANKS_1024 = [str(r) for r in range(1024)]
VM_MAX_QUERY_LEN = 16 * 1024  # VictoriaMetrics' -search.maxQueryLen default: "too long query" past it


def test_queries_stay_under_victoriametrics_cap_with_1024_ranks_ticked() -> None:
    """Grafana writes the ranks ticked as a regex, ``(0|1|...|1023)``: 4,011 bytes. Each query holds
    it once at most, so it grows by that alone; with "All" it holds ``.+``."""
    regex = dashboards.formatted(RANKS_1024)
    assert len(regex) == 4011
    every = dashboards.panel_queries(run_id="8f2c1d7e-train-exp42")
    node = "gpu-node-127.cluster.local:9407"  # one instance (or All): the variable is single-select
    ticked = dashboards.panel_queries(run_id="8f2c1d7e-train-exp42", ranks=RANKS_1024, instances=node)
    assert [(q.dashboard, q.panel, q.ref) for q in every] == [(q.dashboard, q.panel, q.ref) for q in ticked]
    assert len(every) == 67
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
