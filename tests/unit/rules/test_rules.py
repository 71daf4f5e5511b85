"""The alert rules: committed files equal the renderer's output, every alert is complete and
documented, every name they read exists, the template really is parameterised, and every alert has a
firing and a silent promtool case. Every alert comes per rank (``scope="rank"``) and, bar
RankImbalance, per run (``scope="run"``). The helpers here (``load``, ``alerts``, ``records``...) read
the rendering for the other files of this folder: the run alerts and records (test_runs.py), the peer
labels (test_params_peer_labels.py), the selector (test_selector.py), the phases (test_phases.py)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from memexporter import rules
from memexporter.metrics import BY_NAME
from tests.support import REPO_ROOT
from tests.support.promql import metric_names

ALERTS_DIR = REPO_ROOT / "alerts"
COMMITTED = {"default": ALERTS_DIR / "memexporter.rules.yml"}
RUNBOOK = ALERTS_DIR / "runbook.md"

# DESIGN.md section 5, "Alert names (contract)".
CONTRACT_ALERTS = (
    "MemexporterOOMPredicted",
    "MemexporterOOMImminent",
    "MemexporterMemoryLeak",
    "MemexporterAllocatorThrashing",
    "MemexporterOOMOccurred",
    "MemexporterFragmentationHigh",
    "MemexporterRankImbalance",
    "MemexporterCollectorFailing",
)
# Additions to the contract (DESIGN.md allows new alerts): issue 9's fatal OOM, issue 23's stalled run,
# issue 41's input over capacity.
ADDED_ALERTS = ("MemexporterFatalOOMSuspected", "MemexporterTrainingStalled", "MemexporterInputOverCapacity")
# The alerts that page (the critical severity parameter); every other one is a warning.
PAGING_ALERTS = ("MemexporterOOMImminent", "MemexporterTrainingStalled")
# Alerts about a rank, not a device: their series have no device label.
RANK_ALERTS = ("MemexporterCollectorFailing", "MemexporterTrainingStalled")
ALL_ALERTS = CONTRACT_ALERTS + ADDED_ALERTS
# One rank against its peers: a cause of its own, never shared by the whole run.
NO_RUN_TWIN = ("MemexporterRankImbalance", "MemexporterInputOverCapacity")
# Two rules of one name, one severity each (the kubernetes-mixin's volume alerts): critical when the declared
# largest input does not fit, warning when the largest seen nears the capacity (rules/inputs.py).
TWO_SEVERITIES = ("MemexporterInputOverCapacity",)
SCOPED = [(name, "rank") for name in ALL_ALERTS] + [(name, "run") for name in ALL_ALERTS if name not in NO_RUN_TWIN]
# The rules may read any series in the spec table (the single source of truth), their own records,
# and Prometheus' own `up` (MemexporterFatalOOMSuspected tells a dead target from a failing collector).
RULE_INPUTS = frozenset(BY_NAME) | {"up"}
# The PromQL of the annotations' template queries: {{ with printf "<query>" $labels.job ... | query }}.
TEMPLATE_QUERY = re.compile(r'printf "((?:[^"\\]|\\.)*)"')
RECORD_NAME = re.compile(r"[a-z_]+:[a-z_]+:[a-z0-9_]+")
OUT_OF_STEP = 'phase=~"checkpoint|eval|predict|test|validation"'
UNIT_TESTS = sorted((ALERTS_DIR / "tests").glob("*.yml"))


def load(text: str) -> list[dict[str, Any]]:
    """Every rule of a rendered file, groups flattened."""
    doc = yaml.safe_load(text)
    return [r for g in doc["groups"] for r in g["rules"]]


def alerts(text: str, scope: str = "rank") -> dict[str, dict[str, Any]]:
    """The alerts of ``scope`` (``rank`` or ``run``), by name."""
    return {r["alert"]: r for r in load(text) if "alert" in r and r["labels"]["scope"] == scope}


def queries(annotation: str) -> list[str]:
    """The PromQL of every template query in ``annotation``, ``%q`` arguments as empty strings."""
    return [
        q.replace('\\"', '"').replace("\\\\", "\\").replace("%q", '""').replace("%%", "%")
        for q in TEMPLATE_QUERY.findall(annotation)
        if "memexporter" in q
    ]  # not printf "%.0f"


DEFAULT = rules.render()
ALERTS = alerts(DEFAULT)
RUN_ALERTS = alerts(DEFAULT, "run")


def test_alerts_folder_holds_only_the_default_rendering() -> None:
    # DESIGN.md section 5: `rule_files: ["alerts/*.yml"]` must load the default rules and nothing
    # else. Presets are rendered where they are used; the Alertmanager example is in alertmanager/.
    assert sorted(p.name for p in ALERTS_DIR.glob("*.yml")) == ["memexporter.rules.yml"]
    assert sorted(p.name for p in ALERTS_DIR.glob("*.yaml")) == []
    assert (REPO_ROOT / "alertmanager" / "alertmanager.example.yml").is_file()


@pytest.mark.parametrize("preset", sorted(COMMITTED))
def test_committed_files_are_the_rendering(preset: str) -> None:
    path = COMMITTED[preset]
    rerender = f"python -m memexporter.rules --preset {preset} --output {path.relative_to(REPO_ROOT)}"
    assert path.read_text(encoding="utf-8") == rules.render(preset), f"{path.name} is stale: run `{rerender}`"


def test_presets_are_the_dataclass_presets() -> None:
    assert set(rules.PRESETS) == {"default", "demo"}
    assert rules.PRESETS["default"] == rules.RulesConfig.default()
    assert rules.PRESETS["demo"] == rules.RulesConfig.demo()


def test_contract_alerts_exist_and_nothing_else() -> None:
    assert sorted(ALERTS) == sorted(ALL_ALERTS)
    assert sorted(RUN_ALERTS) == sorted(set(ALL_ALERTS) - set(NO_RUN_TWIN))
    scoped = [(r["alert"], r["labels"]["scope"]) for r in load(DEFAULT) if "alert" in r]
    twice = [(name, "rank") for name in TWO_SEVERITIES]
    assert sorted(scoped) == sorted(SCOPED + twice), "one alert per name and scope (two: one per severity)"
    # Each run alert follows its rank twin: the file reads as pairs.
    for i, (name, scope) in enumerate(scoped):
        assert scope == "rank" or scoped[i - 1] == (name, "rank"), f"{name}: its run alert is not after its rank alert"


@pytest.mark.parametrize(("name", "scope"), SCOPED)
def test_alert_is_complete(name: str, scope: str) -> None:
    rule = alerts(DEFAULT, scope)[name]
    assert rule["labels"] == {"severity": "critical" if name in PAGING_ALERTS else "warning", "scope": scope}
    ann = rule["annotations"]
    assert sorted(ann) == ["description", "runbook_url", "summary"]
    assert ann["summary"][0].isupper() and ann["summary"].endswith("."), ann["summary"]
    assert ann["runbook_url"] == f"{rules.RulesConfig.runbook_base_url}#{name.lower()}"
    assert "$value" in ann["description"] and "$labels.job" in ann["description"]
    if scope == "rank":  # where it happens, from the alert's own labels
        for label in ("$labels.rank", "$labels.instance"):
            assert label in ann["description"], f"{name}: description lacks {label}"
        if name not in RANK_ALERTS:  # their series have no device (CollectorFailing names the collector)
            assert "$labels.device" in ann["description"]
    else:  # how many ranks of how many, and the worst rank, from queries
        assert "run:memexporter_ranks:count{job=%q,namespace=%q,run_id=%q}" in ann["description"]
        assert 'rank {{ label "rank" . }} on {{ label "instance" . }}' in ann["description"]


@pytest.mark.parametrize("name", ALL_ALERTS)
def test_rank_alerts_run_no_template_query(name: str) -> None:
    # Issue 25: with every rank firing, a query per alert per evaluation took the alert group from
    # 0.18 s to 1.2 s on Prometheus. A rank alert's annotations read only $value and $labels.
    for key, text in ALERTS[name]["annotations"].items():
        assert "query" not in text, f"{name}: {key} runs a template query"


def records(text: str = DEFAULT) -> dict[str, str]:
    """``{record: expr}`` of a rendered file, every group."""
    return {r["record"]: r["expr"] for r in load(text) if "record" in r}


GROUPS = [
    "memexporter.rules",
    "memexporter.trends",
    "memexporter.runs",
    "memexporter.forecast",
    "memexporter.leak",
    "memexporter.alerts",
]


def test_every_promtool_test_evaluates_the_groups_in_their_order() -> None:
    # promtool evaluates the groups of one instant in group_eval_order: a test file that names the
    # groups of an older release would fail to load (a group missing) or read records a step late.
    files = [*(REPO_ROOT / "alerts" / "tests").glob("*.yml"), *(REPO_ROOT / "tests" / "promtool").glob("*.yml")]
    assert len(files) >= 8
    for path in files:
        assert yaml.safe_load(path.read_text())["group_eval_order"] == GROUPS, path


@pytest.mark.parametrize("name", ALL_ALERTS)
def test_runbook_has_a_section_per_alert(name: str) -> None:
    # GitHub's anchor for "## MemexporterOOMPredicted" is #memexporteroompredicted.
    headings = {
        line[3:].strip().lower() for line in RUNBOOK.read_text(encoding="utf-8").splitlines() if line.startswith("## ")
    }
    anchor = ALERTS[name]["annotations"]["runbook_url"].rsplit("#", 1)[1]
    assert anchor in headings, f"runbook.md has no '## {name}' section for #{anchor}"


@pytest.mark.parametrize("name", ALL_ALERTS)
def test_each_alerts_section_leads_with_what_would_fit(name: str) -> None:
    """Issue 44: the first thing each section says is where the levers, sized from the job, are."""
    section = RUNBOOK.read_text(encoding="utf-8").split(f"\n## {name}\n", 1)[1].lstrip()
    assert section.startswith("**First: what would fit.** Open `memexporter inspect`"), section[:200]
    assert "it says what fits" in section.split("\n\n", 1)[0]


def test_runbook_names_only_existing_metrics_and_rules() -> None:
    text = RUNBOOK.read_text(encoding="utf-8")
    known = set(BY_NAME) | {r["record"] for r in load(DEFAULT) if "record" in r}
    # Whole names only: a prefix such as `grep '^memexporter_module_'` ends in "_".
    named = {n for n in re.findall(r"\b(?:[a-z_]+:memexporter_\w+:\w+|memexporter_\w+)", text) if not n.endswith("_")}
    assert named, "the runbook should give queries"
    assert named <= known, sorted(named - known)


@pytest.mark.parametrize("preset", sorted(rules.PRESETS))
def test_rules_read_only_exported_metrics_or_their_own_records(preset: str) -> None:
    text = rules.render(preset)
    records = {r["record"] for r in load(text) if "record" in r}
    for rule in load(text):
        name = rule.get("record") or rule["alert"]
        used = metric_names(rule["expr"])
        for value in rule.get("annotations", {}).values():
            for query in queries(value):
                used |= metric_names(query)
        unknown = used - RULE_INPUTS - records
        assert not unknown, f"{name} reads {sorted(unknown)}: not an exported metric nor a recording rule"


def test_input_over_capacity_is_critical_for_the_declared_input_and_a_warning_for_the_seen() -> None:
    both = [r for r in load(DEFAULT) if r.get("alert") == "MemexporterInputOverCapacity"]
    assert [(r["labels"]["severity"], "declared" in r["expr"]) for r in both] == [
        ("critical", True),
        ("warning", False),
    ]
    assert ">= 0.9" in both[1]["expr"] and both[0]["for"] == both[1]["for"] == "5m"
    downgraded = rules.render_config(dataclasses.replace(rules.RulesConfig(), critical_severity="warning"))
    assert {r["labels"]["severity"] for r in load(downgraded) if r.get("alert") == "MemexporterInputOverCapacity"} == {
        "warning"
    }


def test_recording_rules_are_named_level_metric_operation() -> None:
    records = [r["record"] for r in load(DEFAULT) if "record" in r]
    assert records
    for name in records:
        assert RECORD_NAME.fullmatch(name), name
        level, metric, operation = name.split(":")
        assert level
        assert metric.startswith("memexporter_") and operation


def test_critical_severity_can_be_downgraded_so_nothing_pages() -> None:
    assert ALERTS["MemexporterOOMImminent"]["labels"]["severity"] == "critical"
    downgraded = alerts(rules.render(critical_severity="warning"))
    assert {a["labels"]["severity"] for a in downgraded.values()} <= {"warning", "info"}


def test_contract_severities() -> None:
    assert ALERTS["MemexporterOOMPredicted"]["labels"]["severity"] == "warning"
    assert ALERTS["MemexporterMemoryLeak"]["labels"]["severity"] == "warning"
    assert ALERTS["MemexporterAllocatorThrashing"]["labels"]["severity"] == "warning"


def test_runbook_base_url_is_a_parameter() -> None:
    text = rules.render(runbook_base_url="https://runbooks.example/memexporter.md")
    for name, alert in alerts(text).items():
        assert alert["annotations"]["runbook_url"] == f"https://runbooks.example/memexporter.md#{name.lower()}"


def test_demo_preset_has_shorter_windows_and_same_thresholds() -> None:
    default, demo = rules.PRESETS["default"], rules.PRESETS["demo"]
    for f in dataclasses.fields(rules.RulesConfig):
        a, b = getattr(default, f.name), getattr(demo, f.name)
        if f.name.endswith(("_window", "_horizon", "_for", "_floor")):
            assert b < a, f"demo {f.name} is not shorter"
            assert b <= 600, f"demo {f.name} is not minutes"
        else:
            assert a == b, f"demo changes the threshold {f.name}"


def test_predictive_alerts_wait_with_for_and_oom_occurred_does_not() -> None:
    for name in (
        "MemexporterOOMPredicted",
        "MemexporterOOMImminent",
        "MemexporterMemoryLeak",
        "MemexporterRankImbalance",
        "MemexporterTrainingStalled",
    ):
        assert "for" in ALERTS[name], name
    assert "for" not in ALERTS["MemexporterOOMOccurred"]


@pytest.mark.parametrize(("seconds", "text"), [(30, "30s"), (60, "1m"), (5400, "1h30m"), (3661, "1h1m1s"), (0, "0s")])
def test_duration(seconds: int, text: str) -> None:
    assert rules.duration(seconds) == text


def test_rendering_is_deterministic() -> None:
    assert rules.render() == rules.render()
    assert rules.render("demo") == rules.render("demo")


def test_unknown_preset_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="'nope'"):
        rules.render("nope")


def test_cli_prints_writes_and_rejects(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from memexporter.cli import main

    assert main(["rules", "--preset", "demo"]) == 0
    assert capsys.readouterr().out == rules.render("demo")
    out = tmp_path / "r.yml"
    assert main(["rules", "--selector", 'job="x"', "--output", str(out)]) == 0
    assert out.read_text() == rules.render(selector='job="x"')
    with pytest.raises(SystemExit) as info:
        main(["rules", "--preset", "nope"])
    assert info.value.code == 2


# --- the promtool unit tests: a firing and a silent case for every alert --------------------------


def _expectations() -> dict[tuple[str, str], tuple[int, int]]:
    """``{(alertname, scope): (silent cases, firing cases)}`` over every ``alert_rule_test`` in
    alerts/tests: a case is silent for a scope when none of the alerts it expects has that scope
    (promtool compares every alert of the name, so the other scope's absence is checked too)."""
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for path in UNIT_TESTS:
        for test in yaml.safe_load(path.read_text(encoding="utf-8"))["tests"]:
            for case in test.get("alert_rule_test", []):
                scopes = {a["exp_labels"]["scope"] for a in case.get("exp_alerts") or []}
                for scope in ("rank", "run"):
                    silent, fired = out.get((case["alertname"], scope), (0, 0))
                    out[(case["alertname"], scope)] = (silent + (scope not in scopes), fired + (scope in scopes))
    return out


@pytest.mark.parametrize(("name", "scope"), SCOPED)
def test_every_alert_has_a_firing_and_a_silent_promtool_case(name: str, scope: str) -> None:
    # DESIGN.md section 5. promtool runs them (tests/integration/test_promtool.py).
    silent, fired = _expectations().get((name, scope), (0, 0))
    assert fired, f"alerts/tests/*.yml: no case where {name} (scope {scope}) fires"
    assert silent, f"alerts/tests/*.yml: no case where {name} (scope {scope}) stays silent"
