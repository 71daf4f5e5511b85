"""``alerts/`` loaded the way operators load it: ``rule_files: ["alerts/*.yml"]``.

Issue 9: the folder once held the Alertmanager example (Prometheus refused to start) and the demo
preset (every recorded series got two samples per evaluation, and on realistic traces the 3-hour
leak got no warning). Now a real Prometheus and promtool load the whole folder, and the folder holds
the default rules alone: the glob matches exactly the file the committed scenarios read, so their run
(``promtool test rules alerts/tests/*.yml``, tests/integration/test_promtool.py) is the run over the
whole folder. The last test shows that a file added there that shadows the default rules fails them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support import REPO_ROOT
from tests.support.binaries import require
from tests.support.prometheus import running_prometheus
from tests.support.rules import render_preset

pytestmark = pytest.mark.integration

ALERTS_DIR = REPO_ROOT / "alerts"
FOLDER_GLOB = str(ALERTS_DIR / "*.yml")
SCENARIOS = sorted((ALERTS_DIR / "tests").glob("*.yml"))
SHORT_SCENARIO = "young_job.yml"  # of the scenarios, one of the quickest to evaluate (under a second)
EXAMPLES = REPO_ROOT / "examples" / "prometheus"


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require("promtool"), *map(str, args)], capture_output=True, text=True, timeout=300, check=False
    )


def scenarios_over(rule_glob: str, dest: Path) -> list[Path]:
    """The default rules' scenarios, copied to ``dest`` with ``rule_files`` set to ``rule_glob`` alone."""
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for path in SCENARIOS:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert doc["rule_files"] == ["../memexporter.rules.yml"], f"{path.name} reads other rules"
        doc["rule_files"] = [rule_glob]
        out.append(dest / path.name)
        out[-1].write_text(yaml.safe_dump(doc, sort_keys=False, width=1 << 20), encoding="utf-8")
    return out


def example_rule_files() -> dict[str, list[str]]:
    return {
        name: yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))["rule_files"]
        for name in ("prometheus.static.yml", "prometheus.file_sd.yml")
    }


def test_examples_load_the_rules_from_a_folder_of_their_own() -> None:
    # The old pattern, /etc/prometheus/rules/memexporter*.rules.yml, also matched a demo rendering
    # saved beside the default as memexporter.demo.rules.yml.
    for name, patterns in example_rule_files().items():
        assert patterns == ["/etc/prometheus/rules/memexporter/*.yml"], name


# The examples' pattern, pointed at alerts/ (the folder they tell the operator to copy).
EXAMPLE_GLOBS = sorted({str(ALERTS_DIR / Path(p).name) for ps in example_rule_files().values() for p in ps})


@pytest.mark.parametrize("rule_glob", [FOLDER_GLOB, *EXAMPLE_GLOBS])
def test_promtool_check_config_loads_the_whole_folder(tmp_path: Path, rule_glob: str) -> None:
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"rule_files": [rule_glob]}), encoding="utf-8")
    result = promtool("check", "config", config)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    matched = sorted(ALERTS_DIR.glob(Path(rule_glob).name))
    assert matched == [ALERTS_DIR / "memexporter.rules.yml"], "alerts/ holds the default rules only"
    for path in matched:
        assert f"Checking {path}" in out and "SUCCESS" in out, out


def test_real_prometheus_loads_the_whole_folder_once() -> None:
    with running_prometheus([], [Path(FOLDER_GLOB)], evaluation_interval="1s") as prom:
        groups = prom.rules()
        assert sorted(g["name"] for g in groups) == [
            "memexporter.alerts",
            "memexporter.forecast",
            "memexporter.leak",
            "memexporter.rules",
            "memexporter.runs",
            "memexporter.trends",
        ]
        # An alert comes per rank and per run (label scope): the name, the scope and the severity are one rule
        # (MemexporterInputOverCapacity has two, one per severity, as the kubernetes-mixin's volume alerts).
        names = [
            (r["name"], r.get("labels", {}).get("scope"), r.get("labels", {}).get("severity"))
            for g in groups
            for r in g["rules"]
        ]
        assert len(names) == len(set(names)), "a rule is loaded twice"
        for group in groups:
            assert group["file"] == str(ALERTS_DIR / "memexporter.rules.yml")
            for rule in group["rules"]:
                assert rule["health"] != "err", f"{rule['name']}: {rule.get('lastError')}"


def test_a_shadowing_file_in_the_folder_fails_the_scenarios(tmp_path: Path) -> None:
    # Not vacuous: the folder as it was before issue 9 (the default plus the demo preset beside
    # it) must fail the same scenarios, with the duplicate samples Prometheus records.
    folder = tmp_path / "alerts"
    folder.mkdir()
    shutil.copy(ALERTS_DIR / "memexporter.rules.yml", folder)
    render_preset(folder, "demo")
    # One short scenario file shows it (each evaluates the recording rules both files define).
    files = [f for f in scenarios_over(str(folder / "*.yml"), tmp_path / "tests") if f.name == SHORT_SCENARIO]
    result = promtool("test", "rules", *files)
    out = result.stdout + result.stderr
    assert result.returncode != 0, "the scenarios passed with a shadowing rules file in the folder"
    assert "duplicate sample for timestamp" in out
