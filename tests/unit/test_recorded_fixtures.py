"""Recorded memory_stats() dicts from real GPUs (tests/fixtures/memory_stats_*.json, each with
its device name and torch version) through the allocator mapping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memexporter.collectors.allocator import KEYS
from tests.unit.fakes import FakeCuda, registry_for, sources

FIXTURES = sorted((Path(__file__).resolve().parents[1] / "fixtures").glob("memory_stats_*.json"))


@pytest.mark.skipif(not FIXTURES, reason="no recorded GPU fixture in tests/fixtures yet (record one with "
                    "MEMEXPORTER_RECORD_FIXTURES=1 pytest tests/cuda on a GPU machine)")
@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_recorded_stats_map_to_contract_series(path: Path) -> None:
    record = json.loads(path.read_text())
    assert record["device_name"] and record["torch_version"], "a recorded fixture names its GPU and torch"
    stats = {k: int(v) for k, v in record["memory_stats"].items() if isinstance(v, (int, float))}
    reg = registry_for(sources(FakeCuda(stats={0: stats})))
    for metric, key in KEYS.items():
        if key in stats:
            assert reg.get_sample_value(metric, {"rank": "3", "device": "cuda:0"}) == stats[key]
    frag = reg.get_sample_value("memexporter_allocator_fragmentation_ratio", {"rank": "3", "device": "cuda:0"})
    assert frag is not None and 0 <= frag <= 1
