"""deploy/kubernetes/: the committed renderings are current, the rules inside the PrometheusRule pass
the real promtool, and the kustomization builds into the resources it promises.

No cluster is reachable here, so nothing is applied: the resources are checked against the
PrometheusRule CRD's schema (tests/unit/cli/test_kube.py) and built with ``kubectl kustomize`` where
kubectl is installed (it runs offline); the kustomization's references are also followed by hand,
so a missing file fails even without kubectl.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from memexporter import cli, rules
from memexporter.cli import generate
from tests.support import REPO_ROOT
from tests.support.binaries import require
from tests.unit.cli.test_kube import crd_errors

HERE = REPO_ROOT / "deploy" / "kubernetes"
EXPECTED_KINDS = Counter({"ConfigMap": 3, "PrometheusRule": 1, "PodMonitor": 1})


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


# What a user types to make these objects (docs/deploy.md): the committed files are their output.
# (That they are fresh is `python -m memexporter.cli.generate --check`'s, tests/unit/cli/test_generate.py.)
USER_COMMANDS = {
    "prometheusrule.yaml": ["rules", "--format", "prometheusrule"],
    "dashboards.yaml": ["dashboards", "--format", "configmap"],
}


def test_committed_renderings_are_what_the_user_commands_write(tmp_path: Path) -> None:
    assert set(USER_COMMANDS) == {Path(rel).name for rel in generate.GENERATED["kubernetes"].render(REPO_ROOT)}, (
        "a Kubernetes object the generator writes has no user command here, or the reverse"
    )
    for name, argv in USER_COMMANDS.items():
        out = tmp_path / name
        assert cli.main([*argv, "--output", str(out)]) == 0
        committed = HERE / name
        assert committed.read_text(encoding="utf-8") == out.read_text(encoding="utf-8"), (
            f"{committed} differs from `memexporter {' '.join(argv)}`"
        )


@pytest.mark.parametrize("argv", [[], ["--preset", "demo", "--selector", 'job="trainer", namespace="ml"']])
def test_rules_inside_the_prometheusrule_pass_promtool(tmp_path: Path, argv: list[str]) -> None:
    out = tmp_path / "rule.yaml"
    assert cli.main(["rules", "--format", "prometheusrule", *argv, "--output", str(out)]) == 0
    (resource,) = _docs(out)
    assert crd_errors(resource) == []
    spec = tmp_path / "spec.yml"
    spec.write_text(yaml.safe_dump(resource["spec"]), encoding="utf-8")
    result = subprocess.run(
        [require("promtool"), "check", "rules", str(spec)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    count = sum(len(g["rules"]) for g in resource["spec"]["groups"])
    assert f"SUCCESS: {count} rules found" in result.stdout
    assert count == sum(len(g["rules"]) for g in yaml.safe_load(rules.render())["groups"])


def _resolve(folder: Path, root: Path) -> list[dict[str, Any]]:
    """The resources a kustomization lists, following bases, with kustomize's load restriction:
    a file must lie inside the kustomization's folder; another folder must be a kustomization."""
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text(encoding="utf-8"))
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    resources = []
    for entry in kustomization["resources"]:
        path = (folder / entry).resolve()
        assert path.exists(), f"{folder / entry} (listed in {folder}/kustomization.yaml) does not exist"
        if path.is_dir():
            resources += _resolve(path, path)
        else:
            assert path.is_relative_to(root), f"{entry} is outside {root}: kustomize refuses to load it"
            resources += _docs(path)
    return resources


def test_kustomization_references_resolve() -> None:
    resources = _resolve(HERE, HERE)
    assert Counter(r["kind"] for r in resources) == EXPECTED_KINDS
    assert all(r["metadata"]["name"] for r in resources)


def test_kubectl_kustomize_builds_the_stack() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip(
            "kubectl not installed (not packaged by Debian 12): the kustomization's references are "
            "checked by test_kustomization_references_resolve instead"
        )
    result = subprocess.run([kubectl, "kustomize", str(HERE)], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    built = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert Counter(r["kind"] for r in built) == EXPECTED_KINDS
    kustomization = yaml.safe_load((HERE / "kustomization.yaml").read_text(encoding="utf-8"))
    release = kustomization["labels"][0]["pairs"]
    for resource in built:
        assert resource["metadata"]["namespace"] == kustomization["namespace"]
        assert release.items() <= resource["metadata"]["labels"].items()
    (rule,) = [r for r in built if r["kind"] == "PrometheusRule"]
    assert rule["spec"] == yaml.safe_load(rules.render())
    assert crd_errors(rule) == []
    maps = [r for r in built if r["kind"] == "ConfigMap"]
    assert all(m["metadata"]["labels"]["grafana_dashboard"] == "1" for m in maps)
    (monitor,) = [r for r in built if r["kind"] == "PodMonitor"]
    assert monitor["spec"]["namespaceSelector"] == {"any": True}  # training pods live in other namespaces
