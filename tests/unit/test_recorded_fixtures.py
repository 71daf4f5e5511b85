"""Fixtures of what torch.cuda and NVML answer, through the real backends and the whole scrape.

Two sets, kept apart:
- tests/fixtures/synthetic/*.json: SYNTHETIC, made up in the exact shape torch's source gives
  (tests/support/synthetic_fixtures.py); they always run.
- tests/fixtures/recorded/*.json: recorded on a real GPU by tests/cuda/record_fixtures.py
  (scripts/gpu-check.sh), each naming its GPU and torch (an NVIDIA H200 on torch 2.11, 2026-11-27:
  ../shared/gpu/h200-2026-11-27). Only the top-level files: traces/ below holds per-step traces.

Every scrape runs the installed torch's own memory_stats() over the answers as that torch reports
them (tests/support/cuda_standins.py), so the suite checks the same files under each torch version
that scripts/torch_versions.py runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cuda_standins import load, recorded_files
from tests.support.fixture_checks import check_mapping, inconsistencies, torch_version_of
from tests.support.memory_stats import PRIVATE_POOLS, flatten, nested
from tests.support.synthetic_fixtures import FIXTURES, SYNTHETIC_DIR, render

SYNTHETIC = [pytest.param(p, id=p.name) for p in sorted(SYNTHETIC_DIR.glob("*.json"))]
RECORDED = [pytest.param(p, id=p.name) for p in recorded_files()] or [
    pytest.param(
        None,
        id="none-recorded",
        marks=pytest.mark.skip(
            reason="no GPU-recorded fixture in tests/fixtures/recorded yet (run scripts/gpu-check.sh on a GPU machine)"
        ),
    )
]


def test_synthetic_set_is_complete_and_current() -> None:
    assert sorted(p.stem for p in SYNTHETIC_DIR.glob("*.json")) == sorted(FIXTURES)
    for name in FIXTURES:
        assert (SYNTHETIC_DIR / f"{name}.json").read_text() == render(name), (
            f"{name}.json differs from tests/support/synthetic_fixtures.py: rerun python -m tests.support.synthetic_fixtures"
        )


@pytest.mark.parametrize("path", SYNTHETIC)
def test_synthetic_fixture_says_so_and_has_torchs_key_set(path: Path) -> None:
    record = load(path)
    assert record["synthetic"] is True and record["provenance"].startswith("SYNTHETIC, not measured on a GPU")
    assert "recorded" not in record, "a synthetic fixture never claims a recording"
    stats = record["answers"]["devices"]["0"]["memory_stats"]
    if "raises" in stats:
        return
    version = record["answers"]["torch_version"].split("+")[0].rsplit(".", 1)[0]
    keys = {k for k in stats if not k.startswith(PRIVATE_POOLS)}
    assert keys == set(flatten(nested(version, {}, {}))) - {PRIVATE_POOLS}
    assert len(stats) >= 100


@pytest.mark.parametrize("path", RECORDED)
def test_recorded_fixture_names_its_gpu_and_torch(path: Path) -> None:
    record = load(path)
    assert record["synthetic"] is False
    rec = record["recorded"]
    assert rec["device_name"] and rec["torch_version"] and rec["recorded_by"], (
        "a recorded fixture names its GPU and torch"
    )
    assert rec["torch_version"] == record["answers"]["torch_version"]


@pytest.mark.parametrize("path", RECORDED)
def test_recorded_answers_have_the_key_set_of_their_torch(path: Path) -> None:
    # What the GPU answered is the key set memory_stats.shape() gives its release: the table the
    # stand-ins answer every other torch's shape from, checked against a real one.
    answers = load(path)["answers"]
    for dev in answers["devices"].values():
        keys = {k for k in dev["memory_stats"] if not k.startswith(PRIVATE_POOLS)}
        assert keys == set(flatten(nested(answers["torch_version"], {}, {}))), path.name


def test_only_the_top_level_answer_files_are_fixtures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tests.support.cuda_standins as standins

    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "trace-native-8mib.json").write_text("{}")
    (tmp_path / "h200_native.json").write_text("{}")
    monkeypatch.setattr(standins, "RECORDED_DIR", tmp_path)
    assert standins.recorded_files() == [tmp_path / "h200_native.json"]


@pytest.mark.parametrize("path", SYNTHETIC + RECORDED)
def test_memory_stats_are_self_consistent(path: Path) -> None:
    answers = load(path)["answers"]
    for dev in answers["devices"].values():
        stats = dev["memory_stats"]
        if "raises" not in stats:
            assert inconsistencies(stats, answers["allocator_backend"] or "native") == []
            assert torch_version_of(stats) != "unknown" or not path.is_relative_to(SYNTHETIC_DIR)


@pytest.mark.parametrize("path", SYNTHETIC + RECORDED)
def test_answers_map_to_the_contract_series(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    check_mapping(monkeypatch, load(path)["answers"])


def test_consistency_check_can_fail() -> None:
    stats = load(SYNTHETIC_DIR / "a100_torch2.13_fraction.json")["answers"]["devices"]["0"]["memory_stats"]
    broken = {**stats, "active_bytes.large_pool.current": stats["reserved_bytes.large_pool.current"] + 1}
    assert "large_pool: not allocated <= active <= reserved" in inconsistencies(broken, "native")
    assert inconsistencies({**stats, "num_ooms": 1}, "cudaMallocAsync") != []
