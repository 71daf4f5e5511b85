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

from memexporter.rules import PEER_LABELS
from tests.support import REPO_ROOT
from tests.support.binaries import require
from tests.support.prometheus import running_prometheus

EXAMPLES = REPO_ROOT / "examples" / "prometheus"
CONFIGS = ["prometheus.static.yml", "prometheus.file_sd.yml"]


def _load(name: str) -> Any:
    return yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", CONFIGS)
def test_promtool_check_config(name: str) -> None:
    result = subprocess.run(
        [require("promtool"), "check", "config", str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_file_sd_glob_matches_the_example_targets() -> None:
    (job,) = _load("prometheus.file_sd.yml")["scrape_configs"]
    files = [p for pattern in job["file_sd_configs"][0]["files"] for p in EXAMPLES.glob(pattern)]
    assert files, "the file_sd pattern matches no example file, so promtool would check nothing"
    for path in files:
        groups = json.loads(path.read_text(encoding="utf-8"))
        assert all(g["targets"] and g["labels"]["run_id"] for g in groups)


def test_static_example_labels_every_target_group_with_a_run() -> None:
    # Several runs may share the Prometheus job; run_id (a peer label) tells their ranks apart.
    assert "run_id" in PEER_LABELS
    (job,) = _load("prometheus.static.yml")["scrape_configs"]
    assert all(g["labels"]["run_id"] for g in job["static_configs"])


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
        by_job = {
            job: sorted(t["labels"]["instance"] for t in targets if t["labels"]["job"] == job)
            for job in ("static", "file_sd")
        }
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
        # Every pod lands in job="memexporter": run_id (a peer label) must come from a per-run label.
        assert "run_id" in PEER_LABELS
        assert relabel["run_id"]["sourceLabels"] == ["__meta_kubernetes_pod_label_job_name"]
        assert set(relabel["run_id"]) <= {"sourceLabels", "targetLabel"}  # default action: replace with $1
    assert pod["metadata"]["labels"]["job-name"], "the pod template should carry the label run_id comes from"


def _podmonitor_as_scrape_config(endpoint: dict[str, Any]) -> dict[str, Any]:
    """A PodMonitor endpoint's relabelings as a scrape config's relabel_configs, as the operator writes them."""
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {"relabel_configs": [{keys.get(k, k): v for k, v in r.items()} for r in endpoint["relabelings"]]}


@pytest.mark.integration
def test_real_prometheus_applies_the_podmonitor_relabelings() -> None:
    """The PodMonitor's relabelings in a real Prometheus, fed the meta labels Kubernetes service
    discovery would give two pods of two runs (static targets may carry __meta_ labels)."""
    monitor = _load("podmonitor.yaml")
    configs = []
    for i, endpoint in enumerate(monitor["spec"]["podMetricsEndpoints"][:2]):
        groups = [
            {
                "targets": [f"10.0.{n}.1:{9400 + i}"],
                "labels": {
                    "__meta_kubernetes_namespace": "ml",
                    "__meta_kubernetes_pod_label_job_name": run,
                    "__meta_kubernetes_pod_container_port_name": endpoint["port"],
                },
            }
            for n, run in enumerate(("train-exp42", "sweep-17"))
        ]
        configs.append(
            {"job_name": f"podmonitor-{i}", "static_configs": groups} | _podmonitor_as_scrape_config(endpoint)
        )
    with running_prometheus([], extra_scrape_configs=configs, scrape_interval="5s") as prom:
        deadline = time.monotonic() + 30
        while len(targets := prom.targets()) < 4 and time.monotonic() < deadline:
            time.sleep(0.5)
        got = sorted(
            (t["labels"]["instance"], t["labels"]["job"], t["labels"]["run_id"], t["labels"]["local_rank"])
            for t in targets
        )
    assert got == [
        ("10.0.0.1:9400", "memexporter", "train-exp42", "0"),
        ("10.0.0.1:9401", "memexporter", "train-exp42", "1"),
        ("10.0.1.1:9400", "memexporter", "sweep-17", "0"),
        ("10.0.1.1:9401", "memexporter", "sweep-17", "1"),
    ]
