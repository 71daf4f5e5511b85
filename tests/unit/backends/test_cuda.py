"""TorchBackend itself, over torch.cuda's public functions answering as the SYNTHETIC fixtures say
(tests/fixtures/synthetic; real-shaped, made up): what it reads, what it never calls, and that no
answer of a real allocator makes it raise."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import torch

from memexporter.backends.cuda import TorchBackend
from tests.support.cuda_standins import TorchStandIn, as_installed_reports, installed, load
from tests.support.memory_stats import flatten, shape, unflatten
from tests.support.synthetic_fixtures import SYNTHETIC_DIR

MiB = 1 << 20


def answers(name: str) -> dict[str, Any]:
    return load(SYNTHETIC_DIR / f"{name}.json")["answers"]  # type: ignore[no-any-return]


def standin(monkeypatch: pytest.MonkeyPatch, name_or_answers: str | dict[str, Any]) -> TorchStandIn:
    a = answers(name_or_answers) if isinstance(name_or_answers, str) else name_or_answers
    return TorchStandIn(a).install(monkeypatch)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    "name",
    [
        "v100_torch1.13_after_ooms",
        "a100_torch2.13_fraction",
        "a100_mig_1g.10gb_torch2.13",
        "h100_torch2.13_cudamallocasync",
    ],
)
def test_torchs_own_memory_stats_flattening_gives_the_fixture_back(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    # The stand-in answers the nested dict in the installed torch's shape; that torch's own
    # memory_stats() flattens and sorts it (torch 2.11 has no private pools: it never gets one).
    flat = as_installed_reports(answers(name)["devices"]["0"]["memory_stats"])
    standin(monkeypatch, name)
    assert dict(torch.cuda.memory_stats(0)) == flat
    assert list(torch.cuda.memory_stats(0)) == sorted(flat)
    assert flatten(unflatten(flat)) == flat


def test_v100_on_torch_1_13_after_caught_ooms(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    s = standin(monkeypatch, "v100_torch1.13_after_ooms")
    b = TorchBackend()
    stats = b.device_stats()
    assert list(stats) == [0] and len(stats[0]) == 107
    assert stats[0]["num_ooms"] == 3 and stats[0]["num_alloc_retries"] == 5
    assert "requested_bytes.all.current" not in stats[0] and "num_device_alloc" not in stats[0]
    assert b.devices_in_use() == [0]
    assert b.reading(0) == (
        stats[0]["allocated_bytes.all.current"],
        stats[0]["allocated_bytes.all.peak"],
        stats[0]["allocated_bytes.all.current"] + stats[0]["inactive_split_bytes.all.current"],
    )
    # That torch has neither get_allocator_backend() nor get_per_process_memory_fraction().
    assert not hasattr(torch.cuda, "get_allocator_backend") and not hasattr(
        torch.cuda, "get_per_process_memory_fraction"
    )
    assert b.allocator_backend() == "native"
    assert b.memory_fraction(0) == 1.0
    assert b.total_memory(0) == 16160 * MiB
    assert b.mem_get_info(0) == (1400 * MiB, 16160 * MiB)
    assert b.versions() == ("1.13.1+cu117", "11.7")
    # No get_device_properties().uuid before torch 2.0: said once, not per scrape.
    assert b.uuid(0) is None and b.uuid(0) is None
    assert [w for w in warnings(caplog) if "no device UUID" in w] == [
        "memexporter: torch 1.13.1+cu117 reports no device UUID (get_device_properties().uuid); without it no NVML "
        "device can be matched: no memexporter_device_* series"
    ]
    assert ("get_per_process_memory_fraction", 0) not in s.calls


def test_a100_fraction_and_the_cuda_total(monkeypatch: pytest.MonkeyPatch) -> None:
    standin(monkeypatch, "a100_torch2.13_fraction")
    b = TorchBackend()
    assert b.memory_fraction(0) == 0.5
    assert b.total_memory(0) == 84987740160  # totalGlobalMem, what the fraction multiplies
    assert b.uuid(0) == "3f6a9c2e-8b1d-4e07-a5c9-72d41e0b9f63"  # bare hex, as torch prints it
    assert b.allocator_backend() == "native"
    stats = b.device_stats()[0]
    if shape(installed()).private_pools:  # torch 2.13 on: 123 keys + a MemPool's reserved_bytes_by_private_pools.0_1.*
        assert len(stats) == 135 and stats["reserved_bytes_by_private_pools.0_1.large_pool.current"] == 512 * MiB
    else:  # as an older torch reports the same job: 116 array keys and its scalars (6 on 2.3-2.11), no pools
        assert len(stats) == len(shape(installed()).scalars) + 116 and not any("private_pools" in k for k in stats)


def test_mig_slice_reports_its_bare_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    standin(monkeypatch, "a100_mig_1g.10gb_torch2.13")
    assert TorchBackend().uuid(0) == "9b1c5e7a-2d4f-5a60-8c3b-1e9f0d2a7c45"


def test_pluggable_allocator_that_raises(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    standin(monkeypatch, "h100_torch2.13_pluggable")
    with pytest.raises(RuntimeError, match="does not yet support getDeviceStats"):
        torch.cuda.memory_stats(0)  # what the backend has to survive
    b = TorchBackend()
    for _ in range(3):  # three scrapes
        assert b.device_stats() == {0: {}}  # in use (it holds a context), figures unknown
        assert b.devices_in_use() == []  # nothing for the step tracker to follow
        assert b.memory_fraction(0) == 1.0
    assert b.allocator_backend() == "pluggable"
    assert b.mem_get_info(0) == (17188 * MiB, 84942979072)
    logged = warnings(caplog)
    assert len([w for w in logged if "memory_stats() failed" in w]) == 1
    assert len([w for w in logged if "get_per_process_memory_fraction() failed" in w]) == 1
    assert "'pluggable' allocator" in logged[0] and "getDeviceStats" in logged[0]


def test_pluggable_device_without_a_context_is_not_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    a = answers("h100_torch2.13_pluggable")
    a["devices"]["0"]["has_primary_context"] = False
    standin(monkeypatch, a)
    assert TorchBackend().device_stats() == {}


def test_cuda_malloc_async_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    standin(monkeypatch, "h100_torch2.13_cudamallocasync")
    b = TorchBackend()
    assert b.allocator_backend() == "cudaMallocAsync"
    assert b.device_stats()[0]["reserved_bytes.all.peak"] == 58 << 30


def test_mem_get_info_that_raises_reads_as_unknown(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    a = answers("a100_torch2.13_fraction")
    a["devices"]["0"]["mem_get_info"] = {"raises": "RuntimeError: CUDA error: unspecified launch failure"}
    standin(monkeypatch, a)
    b = TorchBackend()
    assert b.mem_get_info(0) is None and b.mem_get_info(0) is None
    assert len([w for w in warnings(caplog) if "mem_get_info(0) failed" in w]) == 1


def test_not_initialised_reads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    a = answers("a100_torch2.13_fraction")
    a["initialized"] = False
    s = standin(monkeypatch, a)
    b = TorchBackend()
    assert b.device_stats() == {} and b.devices_in_use() == []
    assert (b.uuid(0), b.total_memory(0), b.mem_get_info(0), b.memory_fraction(0), b.reading(0)) == (
        None,
        None,
        None,
        1.0,
        (0, 0, 0),
    )
    assert s.calls == []


def test_only_devices_in_use_are_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    # Four visible devices, the allocator used cuda:2 only: the others are read (memory_stats,
    # host-side counters) but not listed, and nothing that needs a device is called for them.
    a = copy.deepcopy(answers("a100_torch2.13_fraction"))
    a["device_count"] = 4
    a["devices"] = {"2": a["devices"]["0"]}
    s = standin(monkeypatch, a)
    assert list(TorchBackend().device_stats()) == [2]
    assert s.calls == [("memory_stats", i) for i in range(4)]


def test_host_pinned_stats_on_this_cpu_torch_read_nothing() -> None:
    # The real torch.cuda of this CPU build: not initialised, so not even asked.
    assert TorchBackend().host_pinned_stats() == {}


def test_host_pinned_stats_that_raise_read_as_none(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    TorchStandIn(answers("a100_torch2.13_fraction")).install(monkeypatch)
    backend = TorchBackend()
    assert backend.host_pinned_stats()["allocated_bytes.current"] == 1 << 30

    def broken() -> dict[str, float]:
        raise RuntimeError("CUDA driver error: unknown error")

    monkeypatch.setattr(torch.cuda, "host_memory_stats", broken)
    assert backend.host_pinned_stats() == {}
    assert any("host_memory_stats() failed" in r.getMessage() for r in caplog.records)


# --- What fills the limit: the step tracker's reading under each allocator layout (issue 34). -----


def h200(name: str = "nvidia-h200_torch2.11.0_native.json") -> dict[str, Any]:
    """The H200's recorded answers (tests/fixtures/recorded, torch 2.11)."""
    return load(SYNTHETIC_DIR.parent / "recorded" / name)["answers"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("settings", "env", "stranded_counts"),
    [
        ("", {}, True),  # the native allocator: allocated + inactive split
        ("expandable_segments:True", {}, False),  # expandable segments: reserved
        (None, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, False),  # a torch without the getter
        (None, {"PYTORCH_ALLOC_CONF": "max_split_size_mb:64"}, True),
    ],
)
def test_the_reading_follows_the_allocator_settings(
    monkeypatch: pytest.MonkeyPatch, settings: str | None, env: dict[str, str], stranded_counts: bool
) -> None:
    a = h200()
    standin(monkeypatch, a)
    if settings is None:
        monkeypatch.delattr(torch._C, "_accelerator_getAllocatorSettings", raising=False)
    else:
        monkeypatch.setattr(torch._C, "_accelerator_getAllocatorSettings", lambda: settings, raising=False)
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    stats = a["devices"]["0"]["memory_stats"]
    assert stats["inactive_split_bytes.all.current"] > 0  # the recording has split blocks: the cases differ
    used, peak = stats["allocated_bytes.all.current"], stats["allocated_bytes.all.peak"]
    held = used + stats["inactive_split_bytes.all.current"] if stranded_counts else stats["reserved_bytes.all.current"]
    assert TorchBackend().reading(0) == (used, peak, held)


def test_cuda_malloc_async_reads_allocated_whatever_its_pool_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    a = h200("nvidia-h200_torch2.11.0_cudamallocasync.json")
    standin(monkeypatch, a)
    stats = a["devices"]["0"]["memory_stats"]
    assert stats["reserved_bytes.all.current"] > stats["allocated_bytes.all.current"]
    used = stats["allocated_bytes.all.current"]
    assert TorchBackend().reading(0) == (used, stats["allocated_bytes.all.peak"], used)


def test_a_torch_built_without_cuda_has_the_native_backend_and_says_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # torch's CPU wheel has get_allocator_backend(), whose call fails with AttributeError (torch._C has no
    # _cuda_getAllocatorBackend): every CPU job logged a warning once the levers asked (a fresh-clone run).
    def cpu_build() -> str:
        raise AttributeError("module 'torch._C' has no attribute '_cuda_getAllocatorBackend'")

    monkeypatch.setattr(torch.cuda, "get_allocator_backend", cpu_build)
    assert TorchBackend().allocator_backend() == "native"
    assert warnings(caplog) == []
