"""Peer labels (rules/params.py, ``peer_labels``): which ranks MemexporterRankImbalance compares, one
training run by default (``job, namespace, run_id``), a parameter of the rendering and of ``memexporter
rules --peer-labels``, and a clear error for a label that cannot name a run. The other parameters:
test_rules.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from memexporter import rules
from tests.unit.rules.test_rules import ALERTS, DEFAULT, load


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
