"""The dashboards' variables (dashboards/variables.py): one data source variable; job, run, instance
and rank, each read from ``memexporter_run_info`` of the run selected, "All" as ``.+``, never the
list of every value; the Modules dashboard lists the ranks that export module rows; every variable a
query names is defined. The dashboards these read, and the other lints: test_dashboards.py."""

from __future__ import annotations

import re
from typing import Any

import pytest

from memexporter.dashboards.scope import DETAIL
from tests.unit.dashboards.test_dashboards import DASHBOARDS, DS_UID, IDS, exprs, variable_selectors, variables

GRAFANA_BUILTIN_VARS = {"__rate_interval", "__interval", "__range", "__range_s", "__interval_ms"}


@pytest.mark.parametrize(("name", "dash"), DASHBOARDS, ids=IDS)
def test_datasource_variable(name: str, dash: dict[str, Any]) -> None:
    ds = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
    assert len(ds) == 1, f"{name}: want exactly one datasource variable"
    assert (ds[0]["name"], ds[0]["label"], ds[0]["query"]) == ("datasource", "Data source", "prometheus")


@pytest.mark.parametrize(("name", "dash"), DASHBOARDS, ids=IDS)
@pytest.mark.parametrize(
    ("var", "label", "multi"),
    [("job", "job", True), ("run_id", "run", True), ("instance", "instance", False), ("rank", "rank", True)],
)
def test_job_run_instance_rank_variables(name: str, dash: dict[str, Any], var: str, label: str, multi: bool) -> None:
    v = variables(dash).get(var)
    assert v is not None, f"{name}: no {var} variable"
    assert (v["type"], v["label"]) == ("query", label)
    assert v["datasource"]["uid"] == DS_UID
    # "All" is two characters in a query, never the list of every value; instance is one or All
    # (1,024 host:port values ticked would be about 31 KiB, past VictoriaMetrics' cap).
    assert (v["multi"], v["includeAll"], v["allValue"]) == (multi, True, ".+")
    assert v["refresh"] == 2, f"{name}: {var} must refresh on time range change"
    assert re.fullmatch(rf"label_values\(memexporter_run_info.*, {var}\)", v["query"])


@pytest.mark.parametrize(("name", "dash"), DASHBOARDS, ids=IDS)
def test_variables_are_scoped_to_the_run(name: str, dash: dict[str, Any]) -> None:
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names == ["datasource", "job", "run_id", "instance", "rank", "topk"]
    selectors = variable_selectors(dash)
    assert selectors["variable/run_id"] == 'memexporter_run_info{job=~"$job"}'
    assert selectors["variable/instance"] == 'memexporter_run_info{job=~"$job", run_id=~"$run_id"}'
    # The Modules dashboard lists the ranks that export module rows; the others every rank of the run.
    detail = f", {DETAIL}" if name == "memexporter-modules.json" else ""
    assert selectors["variable/rank"] == (
        f'memexporter_run_info{{job=~"$job", run_id=~"$run_id", instance=~"$instance"{detail}}}'
    )
    topk = variables(dash)["topk"]
    assert (topk["type"], topk["current"]["value"]) == ("custom", "10")


@pytest.mark.parametrize(("name", "dash"), DASHBOARDS, ids=IDS)
def test_every_variable_reference_is_defined(name: str, dash: dict[str, Any]) -> None:
    defined = set(variables(dash)) | GRAFANA_BUILTIN_VARS
    for key, expr in {**exprs(dash), **variable_selectors(dash)}.items():
        used = set(re.findall(r"\$\{?([A-Za-z_]\w*)", expr))
        assert used <= defined, f"{name} {key}: undefined variables {used - defined}"
