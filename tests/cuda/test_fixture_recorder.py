"""The fixture recorder on a real GPU: it creates its folder, names the GPU and torch, and what it
records is consistent and goes through the mapping like the SYNTHETIC fixtures do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cuda.record_fixtures import main
from tests.support.fixture_checks import check_mapping, inconsistencies


@pytest.mark.parametrize("scenario", ["native", "fraction_after_oom", "cudamallocasync"])
def test_recorder_writes_fixtures_that_map(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenario: str) -> None:
    out = tmp_path / "not" / "there" / "yet"
    assert main(["--out", str(out), "--scenario", scenario]) == 0
    [path] = out.glob(f"*_{scenario}.json")
    record = json.loads(path.read_text())
    assert record["synthetic"] is False and record["recorded"]["device_name"] and record["recorded"]["torch_version"]
    answers = record["answers"]
    dev = next(iter(answers["devices"].values()))
    assert answers["allocator_backend"] in ("native", "cudaMallocAsync", None)
    if scenario == "fraction_after_oom":
        assert dev["memory_fraction"] == pytest.approx(0.5) and dev["memory_stats"]["num_ooms"] >= 1
    assert inconsistencies(dev["memory_stats"], answers["allocator_backend"] or "native") == []
    check_mapping(monkeypatch, answers)
