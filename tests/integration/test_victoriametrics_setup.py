"""The VictoriaMetrics set-up's files and claims, without the live chain (test_victoriametrics.py):
every shipped rule loads in vmalert, the examples in deploy/victoriametrics/ are valid and agree
on their addresses, and the reason for ``?nocache=1`` in vmalert's data source URL holds."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.support import REPO_ROOT
from tests.support.binaries import require
from tests.support.prometheus import http_json
from tests.support.rules import render_preset
from tests.support.victoriametrics import (
    AGENT_CONFIG,
    DEPLOY,
    EXAMPLE_VM_URL,
    running_victoriametrics,
    shipped_vmalert_args,
    vmalert_dry_run,
)

pytestmark = pytest.mark.integration


def test_shipped_rules_load_in_vmalert(tmp_path: Path) -> None:
    # vmalert parses every expression as MetricsQL and every annotation template with its own
    # functions (query, humanize..., first, value, label, sortByLabel): one it lacks fails here.
    rule_files = sorted((REPO_ROOT / "alerts").glob("*.yml"))
    assert rule_files
    for files in (rule_files, [render_preset(tmp_path, "demo")]):
        run = vmalert_dry_run(files)
        assert run.returncode == 0, f"vmalert -dryRun rejects {[f.name for f in files]}:\n{run.stdout}{run.stderr}"


def test_shipped_examples_are_valid() -> None:
    promtool = require("promtool")
    for config, mode in ((AGENT_CONFIG, ["--agent"]), (DEPLOY / "prometheus-remote-write.yml", [])):
        run = subprocess.run(
            [promtool, "check", "config", *mode, str(config)], capture_output=True, text=True, timeout=60, check=False
        )
        assert run.returncode == 0, f"{config.name}: {run.stdout}{run.stderr}"
    # The remote-write example and the agent write where vmalert reads, Grafana reads there too.
    writes = {
        yaml.safe_load(p.read_text())["remote_write"][0]["url"]
        for p in (AGENT_CONFIG, DEPLOY / "prometheus-remote-write.yml")
    }
    assert writes == {EXAMPLE_VM_URL + "/api/v1/write"}, writes
    (source,) = yaml.safe_load((DEPLOY / "grafana-datasource.yml").read_text())["datasources"]
    assert source["type"] == "prometheus" and source["url"] == EXAMPLE_VM_URL, source


def test_victoriametrics_answers_for_now_only_with_nocache() -> None:
    # Why the shipped -datasource.url ends in ?nocache=1: VictoriaMetrics answers an instant query
    # for "now" as of -search.latencyOffset (30 s) ago, so vmalert would read 30 s old data.
    with running_victoriametrics() as vm:
        now = time.time()
        lines = [f"probe_value 1 {int((now - 60) * 1000)}", f"probe_value 2 {int(now * 1000)}"]
        urllib.request.urlopen(f"{vm.url}/api/v1/import/prometheus", "\n".join(lines).encode(), timeout=10).close()
        fresh = vm.wait_for("probe_value", timeout=20, predicate=lambda r: bool(r) and r[0]["value"][1] == "2")
        assert fresh[0]["value"][1] == "2"
        stale = http_json(f"{vm.url}/api/v1/query?query=probe_value&time={time.time():.3f}")["data"]["result"]
        assert [s["value"][1] for s in stale] == ["1"], stale


def test_shipped_vmalert_flags_are_known_to_vmalert() -> None:
    # Every flag of deploy/victoriametrics/vmalert.default exists in this vmalert (an unknown one
    # stops it at start); the two the pairing with Prometheus depends on are there.
    args = shipped_vmalert_args()
    assert "-disableAlertgroupLabel" in args, args
    (source,) = [a for a in args if a.startswith("-datasource.url=")]
    assert source.endswith("?nocache=1"), source
    rules = [f"-rule={p}" for p in sorted((REPO_ROOT / "alerts").glob("*.yml"))]
    run = subprocess.run(
        [require("vmalert"), "-dryRun", *[a for a in args if not a.startswith("-rule=")], *rules],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, f"vmalert rejects the shipped flags:\n{run.stdout}{run.stderr}"
