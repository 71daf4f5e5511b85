"""A rank of a 1,024-rank torchrun job, as the started exporter serves it over HTTP: its run, and
the core set on a rank that is not a detail rank (the module rows only on the first node's).
Real torch on CPU, a real tracked model, real HTTP on loopback."""

from __future__ import annotations

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

import memexporter
from tests.support.web import get_text

pytestmark = pytest.mark.usefixtures("no_exporter")


def _serve(monkeypatch: pytest.MonkeyPatch, rank: int) -> dict[str, list[dict[str, str]]]:
    """Start as rank ``rank`` of 1,024 (8 per node), train a tracked model a step, scrape once."""
    for name, value in {
        "WORLD_SIZE": "1024",
        "LOCAL_WORLD_SIZE": "8",
        "RANK": str(rank),
        "LOCAL_RANK": "0",
        "TORCHELASTIC_RUN_ID": "pretrain-0412",
    }.items():
        monkeypatch.setenv(name, value)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    exp = memexporter.start(port=0, addr="127.0.0.1", model=model, optimizer=optimizer)
    try:
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        text = get_text(f"http://127.0.0.1:{exp.port}/metrics")
    finally:
        exp.stop()
    return {f.name: [s.labels for s in f.samples] for f in text_string_to_metric_families(text) if f.samples}


def test_a_core_rank_serves_its_run_and_no_module_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    served = _serve(monkeypatch, rank=9)
    assert served["memexporter_run_info"] == [
        {"rank": "9", "run_id": "pretrain-0412", "run_id_source": "torchelastic", "detail": "core"}
    ]
    assert not [n for n in served if n.startswith("memexporter_module_")]
    assert "memexporter_collector_duration_seconds" not in served
    assert {s["phase"] for s in served.get("memexporter_phase_peak_bytes", [])} <= {"eval"}
    assert served["memexporter_memory_peak_bytes"] and served["memexporter_steps"]


def test_a_detail_rank_serves_the_module_rows_for_its_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    served = _serve(monkeypatch, rank=3)
    assert served["memexporter_run_info"][0]["detail"] == "representative"
    assert {s["module"] for s in served["memexporter_module_parameter_bytes"]} == {"(root)", "0", "1", "2"}
    assert "memexporter_collector_duration_seconds" in served
