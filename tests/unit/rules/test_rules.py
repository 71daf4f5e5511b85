"""The alert rules: committed files equal the renderer's output, every alert is complete and
documented, every name they read exists, and the template really is parameterised. Every alert
comes per rank (``scope="rank"``) and, bar RankImbalance, per run (``scope="run"``)."""

from __future__ import annotations

import dataclasses
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from memexporter import rules
from memexporter.metrics import BY_NAME
from memexporter.tracking.phases import OUT_OF_STEP_PHASES
from tests.support import REPO_ROOT
from tests.support.promql import metric_names
from tests.support.rules import RUN_RECORDS

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
# Additions to the contract (DESIGN.md allows new alerts): issue 9's fatal OOM, issue 23's stalled run.
ADDED_ALERTS = ("MemexporterFatalOOMSuspected", "MemexporterTrainingStalled")
# The alerts that page (the critical severity parameter); every other one is a warning.
PAGING_ALERTS = ("MemexporterOOMImminent", "MemexporterTrainingStalled")
# Alerts about a rank, not a device: their series have no device label.
RANK_ALERTS = ("MemexporterCollectorFailing", "MemexporterTrainingStalled")
ALL_ALERTS = CONTRACT_ALERTS + ADDED_ALERTS
# One rank against its peers: a cause of its own, never shared by the whole run.
NO_RUN_TWIN = ("MemexporterRankImbalance",)
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
    assert sorted(scoped) == sorted(SCOPED), "one alert per name and scope"
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


def records(text: str = DEFAULT) -> dict[str, str]:
    """``{record: expr}`` of a rendered file, every group."""
    return {r["record"]: r["expr"] for r in load(text) if "record" in r}


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


@pytest.mark.parametrize("name", ALL_ALERTS)
def test_runbook_has_a_section_per_alert(name: str) -> None:
    # GitHub's anchor for "## MemexporterOOMPredicted" is #memexporteroompredicted.
    headings = {
        line[3:].strip().lower() for line in RUNBOOK.read_text(encoding="utf-8").splitlines() if line.startswith("## ")
    }
    anchor = ALERTS[name]["annotations"]["runbook_url"].rsplit("#", 1)[1]
    assert anchor in headings, f"runbook.md has no '## {name}' section for #{anchor}"


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


def test_recording_rules_are_named_level_metric_operation() -> None:
    records = [r["record"] for r in load(DEFAULT) if "record" in r]
    assert records
    for name in records:
        assert RECORD_NAME.fullmatch(name), name
        level, metric, operation = name.split(":")
        assert level
        assert metric.startswith("memexporter_") and operation


@pytest.mark.parametrize("preset", sorted(rules.PRESETS))
def test_every_series_carries_the_selector(preset: str) -> None:
    text = rules.render(preset, selector='job="trainer",cluster="a"')
    assert 'job="memexporter"' not in text
    for rule in load(text):
        for name in metric_names(rule["expr"]):
            if name.startswith("memexporter_") or ":" in name:
                assert re.search(re.escape(name) + r'\{[^}]*job="trainer",cluster="a"', rule["expr"]), (
                    f"{rule.get('record') or rule['alert']}: {name} without the selector"
                )


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


# --- peer labels: which ranks MemexporterRankImbalance compares -----------------------------------


def _excess_rule(text: str) -> str:
    (expr,) = [
        r["expr"]
        for r in load(text)
        if r.get("record") == "rank_device:memexporter_memory_peak_excess_over_job_median:ratio"
    ]
    return str(expr)


def test_default_peer_labels_name_one_training_run() -> None:
    # A PodMonitor puts every pod of every namespace in one Prometheus job: job alone mixes runs.
    assert rules.PEER_LABELS == ("job", "namespace", "run_id")
    assert rules.parse_peer_labels(rules.RulesConfig.peer_labels) == rules.PEER_LABELS
    for preset in rules.PRESETS.values():
        assert rules.parse_peer_labels(preset.peer_labels) == rules.PEER_LABELS
    expr = _excess_rule(DEFAULT)
    assert "on(job, namespace, run_id, device_kind) group_left()" in expr
    assert "quantile by (job, namespace, run_id, device_kind) (0.5," in expr
    assert "peers share job, namespace, run_id" in ALERTS["MemexporterRankImbalance"]["annotations"]["description"]


def test_peer_labels_are_a_parameter() -> None:
    text = rules.render(peer_labels=" job ,cluster,training_job")
    expr = _excess_rule(text)
    assert "on(job, cluster, training_job, device_kind) group_left()" in expr
    assert "quantile by (job, cluster, training_job, device_kind)" in expr
    assert "#   peer_labels: job, cluster, training_job\n" in text


@pytest.mark.parametrize(
    "bad",
    [
        "",
        " , ",
        "job,",
        "job,run-id",
        "job,1run",
        "job,__name__",
        "job run_id",
        "job,rank",
        "job,instance",
        "job,pod",
        "job,device",
        "job,device_kind",
        "job,job",
    ],
)
def test_bad_peer_labels_are_a_clear_error(bad: str) -> None:
    with pytest.raises(ValueError, match="peer label"):
        rules.render(peer_labels=bad)


def test_cli_peer_labels_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from memexporter.cli import main

    out = tmp_path / "r.yml"
    assert main(["rules", "--peer-labels", "job,run_id", "--output", str(out)]) == 0
    assert out.read_text() == rules.render(peer_labels="job,run_id")
    assert "on(job, run_id, device_kind)" in out.read_text()
    with pytest.raises(SystemExit) as info:
        main(["rules", "--peer-labels", "job,run-id"])
    assert info.value.code == 2
    assert "'run-id'" in capsys.readouterr().err


