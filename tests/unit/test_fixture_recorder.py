"""The GPU fixture recorder (tests/cuda/record_fixtures.py), run on CPU against the stand-ins: what
it records from torch.cuda and NVML is exactly what the stand-ins replay, for every SYNTHETIC
fixture and every one recorded on a GPU (read back as the installed torch reports them). So a
recorded fixture and a synthetic one are read the same way."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tests.cuda.record_fixtures import host_answers, nvml_answers, torch_answers
from tests.support.cuda_standins import HOST_STATS, TorchStandIn, as_installed_reports, load, recorded_files
from tests.support.nvml_h200 import h200_answers
from tests.support.nvml_standin import NvmlStandIn
from tests.support.synthetic_fixtures import FIXTURES, SYNTHETIC_DIR

EVERY = [pytest.param(SYNTHETIC_DIR / f"{name}.json", id=name) for name in sorted(FIXTURES)] + [
    pytest.param(path, id=path.stem) for path in recorded_files()
]


@pytest.mark.parametrize("path", EVERY)
def test_recorder_reads_back_what_the_standins_answer(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    answers = load(path)["answers"]
    TorchStandIn(copy.deepcopy(answers)).install(monkeypatch)
    NvmlStandIn(copy.deepcopy(answers["nvml"])).install(monkeypatch)
    # What the installed torch reports of them (torch 2.11 has no private pools; 2.1 no host_memory_stats()).
    device = answers["devices"]["0"]
    assert torch_answers(0) == {**device, "memory_stats": as_installed_reports(device["memory_stats"])}
    assert host_answers() == (answers.get("host_memory_stats") if HOST_STATS else None)
    recorded = nvml_answers()
    assert recorded is not None
    assert recorded == {**answers["nvml"], "driver_version": answers["nvml"].get("driver_version", "")}


@pytest.mark.parametrize("binding", [True, False])  # False: an nvidia-ml-py without v2 memory info
def test_recorder_records_nvml_v2_where_there_is_one(monkeypatch: pytest.MonkeyPatch, binding: bool) -> None:
    answers = h200_answers()  # v2 SYNTHETIC, derived from the H200 recording
    if not binding:
        answers["memory_v2_binding"] = False
    NvmlStandIn(copy.deepcopy(answers)).install(monkeypatch)
    recorded = nvml_answers()
    if not binding:
        del answers["gpus"][0]["memory_v2"]  # not asked: the binding cannot
        assert recorded == answers
        return
    assert recorded == answers
    answers["gpus"][0]["memory_v2"] = {"raises": "NVMLError_NotSupported: Not Supported"}
    NvmlStandIn(copy.deepcopy(answers)).install(monkeypatch)
    assert nvml_answers() == answers  # what else v2 raised is recorded; FUNCTION_NOT_FOUND is its absence


def test_recorder_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.cuda_standins import no_nvml

    no_nvml(monkeypatch)
    assert nvml_answers() is None
