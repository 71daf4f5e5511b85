"""The run in the rules (rules/runs.py, issue 25): every rank alert carries its rank's ``run_id``; each
run alert counts the ranks of one run that meet its rank twin's condition, fires no later than they
do, and says how many and which is worst; the per-run records are the contract the Overview reads;
the run labels follow the selector; ``run_min_ranks`` is at least two. And the condition an alert, its
run twin and the twin's description read, recorded once just before them (rules/conditions.py). The
alerts' own contract, and the helpers these tests read the rendering with: test_rules.py."""

from __future__ import annotations

import dataclasses
import re
import textwrap

import pytest
import yaml

from memexporter import rules
from tests.support.promql import metric_names
from tests.support.rules import RUN_RECORDS
from tests.unit.rules.test_rules import ALERTS, ALL_ALERTS, DEFAULT, GROUPS, RUN_ALERTS, alerts, load, queries, records


@pytest.mark.parametrize("name", sorted(RUN_ALERTS))
def test_run_alert_counts_the_ranks_of_one_run(name: str) -> None:
    rank, run = ALERTS[name], RUN_ALERTS[name]
    labels = "job, namespace, run_id" + (", collector" if name == "MemexporterCollectorFailing" else "")
    # The rank alert's own condition, counted once per rank and run: one alert per run.
    inner = textwrap.indent(rank["expr"], "    ")
    assert run["expr"] == (f"count by ({labels}) (\n  count by ({labels}, instance, rank) (\n{inner}\n  )\n) >= 2")
    # It fires no later than its ranks (a shorter for:, at most by half), so Alertmanager can mute them.
    rank_for, run_for = (duration_seconds(r.get("for", "0s")) for r in (rank, run))
    assert run_for == max(rank_for - 300, rank_for // 2)
    # Two queries, once per run alert, however many ranks fire: the ranks that answer, and the worst.
    assert run["annotations"]["description"].count("| query") == 2
    assert 'sortByLabel "rank"' in run["annotations"]["description"]


def duration_seconds(text: str) -> int:
    units = {"h": 3600, "m": 60, "s": 1}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([hms])", text))


def _joined(expr: str, known: dict[str, str]) -> bool:
    """``expr`` joins the rank's run_id, or reads a record that does (its own, or through its inputs)."""
    return "group_left(run_id)" in expr or any(_joined(known[n], known) for n in metric_names(expr) if n in known)


@pytest.mark.parametrize("name", ALL_ALERTS)
def test_rank_alerts_carry_the_run_id(name: str) -> None:
    # Joined from run_info (or read from records that carry it), so Alertmanager can group and
    # inhibit per run without relabelling. promtool shows it label by label (alerts/tests/runs.yml).
    assert _joined(ALERTS[name]["expr"], records()), name


@pytest.mark.parametrize("name", sorted(RUN_ALERTS))
def test_alerts_read_their_condition_recorded_once(name: str) -> None:
    # The rank alert, its run twin and the twin's description query read one record of the condition,
    # evaluated just before them in the same group, not the condition three times over.
    condition = next(n for n in metric_names(ALERTS[name]["expr"]) if n.endswith(":condition"))
    for text in (
        ALERTS[name]["expr"],
        RUN_ALERTS[name]["expr"],
        *queries(RUN_ALERTS[name]["annotations"]["description"])[1:],
    ):
        assert condition in text, name
    group = next(g for g in yaml.safe_load(DEFAULT)["groups"] if any(r.get("alert") == name for r in g["rules"]))
    order = [r.get("record") or (r["alert"], r["labels"]["scope"]) for r in group["rules"]]
    assert order.index(condition) + 1 == order.index((name, "rank")) == order.index((name, "run")) - 1


def test_run_records_are_the_contracts() -> None:
    groups = {g["name"]: [r.get("record") or r["alert"] for r in g["rules"]] for g in yaml.safe_load(DEFAULT)["groups"]}
    assert list(groups) == GROUPS
    assert sorted(groups["memexporter.runs"]) == sorted(RUN_RECORDS)  # a group of their own: only those
    known = records()
    for name in RUN_RECORDS:
        by = "job, namespace, run_id" + (", device_kind" if name.startswith("run_device_kind:") else "")
        assert f"by ({by})" in known[name], name
    assert (
        known["run:memexporter_ranks:count"]
        == 'count by (job, namespace, run_id) (rank:memexporter_run:info{job="memexporter"})'
    )
    info = known["rank:memexporter_run:info"]
    assert "topk by (job, instance, rank) (1," in info  # one per rank: a duplicate would fail every join
    assert "exported_run_id" in info and "memexporter_build_info" in info
    # The per-rank records that join the rank's run come after its identity, in the same group.
    assert groups["memexporter.rules"][0] == "rank:memexporter_run:info"


def test_run_labels_add_what_the_selector_shares() -> None:
    text = rules.render(selector='cluster="a",job=~"trainer-.*",rank!="0"')
    records = {r["record"]: r["expr"] for r in load(text) if "record" in r}
    assert records["run:memexporter_ranks:count"].startswith("count by (job, namespace, run_id, cluster) (")
    assert "count by (job, namespace, run_id, cluster) (" in alerts(text, "run")["MemexporterMemoryLeak"]["expr"]


@pytest.mark.parametrize("bad", [0, 1, -2])
def test_run_min_ranks_is_at_least_two(bad: int) -> None:
    with pytest.raises(ValueError, match="run_min_ranks"):
        rules.render_config(dataclasses.replace(rules.RulesConfig.default(), run_min_ranks=bad))
    text = rules.render_config(dataclasses.replace(rules.RulesConfig.default(), run_min_ranks=8))
    assert alerts(text, "run")["MemexporterMemoryLeak"]["expr"].endswith(") >= 8")