# --- the selector: PromQL label matchers, checked before anything is rendered ---------------------

GOOD_SELECTORS = [
    'job="trainer"',
    'namespace="ml",job=~"trainer-.*"',
    " job = \"a\" , rank != '0' ,",
    "job=~`trainer-\\d+`",
    'job=~"trainer-\\\\d+"',
    'job="say \\"hi\\""',
    "job='it\\'s'",
    'job!~"", cluster="a"',
    'job="\\u00e9\\x41\\101"',
]
BAD_SELECTORS = [
    ("job=foo", 'the value of job must be a quoted string, e.g. job="foo"'),
    ('job="a" rank="0"', "matchers are separated by commas"),
    ('{job="a"}', "without braces"),
    ("job", "job must be followed by one of =~, !~, !=, ="),
    ('job=="a"', "'==' is not a matcher operator"),
    ('job="trainer', 'has no closing "'),
    ('job=~"trainer-\\d+"', "unknown escape sequence '\\\\d'"),
    ("job='a\\\"'", "unknown escape sequence"),
    ('job="a",,', "',' does not start with a label name"),
    ('1job="a"', "does not start with a label name"),
    ('__name__="up"', "__name__ is reserved"),
    ("", "it is empty"),
    ("  ", "it is empty"),
]


@pytest.mark.parametrize("selector", GOOD_SELECTORS)
def test_good_selectors_render_into_every_series(selector: str) -> None:
    text = rules.render(selector=selector)
    for rule in load(text):
        for name in metric_names(rule["expr"]):
            if name.startswith("memexporter_") or ":" in name:
                # Phase series put their own matcher first, so a trailing comma in the selector parses.
                assert (
                    name + "{" + selector + "}" in rule["expr"]
                    or name + "{" + OUT_OF_STEP + "," + selector + "}" in rule["expr"]
                ), f"{rule.get('record') or rule['alert']}: {name}"


@pytest.mark.parametrize(("selector", "why"), BAD_SELECTORS, ids=[s or "empty" for s, _ in BAD_SELECTORS])
def test_bad_selectors_are_a_clear_error(selector: str, why: str) -> None:
    with pytest.raises(ValueError) as info:
        rules.render(selector=selector)
    message = str(info.value)
    assert f"selector {selector!r} is not a PromQL label-matcher list" in message
    assert why in message


def test_cli_rejects_an_unquoted_selector(capsys: pytest.CaptureFixture[str]) -> None:
    from memexporter.cli import main

    # The operator's typo from issue 9: this used to render rules that promtool refuses.
    with pytest.raises(SystemExit) as info:
        main(["rules", "--selector", "job=foo"])
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert 'the value of job must be a quoted string, e.g. job="foo"' in captured.err
    assert "error: memexporter:" not in captured.err  # argparse's "memexporter rules: error:" says it once


# --- phases (issue 23): out-of-step phases and the stalled run -----------------------------------


def test_phase_series_read_the_exporters_out_of_step_phases() -> None:
    # One source: memexporter.tracking.phases, where the exporter decides what stays out of the step peak.
    exporters = 'phase=~"' + "|".join(sorted(OUT_OF_STEP_PHASES)) + '"'
    assert exporters == OUT_OF_STEP
    phase_series = [r for r in load(DEFAULT) if "memexporter_phase_" in r["expr"]]
    assert phase_series
    for rule in phase_series:
        for selector in re.findall(r"memexporter_phase_\w+\{[^}]*\}", rule["expr"]):
            assert OUT_OF_STEP in selector, f"{rule.get('record') or rule['alert']}: {selector}"


def test_oom_forecast_reads_training_peaks_only() -> None:
    # The forecast (OOMPredicted, OOMImminent's ETA arm) stays on the step peak; only OOMImminent's
    # headroom arm reads the out-of-step phases, against the same "nearly full" threshold.
    known = records()
    assert "phase" not in known["rank_device:memexporter_oom_predicted:condition"]
    imminent = known["rank_device:memexporter_oom_imminent:condition"]
    phase_arm = imminent.split("+ on(job, instance, rank, device) group_left()")[1]
    assert "rank_device_phase:memexporter_phase_peak_utilisation:ratio" in phase_arm
    assert phase_arm.endswith(f") > {rules.RulesConfig.imminent_full_utilisation}")  # the phase's own peak
    assert "eta" not in phase_arm


def test_stalled_run_parameters_are_rendered() -> None:
    cfg = dataclasses.replace(
        rules.RulesConfig.default(), stalled_factor=4.0, stalled_floor=1200, stalled_phase_floor=7200, stalled_for=600
    )
    text = rules.render_config(cfg)
    (allowance,) = [r["expr"] for r in load(text) if r.get("record") == "rank:memexporter_stall_allowance_seconds:max"]
    assert "4.0 * memexporter_step_interval_seconds" in allowance
    assert "4.0 * memexporter_phase_duration_seconds" in allowance
    assert re.search(r"memexporter_last_step_timestamp_seconds\{[^}]*\},\s+1200\s+\)", allowance)
    assert re.search(r"memexporter_phase_active\{[^}]*\},\s+7200\s+\)", allowance)
    # The open phase's allowance is the run's: it reaches every rank that shares the peer labels.
    assert "+ on(job, namespace, run_id) group_left()\n      max by (job, namespace, run_id) (" in allowance
    assert alerts(text)["MemexporterTrainingStalled"]["for"] == "10m"
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="stalled_factor"):
            rules.render_config(dataclasses.replace(cfg, stalled_factor=bad))


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
