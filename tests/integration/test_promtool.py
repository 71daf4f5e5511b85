"""The alert rules and the Alertmanager example against the real binaries: promtool checks and
unit-tests the rules, amtool checks the routing, and a real Alertmanager applies the inhibition.

A missing binary skips with the package to install (``apt-get install prometheus
prometheus-alertmanager``); ``MEMEXPORTER_REQUIRE_BINARIES=1`` (CI) turns that into a failure."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import time
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from memexporter import rules
from tests.support import REPO_ROOT
from tests.support.alertmanager import WebhookReceiver, running_alertmanager
from tests.support.binaries import require
from tests.support.promql import promtool_check_exprs
from tests.support.rules import render_preset
from tests.unit.rules.test_selector import BAD_SELECTORS, GOOD_SELECTORS

pytestmark = pytest.mark.integration

ALERTS_DIR = REPO_ROOT / "alerts"
RULE_FILES = [ALERTS_DIR / "memexporter.rules.yml"]
TEST_FILES = sorted((ALERTS_DIR / "tests").glob("*.yml"))
# promtool tests of the demo preset: it is rendered where it is used, so they live outside alerts/.
DEMO_TEST_FILES = sorted((REPO_ROOT / "tests" / "promtool").glob("*.yml"))
AM_EXAMPLE = REPO_ROOT / "alertmanager" / "alertmanager.example.yml"


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, check=False)


def rule_count(text: str) -> int:
    return sum(len(g["rules"]) for g in yaml.safe_load(text)["groups"])


def against_changed_rules(tmp: Path, change: dict[str, Any], name: str, group: str) -> subprocess.CompletedProcess[str]:
    """promtool's run of one test group of ``alerts/tests/<name>`` against the rules rendered with
    ``change``. One group, the one that pins the changed behaviour: the whole file re-ran groups
    that cannot tell (phases.yml: 11 CPU-seconds a change instead of 2 to 4)."""
    cfg = dataclasses.replace(rules.RulesConfig.default(), **change)
    (tmp / "tests").mkdir()
    (tmp / "memexporter.rules.yml").write_text(rules.render_config(cfg), encoding="utf-8")
    doc = yaml.safe_load((ALERTS_DIR / "tests" / name).read_text(encoding="utf-8"))
    doc["tests"] = [test for test in doc["tests"] if test.get("name") == group]
    assert doc["tests"], f"{name} has no test group named {group!r}"
    path = tmp / "tests" / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=1 << 20), encoding="utf-8")
    return run(require("promtool"), "test", "rules", path)


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules_committed(path: Path) -> None:
    result = run(require("promtool"), "check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {rule_count(path.read_text(encoding='utf-8'))} rules found" in result.stdout


@pytest.mark.parametrize(
    "kwargs",
    [
        {"preset": "demo"},
        {"selector": 'namespace="ml",job=~"trainer-.*"'},
        {"selector": "job=~`trainer-\\d+`, rank!='0',"},
        {"critical_severity": "warning"},
        {"peer_labels": "job,cluster,training_job"},
    ],
    ids=["demo", "selector", "selector-raw-string", "severity", "peer-labels"],
)
def test_promtool_check_rules_fresh_rendering(tmp_path: Path, kwargs: dict[str, str]) -> None:
    path = tmp_path / "rendered.rules.yml"
    path.write_text(rules.render(**kwargs), encoding="utf-8")
    result = run(require("promtool"), "check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow(seconds=40)  # every file of alerts/tests in one promtool
def test_promtool_unit_tests_pass() -> None:
    assert len(TEST_FILES) >= 4, "alerts/tests/*.yml went missing"
    result = run(require("promtool"), "test", "rules", *TEST_FILES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(TEST_FILES), result.stdout


def test_promtool_demo_preset_tests_pass(tmp_path: Path) -> None:
    # The demo scenarios read ../memexporter.demo.rules.yml: render it there, as a user would.
    assert DEMO_TEST_FILES, "tests/promtool/*.yml went missing"
    render_preset(tmp_path, "demo")
    (tmp_path / "tests").mkdir()
    for path in DEMO_TEST_FILES:
        shutil.copy(path, tmp_path / "tests" / path.name)
    result = run(require("promtool"), "test", "rules", *sorted((tmp_path / "tests").glob("*.yml")))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(DEMO_TEST_FILES), result.stdout


def test_selector_check_agrees_with_promtool() -> None:
    # What parse_selector accepts, PromQL parses; what it refuses (bar the reserved __name__ and the
    # empty list, which parse but would break every rule), PromQL refuses too.
    good = promtool_check_exprs({f"good{i}": f"up{{{s}}}" for i, s in enumerate(GOOD_SELECTORS)})
    assert good.returncode == 0, good.stdout + good.stderr
    for selector, _ in BAD_SELECTORS:
        if selector.strip() and not selector.startswith("__"):
            bad = promtool_check_exprs({"bad": f"up{{{selector}}}"})
            assert bad.returncode != 0, f"promtool accepts up{{{selector}}}"
            assert "parse error" in bad.stdout + bad.stderr


@pytest.mark.parametrize(
    ("name", "group", "alert"),
    [
        ("oom_forecast.yml", "per-step peak growing with a flat baseline", "MemexporterOOMPredicted"),
        ("allocator.yml", "fragmentation", "MemexporterFragmentationHigh"),
    ],
)
def test_promtool_unit_tests_catch_a_changed_rule(tmp_path: Path, name: str, group: str, alert: str) -> None:
    # Not vacuous: the same tests against rules with a shorter for: (OOMPredicted would fire
    # 30 minutes earlier) and a higher fragmentation threshold (never fires) must fail.
    result = against_changed_rules(tmp_path, {"predicted_for": 600, "fragmentation_min_ratio": 0.5}, name, group)
    assert result.returncode != 0, f"{name} passed against changed rules"
    assert f"alertname: {alert}" in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("change", "group", "alert"),
    [
        # a first evaluation pages at 1h20m
        (
            {"stalled_phase_floor": 900},
            "evaluations within their allowance and evaluations that hang",
            "MemexporterTrainingStalled",
        ),
        # the hung evaluation pages 75 minutes early (the steps group cannot tell: its allowance is the
        # 15-minute floor at either factor)
        (
            {"stalled_factor": 5.0},
            "evaluations within their allowance and evaluations that hang",
            "MemexporterTrainingStalled",
        ),
        # the 98% evaluation stays silent
        ({"imminent_full_utilisation": 0.99}, "evaluation peaks beside a flat step peak", "MemexporterOOMImminent"),
    ],
    ids=["no-phase-floor", "factor-5", "full-at-99"],
)
def test_promtool_phase_tests_catch_a_changed_rule(
    tmp_path: Path, change: dict[str, Any], group: str, alert: str
) -> None:
    # Not vacuous: phases.yml fails against rules whose stall allowance or phase gate moved.
    result = against_changed_rules(tmp_path, change, "phases.yml", group)
    assert result.returncode != 0, f"phases.yml passed against rules with {change}"
    assert f"alertname: {alert}" in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("change", "alert"),
    [
        ({"run_lead_for": 0}, "MemexporterMemoryLeak"),  # the run alert fires with its ranks, not 5 minutes before
        ({"run_min_ranks": 5}, "MemexporterMemoryLeak"),  # llm-a's 4 ranks are no longer a run-wide cause
    ],
    ids=["run-for-as-rank", "five-ranks"],
)
def test_promtool_run_tests_catch_a_changed_rule(tmp_path: Path, change: dict[str, Any], alert: str) -> None:
    # Not vacuous: runs.yml pins when the run alerts fire and that they do.
    group = "every rank of one run leaks, beside a healthy run and a relabelled one"
    result = against_changed_rules(tmp_path, change, "runs.yml", group)
    assert result.returncode != 0, f"runs.yml passed against rules with {change}"
    assert f"alertname: {alert}, time: 23m" in result.stdout + result.stderr


def test_promtool_fleet_tests_catch_job_only_peer_labels(tmp_path: Path) -> None:
    # Not vacuous: with the old peers (job alone) the two runs that share job="memexporter" in
    # fleet.yml are compared with each other, and the large run's balanced ranks fire too.
    result = against_changed_rules(tmp_path, {"peer_labels": "job"}, "fleet.yml", "two runs in one job are not peers")
    out = result.stdout + result.stderr
    assert result.returncode != 0, "fleet.yml passed with job as the only peer label"
    assert "name: two runs in one job are not peers" in out
    # Rank 2 of llm-pretrain sits at its run's median: it fires only when sweep-17 counts as a peer.
    assert 'instance="trainer-1:9400", job="memexporter", namespace="ml", rank="2", run_id="llm-pretrain"' in out


def test_amtool_check_config() -> None:
    result = run(require("amtool"), "check-config", AM_EXAMPLE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (("alertname=MemexporterOOMImminent", "severity=critical"), "training-pager"),
        (("alertname=MemexporterTrainingStalled", "severity=critical"), "training-pager"),
        (("alertname=MemexporterTrainingStalled", "severity=warning"), "training-chat"),  # rules rendered not to page
        (("alertname=MemexporterOOMPredicted", "severity=warning"), "training-chat"),
        (("alertname=MemexporterCollectorFailing", "severity=warning"), "training-chat"),
        (("alertname=MemexporterFatalOOMSuspected", "severity=warning"), "training-chat"),
        (("alertname=MemexporterOOMImminent", "severity=critical", "scope=run"), "training-pager"),
        (("alertname=MemexporterMemoryLeak", "severity=warning", "scope=run"), "training-chat"),
        (("alertname=MemexporterOOMImminent", "severity=critical", "scope=rank"), "training-pager"),
        (("alertname=MemexporterMemoryLeak", "severity=warning", "scope=rank"), "training-chat"),
    ],
)
def test_amtool_routes_by_severity(labels: tuple[str, ...], receiver: str) -> None:
    result = run(
        require("amtool"),
        "config",
        "routes",
        "test",
        f"--config.file={AM_EXAMPLE}",
        f"--verify.receivers={receiver}",
        *labels,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _example_for(hook: WebhookReceiver, tmp: Path) -> Path:
    """The example config as shipped, with both webhook placeholders pointed at ``hook`` and
    group_wait cut to 1s so a test takes seconds; routes and inhibition are untouched."""
    config = yaml.safe_load(AM_EXAMPLE.read_text(encoding="utf-8"))
    for receiver in config["receivers"]:
        for webhook in receiver["webhook_configs"]:
            webhook["url"] = hook.url + receiver["name"]
    routes = [config["route"]]
    while routes:
        route = routes.pop()
        if "group_wait" in route:
            route["group_wait"] = "1s"
        routes += route.get("routes", [])
    path = tmp / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def _post_alerts(url: str, alerts: list[dict[str, Any]]) -> None:
    req = urllib.request.Request(
        f"{url}/api/v2/alerts",
        data=json.dumps(alerts).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200


def test_alertmanager_inhibits_the_warning_twin(tmp_path: Path) -> None:
    with WebhookReceiver() as hook:
        path = _example_for(hook, tmp_path)
        where = {"job": "memexporter", "instance": "trainer-0:9400", "device": "cuda:0"}

        def alert(name: str, severity: str, rank: str) -> dict[str, Any]:
            return {
                "labels": {"alertname": name, "severity": severity, "rank": rank, **where},
                "annotations": {"summary": name},
            }

        with running_alertmanager(path) as am:
            _post_alerts(
                am.url,
                [
                    alert("MemexporterOOMImminent", "critical", "0"),
                    alert("MemexporterOOMPredicted", "warning", "0"),
                    alert("MemexporterOOMPredicted", "warning", "1"),
                ],
            )
            page = hook.wait_for(lambda p: p["receiver"] == "training-pager", timeout=60)
            assert page.path == "/training-pager"
            assert [a["labels"]["alertname"] for a in page.payload["alerts"]] == ["MemexporterOOMImminent"]
            chat = hook.wait_for(lambda p: p["receiver"] == "training-chat", timeout=60)
            # Rank 1's forecast has no critical twin; rank 0's is inhibited and never notified.
            assert [a["labels"]["rank"] for a in chat.payload["alerts"]] == ["1"]
            states = {(a["labels"]["alertname"], a["labels"]["rank"]): a["status"] for a in am.alerts()}
            assert states[("MemexporterOOMPredicted", "0")]["state"] == "suppressed"
            assert states[("MemexporterOOMPredicted", "0")]["inhibitedBy"]
            assert states[("MemexporterOOMPredicted", "1")]["state"] == "active"
            time.sleep(2)  # anything else already queued (group_wait 1s) would have arrived by now
            notified = {(a["labels"]["alertname"], a["labels"]["rank"]) for p in hook.payloads() for a in p["alerts"]}
            assert ("MemexporterOOMPredicted", "0") not in notified

            # A job that died of an OOM: its ranks vanish together; one notification for the job.
            _post_alerts(
                am.url,
                [
                    alert("MemexporterFatalOOMSuspected", "warning", "0"),
                    alert("MemexporterFatalOOMSuspected", "warning", "1"),
                ],
            )
            died = hook.wait_for(
                lambda p: any(a["labels"]["alertname"] == "MemexporterFatalOOMSuspected" for a in p["alerts"]),
                timeout=60,
            )
            assert died.path == "/training-chat"
            assert died.payload["groupLabels"] == {"alertname": "MemexporterFatalOOMSuspected", "job": "memexporter"}
            assert sorted(a["labels"]["rank"] for a in died.payload["alerts"]) == ["0", "1"]


def test_alertmanager_pages_once_per_stalled_run(tmp_path: Path) -> None:
    # One hung rank stops every rank of its run: their TrainingStalled alerts are one page (grouped
    # by run), while another run's stall is a page of its own.
    with WebhookReceiver() as hook:
        path = _example_for(hook, tmp_path)

        def stalled(run_id: str, rank: str) -> dict[str, Any]:
            return {
                "labels": {
                    "alertname": "MemexporterTrainingStalled",
                    "severity": "critical",
                    "job": "memexporter",
                    "run_id": run_id,
                    "instance": f"trainer-{rank}:9400",
                    "rank": rank,
                },
                "annotations": {"summary": "stalled"},
            }

        with running_alertmanager(path) as am:
            _post_alerts(am.url, [stalled("run-a", r) for r in "0123"] + [stalled("run-b", "0")])
            hook.wait_for(lambda p: p["receiver"] == "training-pager", timeout=60)
            time.sleep(3)  # both groups (group_wait 1s) have been sent by now
            pages = [r for r in hook.received if r.payload["receiver"] == "training-pager"]
            by_run = {
                r.payload["groupLabels"]["run_id"]: sorted(a["labels"]["rank"] for a in r.payload["alerts"])
                for r in pages
            }
            assert by_run == {"run-a": ["0", "1", "2", "3"], "run-b": ["0"]}, by_run
            assert len(pages) == 2


def _run_notified(receiver: str, run_id: str, payload: dict[str, Any]) -> bool:
    return bool(payload["receiver"] == receiver and payload["groupLabels"].get("run_id") == run_id)


def test_alertmanager_sends_one_notification_per_run_and_severity(tmp_path: Path) -> None:
    # Issue 25: every rank of run "wide" fires its own alerts and the run its run-wide twins (scope
    # "run"); rank 2 of run "narrow" alone fires its own. The per-rank alerts arrive first, as they
    # can within one rule evaluation: the inhibition holds at the groups' flush.
    with WebhookReceiver() as hook:
        path = _example_for(hook, tmp_path)

        def alert(name: str, severity: str, run_id: str, rank: str | None = None) -> dict[str, Any]:
            where = (
                {"scope": "run"}
                if rank is None
                else {"scope": "rank", "rank": rank, "device": "cuda:0", "instance": f"trainer-{rank}:9400"}
            )
            return {
                "labels": {"alertname": name, "severity": severity, "job": "memexporter", "run_id": run_id, **where},
                "annotations": {"summary": name},
            }

        fired = [
            ("MemexporterOOMImminent", "critical"),
            ("MemexporterOOMPredicted", "warning"),
            ("MemexporterMemoryLeak", "warning"),
        ]
        ranks = [alert(n, s, "wide", r) for r in "0123" for n, s in fired]
        ranks += [alert(n, s, "narrow", "2") for n, s in fired if n != "MemexporterOOMPredicted"]
        with running_alertmanager(path) as am:
            _post_alerts(am.url, ranks + [alert(n, s, "wide") for n, s in fired])
            for receiver in ("training-pager", "training-chat"):
                hook.wait_for(partial(_run_notified, receiver, "wide"), timeout=30)
            time.sleep(3)  # every group (group_wait 1s) has flushed by now
            got = sorted(
                (
                    r.path,
                    r.payload["groupLabels"].get("run_id"),
                    r.payload["groupLabels"].get("rank", "-"),
                    tuple((a["labels"]["alertname"], a["labels"]["scope"]) for a in r.payload["alerts"]),
                )
                for r in hook.received
            )
            # One page and one chat message for the wide run, each of its run alerts; its OOMPredicted is
            # inhibited by the critical twin. The narrow run's rank 2 is notified on its own, per alert.
            assert got == [
                ("/training-chat", "narrow", "2", (("MemexporterMemoryLeak", "rank"),)),
                ("/training-chat", "wide", "-", (("MemexporterMemoryLeak", "run"),)),
                ("/training-pager", "narrow", "2", (("MemexporterOOMImminent", "rank"),)),
                ("/training-pager", "wide", "-", (("MemexporterOOMImminent", "run"),)),
            ], got
            wide = [a for a in am.alerts() if a["labels"]["run_id"] == "wide" and a["labels"]["scope"] == "rank"]
            assert len(wide) == 12 and all(a["status"]["state"] == "suppressed" for a in wide), wide
