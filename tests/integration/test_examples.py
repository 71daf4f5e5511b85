"""The example Prometheus configs are valid (real promtool) and discover what they promise (real
Prometheus); the PodMonitor declares one endpoint per port of the pod template."""

from __future__ import annotations

import json
import re
import subprocess
import time
from typing import Any

import pytest
import yaml

from tests.support import REPO_ROOT
from tests.support.binaries import require
from tests.support.prometheus import running_prometheus

EXAMPLES = REPO_ROOT / "examples" / "prometheus"
CONFIGS = ["prometheus.static.yml", "prometheus.file_sd.yml"]


def _load(name: str) -> Any:
    return yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", CONFIGS)
def test_promtool_check_config(name: str) -> None:
    result = subprocess.run([require("promtool"), "check", "config", str(EXAMPLES / name)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_file_sd_glob_matches_the_example_targets() -> None:
    (job,) = _load("prometheus.file_sd.yml")["scrape_configs"]
    files = [p for pattern in job["file_sd_configs"][0]["files"] for p in EXAMPLES.glob(pattern)]
    assert files, "the file_sd pattern matches no example file, so promtool would check nothing"
    for path in files:
        groups = json.loads(path.read_text(encoding="utf-8"))
        assert all(g["targets"] and g["labels"]["run_id"] for g in groups)


@pytest.mark.integration
def test_real_prometheus_discovers_the_example_targets() -> None:
    """Load both examples' scrape configs into a real Prometheus; every rank port becomes a target
    with the run's labels (they are down: the hosts are placeholders)."""
    static = _load("prometheus.static.yml")["scrape_configs"][0] | {"job_name": "static"}
    file_sd = _load("prometheus.file_sd.yml")["scrape_configs"][0] | {"job_name": "file_sd"}
    file_sd["file_sd_configs"] = [{"files": [str(EXAMPLES / f) for f in file_sd["file_sd_configs"][0]["files"]]}]
    with running_prometheus([], extra_scrape_configs=[static, file_sd], scrape_interval="5s") as prom:
        deadline = time.monotonic() + 30
        while len(targets := prom.targets()) < 16 and time.monotonic() < deadline:  # discovery is asynchronous
            time.sleep(0.5)
        by_job = {job: sorted(t["labels"]["instance"] for t in targets if t["labels"]["job"] == job)
                  for job in ("static", "file_sd")}
        assert by_job["static"] == by_job["file_sd"] == sorted(f"node{n}:{9400 + r}" for n in (1, 2) for r in range(4))
        assert {t["labels"]["run_id"] for t in targets} == {"exp42"}


def test_podmonitor_has_one_endpoint_per_rank_port() -> None:
    pod = _load("pod-template.yaml")
    ports = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    monitor = _load("podmonitor.yaml")
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    endpoints = [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]]
    assert endpoints == sorted(ports), "one endpoint per declared rank port, in rank order"
    for name, number in ports.items():
        # IANA service names: <= 15 characters of [a-z0-9-] with a letter; rank r on base + r
        assert len(name) <= 15
        assert re.fullmatch(r"[a-z0-9-]*[a-z][a-z0-9-]*", name)
        rank = int(re.fullmatch(r"memexp-r(\d+)", name).group(1))  # type: ignore[union-attr]
        assert number == 9400 + rank
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        relabel = {r["targetLabel"]: r for r in endpoint["relabelings"]}
        assert re.fullmatch(relabel["local_rank"]["regex"], endpoint["port"])
        assert relabel["job"]["replacement"] == "memexporter"
