"""Every dashboard query against a real Prometheus that scrapes the real demo job.

The demo trains on the CPU with per-module tracking on; Prometheus scrapes it every second. After
about 25 s of data, each panel query (Grafana variables substituted as the dashboards would) must
return at least one series, except GPU-only panels, which must return nothing on a CPU job: that
documents the "(GPU only)" mark.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from memexporter import dashboards
from tests.support.binaries import require
from tests.support.demo import running_demo
from tests.support.ports import free_port
from tests.support.prometheus import Prometheus, running_prometheus
from tests.support.promql import substitute

pytestmark = pytest.mark.integration

SECONDS_OF_DATA = 25
PANELS = [(name, p) for name, dash in sorted(dashboards.build().items()) for p in dash["panels"]]
PANEL_IDS = [f"{name.removeprefix('memexporter-').removesuffix('.json')}/{p['title']}" for name, p in PANELS]


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[Prometheus, dict[str, str]]]:
    require("prometheus")
    port = free_port()
    with running_demo(port), running_prometheus([f"127.0.0.1:{port}"]) as prom:
        prom.wait_targets_up(timeout=30)
        prom.wait_for(
            f'count_over_time(memexporter_steps_total{{job="memexporter"}}[1m]) >= {SECONDS_OF_DATA}',
            timeout=SECONDS_OF_DATA + 30,
        )
        # What Grafana sends for a selection of job "memexporter", this one instance and rank 0.
        values = {"job": "memexporter", "instance": f"127.0.0.1:{port}", "rank": "0"}
        yield prom, values


def _run(prom: Prometheus, expr: str, instant: bool) -> list[dict[str, Any]]:
    if instant:
        return prom.query(expr)
    end = time.time()
    return prom.query_range(expr, end - SECONDS_OF_DATA, end, step="1s")


@pytest.mark.parametrize(("name", "panel"), PANELS, ids=PANEL_IDS)
def test_panel_queries_return_data(live: tuple[Prometheus, dict[str, str]], name: str, panel: dict[str, Any]) -> None:
    prom, values = live
    gpu_only = panel["description"].endswith(dashboards.GPU_ONLY)
    for target in panel["targets"]:
        expr = substitute(target["expr"], values)
        result = _run(prom, expr, target["instant"])
        if gpu_only:
            assert result == [], f"GPU-only panel {panel['title']!r} returned data on a CPU job: {expr}"
            continue
        assert result, f"{name}: {panel['title']!r}/{target['refId']} returned nothing: {expr}"
        for series in result:
            assert series["metric"].get("rank", "0") == "0", f"rank filter ignored: {series['metric']}"
        if "topk(" in expr:  # at most K series at any instant
            assert 0 < len(prom.query(expr)) <= 10, expr


def test_gpu_only_and_cpu_panels_both_exist() -> None:
    # The test above checks both branches; make sure neither is empty.
    marks = [p["description"].endswith(dashboards.GPU_ONLY) for _, p in PANELS]
    assert any(marks)
    assert not all(marks)


def test_variable_queries_list_the_demo(live: tuple[Prometheus, dict[str, str]]) -> None:
    prom, values = live
    for dash in dashboards.build().values():
        for var in dash["templating"]["list"]:
            if var["type"] != "query":
                continue
            selector = var["query"].removeprefix("label_values(").rsplit(",", 1)[0]
            found = {s["metric"].get(var["name"]) for s in prom.query(substitute(selector, values))}
            assert values[var["name"]] in found, f"{dash['uid']}: ${var['name']} would not offer {values[var['name']]}"


def test_modules_table_has_a_row_per_module(live: tuple[Prometheus, dict[str, str]]) -> None:
    prom, values = live
    (table,) = [p for name, p in PANELS if p["type"] == "table"]
    for target in table["targets"]:
        modules = {s["metric"]["module"] for s in prom.query(substitute(target["expr"], values))}
        assert {"embed", "blocks.0.self_attn", "head"} <= modules, target["expr"]


def test_alert_annotation_query_is_valid(live: tuple[Prometheus, dict[str, str]]) -> None:
    prom, values = live
    notes = [a for a in dashboards.build()["memexporter-overview.json"]["annotations"]["list"] if "expr" in a]
    for note in notes:
        assert isinstance(prom.query(substitute(note["expr"], values)), list)  # no rules loaded: empty, no error
