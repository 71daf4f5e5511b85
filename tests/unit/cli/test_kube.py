"""The Kubernetes renderings: ``memexporter rules --format prometheusrule`` and
``memexporter dashboards --format configmap`` parse, carry exactly the rules and dashboards, satisfy
the PrometheusRule CRD's schema, and reject what the API server would reject, naming the value."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from memexporter import cli, dashboards, rules
from memexporter.cli import dashboards as generate_dashboards
from memexporter.cli import export, kube

# The PrometheusRule CRD's schema (prometheus-operator v0.82, monitoring.coreos.com_prometheusrules.yaml),
# the parts a rules file can get wrong: the closed set of fields (the API server prunes unknown
# ones silently), the duration pattern, and the types.
DURATION = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$")
GROUP_FIELDS = {"name", "interval", "labels", "limit", "partial_response_strategy", "query_offset", "rules"}
RULE_FIELDS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}


def crd_errors(resource: dict[str, Any]) -> list[str]:
    """What the CRD's structural schema would reject or silently drop in ``resource``."""
    errors = []
    if (resource.get("apiVersion"), resource.get("kind")) != ("monitoring.coreos.com/v1", "PrometheusRule"):
        errors.append(f"not a PrometheusRule: {resource.get('apiVersion')}/{resource.get('kind')}")
    if set(resource) - {"apiVersion", "kind", "metadata", "spec"}:
        errors.append(f"unknown top-level fields {set(resource) - {'apiVersion', 'kind', 'metadata', 'spec'}}")
    groups = resource.get("spec", {}).get("groups")
    if not isinstance(groups, list):
        return [*errors, "spec.groups is not a list"]
    names = [g.get("name") for g in groups]
    if len(set(names)) != len(names):
        errors.append(f"group names repeat (a list-map keyed by name): {names}")
    for g in groups:
        if set(g) - GROUP_FIELDS or not isinstance(g.get("name"), str) or not g["name"]:
            errors.append(f"group {g.get('name')!r}: fields {sorted(g)} or name invalid")
        for r in g.get("rules", []):
            where = f"{g['name']}/{r.get('alert') or r.get('record')}"
            if set(r) - RULE_FIELDS:
                errors.append(f"{where}: unknown fields {set(r) - RULE_FIELDS}")
            if ("alert" in r) == ("record" in r):
                errors.append(f"{where}: exactly one of alert and record")
            if not isinstance(r.get("expr"), (str, int)):
                errors.append(f"{where}: expr must be a string")
            if "for" in r and not (isinstance(r["for"], str) and DURATION.match(r["for"])):
                errors.append(f"{where}: for {r['for']!r} does not match the duration pattern")
            for field in ("labels", "annotations"):
                if not all(isinstance(k, str) and isinstance(v, str) for k, v in r.get(field, {}).items()):
                    errors.append(f"{where}: {field} must map strings to strings")
    return errors


def test_prometheusrule_spec_is_exactly_the_rules_file() -> None:
    text = rules.render()
    resource = yaml.safe_load(kube.prometheus_rule(text, namespace="monitoring", labels={"release": "kps"}))
    assert resource["spec"] == yaml.safe_load(text)
    assert resource["metadata"] == {
        "name": "memexporter",
        "namespace": "monitoring",
        "labels": {
            "app.kubernetes.io/name": "memexporter",
            "app.kubernetes.io/part-of": "memexporter",
            "release": "kps",
        },
    }
    assert crd_errors(resource) == []


def test_prometheusrule_keeps_the_comments() -> None:
    out = kube.prometheus_rule(rules.render("demo"))
    assert "#   level_window: 30s" in out  # the parameters the rules were rendered with
    assert "    # Peak utilisation of the limit (0..1)." in out  # the why of each rule, indented into spec


def test_crd_check_catches_what_the_api_server_would_drop() -> None:
    resource = yaml.safe_load(kube.prometheus_rule(rules.render()))
    rule = resource["spec"]["groups"][1]["rules"][0]
    rule["for"], rule["severity"] = "10 minutes", "critical"
    errors = crd_errors(resource)
    assert any("unknown fields {'severity'}" in e for e in errors)
    assert any("duration pattern" in e for e in errors)


