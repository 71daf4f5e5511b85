"""The exposition against the real ``promtool check metrics``: the golden file (which
tests/unit/collectors/test_registry_golden.py keeps equal to the exposition over the SYNTHETIC fake
backends), and a running exporter's phases after real training steps (the phase arithmetic itself:
tests/unit/tracking/test_phases.py; the automatic phases: test_phases_automatic.py, whose trained
exporter this reuses)."""

from __future__ import annotations

import subprocess

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from torch import nn

import memexporter
from memexporter.exporter import running
from memexporter.tracking.phases import PhaseTracker
from tests.support import REPO_ROOT
from tests.support.binaries import require
from tests.support.web import get_text
from tests.unit.tracking.test_phases_automatic import _counts, _train, trained  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration


def promtool_check_metrics(text: str) -> None:
    """``promtool check metrics`` accepts ``text`` with no lint finding."""
    out = subprocess.run(
        [require("promtool"), "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "" and out.stderr.strip() == "", (
        "promtool has lint findings:\n" + out.stdout + out.stderr
    )


def test_the_golden_text_exposition_passes_promtool() -> None:
    promtool_check_metrics((REPO_ROOT / "tests" / "golden" / "exposition.txt").read_text())


PHASE_FAMILIES = {
    "memexporter_phase_peak_bytes": ("gauge", {"rank", "device", "phase"}),
    "memexporter_phase_duration_seconds": ("gauge", {"rank", "phase"}),
    "memexporter_phase_completed": ("counter", {"rank", "phase"}),
    "memexporter_phase_active": ("gauge", {"rank", "phase"}),
    "memexporter_phase_last_change_timestamp_seconds": ("gauge", {"rank"}),
    "memexporter_last_step_timestamp_seconds": ("gauge", {"rank"}),
    "memexporter_step_interval_seconds": ("gauge", {"rank"}),
}


def test_a_running_exporter_exposes_the_phases_and_promtool_accepts_it(
    trained: tuple[PhaseTracker, nn.Module, torch.optim.Optimizer],  # noqa: F811 (the fixture imported above)
) -> None:
    tracker, model, opt = trained
    for _ in range(3):
        _train(model, opt)
    with memexporter.phase("eval"), torch.no_grad():
        model(torch.randn(4, 8))
    exp = running()
    assert exp is not None and exp.url is not None
    text = get_text(exp.url)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name, (kind, labels) in PHASE_FAMILIES.items():
        assert name in fams, name
        assert fams[name].type == kind, name
        assert fams[name].samples, name
        for s in fams[name].samples:
            assert set(s.labels) == labels, (name, s.labels)
    peaks = {(s.labels["device"], s.labels["phase"]) for s in fams["memexporter_phase_peak_bytes"].samples}
    assert {("cpu", n) for n in ("forward", "backward", "optimizer", "eval")} <= peaks
    completed = {
        s.labels["phase"]: s.value for s in fams["memexporter_phase_completed"].samples if s.name.endswith("_total")
    }
    counts = {n: float(c) for n, (c, _) in _counts(tracker).items()}
    assert completed == {**counts, "eval": 1.0}
    assert completed["backward"] == completed["optimizer"] == 3
    active = {s.labels["phase"]: s.value for s in fams["memexporter_phase_active"].samples}
    assert set(active.values()) == {0.0}
    promtool_check_metrics(text)
