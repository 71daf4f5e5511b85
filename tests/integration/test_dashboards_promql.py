"""Every query of the generated Grafana dashboards (and every variable's selector), with the
variables filled in as Grafana would, parses with the real ``promtool`` (the other dashboard checks:
tests/unit/dashboards/test_dashboards.py); a query whose answer matters on series a live demo cannot
show (a failing collector) is evaluated by ``promtool test rules``."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.promql import promtool_check_exprs, promtool_expr_test, substitute
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


def _collector_failures(success: dict[str, int], expected: dict[str, int]) -> subprocess.CompletedProcess[str]:
    """The Overview's "Collector failures" query, as Grafana sends it for rank 0 of run r, over one
    rank whose collectors answer ``success`` (1 or 0) for three minutes: ``promtool test rules``
    passes when it gives ``{collector: value}`` = ``expected``. A rank of another run fails its host
    collector: never counted here."""
    (dash,) = [d for name, d in DASHBOARDS if name == "memexporter-overview.json"]
    (expr,) = [e for key, e in exprs(dash).items() if key.startswith("Collector failures/")]
    series = []
    for instance, run, ok in (("a:9400", "r", success), ("b:9400", "other", {"host": 0})):
        key = f'job="memexporter", instance="{instance}", rank="0"'
        series.append({"series": f'memexporter_run_info{{{key}, run_id="{run}", detail="per_rank"}}', "values": "1x3"})
        series += [
            {"series": f'memexporter_collector_success{{{key}, collector="{c}"}}', "values": f"{v}x3"}
            for c, v in ok.items()
        ]
    samples = [{"labels": f'{{collector="{c}"}}', "value": v} for c, v in expected.items()]
    return promtool_expr_test(substitute(expr, {"job": "memexporter", "run_id": "r", "rank": "0"}), series, samples)


def test_collector_failures_reads_zero_on_a_healthy_job_and_counts_a_failing_collector() -> None:
    # Before, a healthy job answered nothing (Grafana's "No data"), which reads like a broken panel.
    healthy = _collector_failures({"host": 1, "cuda": 1}, {"host": 0, "cuda": 0})
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    failing = _collector_failures({"host": 0, "cuda": 1}, {"host": 1, "cuda": 0})
    assert failing.returncode == 0, failing.stdout + failing.stderr
    wrong = _collector_failures({"host": 0, "cuda": 1}, {"host": 0, "cuda": 0})  # the check can fail
    assert wrong.returncode != 0 and "host" in wrong.stdout + wrong.stderr