def test_cli_renders_a_prometheusrule_with_selector_namespace_and_labels(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        cli.main(
            [
                "rules",
                "--format",
                "prometheusrule",
                "--selector",
                'job="trainer"',
                "--namespace",
                "ml",
                "--label",
                "release=kps",
                "--label",
                "team=ml-infra",
                "--name",
                "trainer-memory",
            ]
        )
        == 0
    )
    resource = yaml.safe_load(capsys.readouterr().out)
    assert resource["metadata"]["name"] == "trainer-memory"
    assert resource["metadata"]["namespace"] == "ml"
    assert resource["metadata"]["labels"]["release"] == "kps"
    assert resource["metadata"]["labels"]["team"] == "ml-infra"
    exprs = [r["expr"] for g in resource["spec"]["groups"] for r in g["rules"]]
    assert all('job="memexporter"' not in e for e in exprs)
    assert any('job="trainer"' in e for e in exprs)
    assert crd_errors(resource) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--label", "release=kps"], "apply to --format prometheusrule"),
        (["--format", "prometheusrule", "--label", "release"], "'release' must be KEY=VALUE"),
        (["--format", "prometheusrule", "--label", "bad key=1"], "label key 'bad key'"),
        (["--format", "prometheusrule", "--label", "release=" + "x" * 64], "label value"),
        (["--format", "prometheusrule", "--label", "Example.COM/team=a"], "label key prefix 'Example.COM'"),
        (["--format", "prometheusrule", "--namespace", "My_NS"], "namespace 'My_NS'"),
        (["--format", "prometheusrule", "--name", "memexporter rules"], "object name 'memexporter rules'"),
        (["--format", "prometheusrules"], "invalid choice: 'prometheusrules'"),
    ],
)
def test_rules_cli_rejects_bad_kubernetes_options(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["rules", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_dashboards_as_configmaps_for_the_sidecar(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        cli.main(
            [
                "dashboards",
                "--format",
                "configmap",
                "--namespace",
                "monitoring",
                "--annotation",
                "grafana_folder=Training",
            ]
        )
        == 0
    )
    maps = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    built = dashboards.build()
    assert [m["metadata"]["name"] for m in maps] == sorted(n.removesuffix(".json") for n in built)
    for cm in maps:
        assert (cm["apiVersion"], cm["kind"]) == ("v1", "ConfigMap")
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"  # a string: label values are strings
        assert cm["metadata"]["namespace"] == "monitoring"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "Training"}
        ((filename, text),) = cm["data"].items()  # one dashboard per ConfigMap, as the chart recommends
        assert json.loads(text) == built[filename]
        assert re.fullmatch(r"[-._a-zA-Z0-9]+", filename)  # a valid ConfigMap key
        # kubectl's client-side apply stores the object in a 256 KiB annotation
        assert len(text.encode()) < 256 * 1024


def test_sidecar_label_is_configurable(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["dashboards", "--format", "configmap", "--sidecar-label", "dashboards=memexporter"]) == 0
    maps = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert all(m["metadata"]["labels"]["dashboards"] == "memexporter" for m in maps)
    assert all("grafana_dashboard" not in m["metadata"]["labels"] for m in maps)
    assert all("namespace" not in m["metadata"] for m in maps)


def test_dashboards_json_files_from_the_installed_package(tmp_path: Path) -> None:
    out = tmp_path / "grafana" / "dashboards"
    assert cli.main(["dashboards", "--output", str(out)]) == 0
    written = {p.name: p.read_text(encoding="utf-8") for p in out.iterdir()}
    assert written == export.rendered()
    committed = generate_dashboards.OUT_DIR
    assert written == {name: (committed / name).read_text(encoding="utf-8") for name in written}


def test_dashboards_without_arguments_writes_a_folder_here_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # it failed with exit status 2 (issue 27)
    assert cli.main(["dashboards"]) == 0
    folder = tmp_path / export.DEFAULT_FOLDER
    assert {p.name: p.read_text(encoding="utf-8") for p in folder.iterdir()} == export.rendered()
    assert f"wrote 3 dashboards to {export.DEFAULT_FOLDER}:" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command", [["rules"], ["rules", "--format", "prometheusrule"], ["dashboards", "--format", "configmap"]]
)
def test_a_write_to_output_says_what_it_wrote(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "out.yaml"
    assert cli.main([*command, "--output", str(target)]) == 0  # `rules --output` was silent
    said = capsys.readouterr()
    assert said.out == "" and f"wrote {target}" in said.err and target.stat().st_size > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--output", "x", "--namespace", "monitoring"], "apply to --format configmap"),
        (["--format", "configmap", "--sidecar-label", "grafana_dashboard"], "must be KEY=VALUE"),
        (["--format", "configmap", "--annotation", "=x"], "annotation key ''"),
    ],
)
def test_dashboards_cli_rejects_bad_options(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["dashboards", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_dashboards_output_that_is_a_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "dashboards"
    target.write_text("keep me", encoding="utf-8")
    with pytest.raises(SystemExit):
        cli.main(["dashboards", "--output", str(target)])
    assert "is not a folder" in capsys.readouterr().err
    assert target.read_text(encoding="utf-8") == "keep me"


def test_prometheus_rule_refuses_text_that_is_not_a_rendered_rules_file() -> None:
    with pytest.raises(ValueError, match="expected a rendered rules file"):
        kube.prometheus_rule("groups: []\n")
