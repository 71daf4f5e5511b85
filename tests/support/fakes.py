"""Fake backends for unit tests of the mapping code. Every number here is SYNTHETIC: made up to
exercise the mapping, never measured on a GPU. Recorded GPU fixtures live in tests/fixtures/ and
carry their device name and torch version."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from prometheus_client import CollectorRegistry

from memexporter.backends.base import CUDA, DeviceMemory, HostSample, ProcessMemory, Reading, committed, device_label
from memexporter.collectors.registry import GuardedCatalogue, catalogue
from memexporter.collectors.scrape import Identity, Sources
from memexporter.config import Config
from tests.support.memory_stats import host_memory_stats

GiB = 1 << 30
MiB = 1 << 20

# SYNTHETIC memory_stats() subset, shaped like torch 2.x's keys.
SYNTHETIC_STATS: dict[str, int] = {
    "allocated_bytes.all.current": 3 * GiB,
    "allocated_bytes.all.peak": 5 * GiB,
    "reserved_bytes.all.current": 4 * GiB,
    "reserved_bytes.all.peak": 6 * GiB,
    "active_bytes.all.current": 3 * GiB + 64 * MiB,
    "inactive_split_bytes.all.current": 512 * MiB,
    "requested_bytes.all.current": 3 * GiB - 8 * MiB,
    "num_alloc_retries": 2,
    "num_ooms": 1,
    "num_device_alloc": 40,
    "num_device_free": 10,
}


@dataclass
class FakeCuda:
    stats: dict[int, dict[str, int]] = field(default_factory=dict)
    uuids: dict[int, str] = field(default_factory=dict)
    fraction: float = 1.0
    total: int = 80 * GiB
    free: int = 70 * GiB
    backend: str = "native"
    expandable: bool = False
    calls: int = 0
    pinned: dict[str, float] = field(default_factory=dict)  # host_memory_stats()
    family: str = CUDA

    def label(self, index: int) -> str:
        return device_label(self.family, index)

    def devices_in_use(self) -> list[int]:
        return sorted(self.stats)

    def device_stats(self) -> dict[int, Mapping[str, int]]:
        self.calls += len(self.stats)  # one memory_stats() call per device, as the real backend
        return {i: self.stats[i] for i in sorted(self.stats)}

    def allocator_backend(self) -> str:
        return self.backend

    def expandable_segments(self) -> bool:
        return self.expandable

    def reading(self, index: int) -> Reading:
        s = self.stats[index]
        held = committed(s, self.backend, self.expandable)
        used = s["allocated_bytes.all.current"]
        return Reading(used, s["allocated_bytes.all.peak"], used if held is None else held)

    def uuid(self, index: int) -> str | None:
        return self.uuids.get(index)

    def total_memory(self, index: int) -> int | None:
        return self.total

    def memory_fraction(self, index: int) -> float:
        return self.fraction

    def mem_get_info(self, index: int) -> tuple[int, int] | None:
        return self.free, self.total

    def host_pinned_stats(self) -> Mapping[str, float]:
        return self.pinned

    def versions(self) -> tuple[str, str]:
        return "2.13.0+synthetic", "13.0"


@dataclass
class FakeNvml:
    devices: dict[str, DeviceMemory] = field(default_factory=dict)
    processes: dict[str, ProcessMemory] = field(default_factory=dict)  # by UUID: this process's share

    def memory(self, uuid: str, index: int | None = None) -> DeviceMemory | None:
        return self.devices.get(uuid)

    def process_memory(self, uuid: str, pid: int) -> ProcessMemory | None:
        return self.processes.get(uuid)


@dataclass
class FakeHost:
    value: HostSample = field(default_factory=lambda: HostSample(2 * GiB, 512 * MiB, 10 * GiB, 16 * GiB))

    def rss(self) -> int:
        return self.value.rss

    def sample(self) -> HostSample:
        return self.value

    def close(self) -> None:
        return None


IDENTITY = Identity(
    rank="3", local_rank="1", world_size="8", hostname="node17", run_id="run-42", run_id_source="torchelastic"
)


def sources(
    cuda: FakeCuda | None = None,
    nvml: FakeNvml | None = None,
    host: FakeHost | None = None,
    steps: object = None,
    **config: object,
) -> Sources:
    cfg = Config.resolve(config, environ={})
    return Sources(IDENTITY, cfg, cuda or FakeCuda(), nvml or FakeNvml(), host or FakeHost(), steps, "0.0.test")  # type: ignore[arg-type]


def one_gpu(**stats_overrides: int) -> tuple[FakeCuda, FakeNvml]:
    """One synthetic GPU at cuda:0 whose NVML twin has the matching UUID."""
    cuda = FakeCuda(
        stats={0: {**SYNTHETIC_STATS, **stats_overrides}},
        uuids={0: "GPU-synthetic-0"},
        pinned=host_memory_stats(512 * MiB, 128 * MiB, 16, 4),
    )
    # A driver with NVML's v2 memory info: used leaves out the 512 MiB the driver keeps for itself.
    nvml = FakeNvml(
        {
            "GPU-synthetic-0": DeviceMemory(
                "GPU-synthetic-0",
                "Synthetic GPU",
                80 * GiB,
                10 * GiB - 512 * MiB,
                70 * GiB,
                "00000000:01:00.0",
                "GPU-synthetic-0",
                "",
                reserved=512 * MiB,
            )
        }
    )
    # The process as the driver counts it: the allocator's reserved bytes and a 500 MiB context.
    reserved = cuda.stats[0]["reserved_bytes.all.current"]
    nvml.processes["GPU-synthetic-0"] = ProcessMemory(reserved + 500 * MiB)
    return cuda, nvml


def with_host(**kw: int) -> FakeHost:
    return FakeHost(replace(FakeHost().value, **kw))


def registry_for(src: Sources) -> CollectorRegistry:
    """A fresh registry with the full catalogue over the given (fake) sources."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(GuardedCatalogue(catalogue(), src))
    return reg
