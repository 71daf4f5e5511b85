"""Phases in the rules (rules/phases.py, issue 23): the phase series read the out-of-step phases the
exporter keeps out of the step peak; the OOM forecast reads training peaks only, and OOMImminent's
headroom arm the phases' own; the stalled-run alert's parameters are rendered. The rest of the
rules: test_rules.py."""

from __future__ import annotations

import dataclasses
import re

import pytest

from memexporter import rules
from memexporter.tracking.phases import OUT_OF_STEP_PHASES
from tests.unit.rules.test_rules import DEFAULT, OUT_OF_STEP, alerts, load, records


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
