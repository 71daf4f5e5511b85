"""The GPU fixture recorder (tests/cuda/record_fixtures.py), run on CPU against the stand-ins: what
it records from torch.cuda and NVML is exactly what the stand-ins replay, for every SYNTHETIC
fixture. So a recorded fixture and a synthetic one are read the same way."""

from __future__ import annotations

import copy

import pytest

from tests.cuda.record_fixtures import host_answers, nvml_answers, torch_answers
from tests.support.cuda_standins import TorchStandIn, load
from tests.support.nvml_h200 import h200_answers
from tests.support.nvml_standin import NvmlStandIn
from tests.support.synthetic_fixtures import FIXTURES, SYNTHETIC_DIR


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_recorder_reads_back_what_the_standins_answer(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    answers = load(SYNTHETIC_DIR / f"{name}.json")["answers"]
    TorchStandIn(copy.deepcopy(answers)).install(monkeypatch)
    NvmlStandIn(copy.deepcopy(answers["nvml"])).install(monkeypatch)
    assert torch_answers(0) == answers["devices"]["0"]
    assert host_answers() == answers.get("host_memory_stats")
    recorded = nvml_answers()
    assert recorded is not None and recorded.pop("driver_version") == ""
    assert recorded == answers["nvml"]


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
