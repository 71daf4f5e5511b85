"""Every query of the generated Grafana dashboards (and every variable's selector), with the
variables filled in as Grafana would, parses with the real ``promtool`` (the other dashboard checks:
tests/unit/dashboards/test_dashboards.py)."""

from __future__ import annotations

import pytest

from tests.support.promql import promtool_check_exprs, substitute
from tests.unit.dashboards.test_dashboards import DASHBOARDS, exprs, variable_selectors

pytestmark = pytest.mark.integration


def test_every_query_parses_with_promtool() -> None:
    queries = {
        f"{name}/{key}": substitute(expr)
        for name, dash in DASHBOARDS
        for key, expr in {**exprs(dash), **variable_selectors(dash)}.items()
    }
    result = promtool_check_exprs(queries)
    assert result.returncode == 0, f"promtool check rules failed:\n{result.stdout}\n{result.stderr}"
    assert f"{len(queries)} rules found" in result.stdout


def test_promtool_parse_check_rejects_bad_promql() -> None:
    result = promtool_check_exprs({"bad": 'sum(rate(memexporter_steps_total{job=~".+"}[1m])'})
    assert result.returncode != 0
