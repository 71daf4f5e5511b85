"""What the rest of the package needs from a backend: the source protocols and device naming.

A leaf module (it imports nothing of memexporter at run time), so the layers point one way:
backends -> tracking (the training thread) -> scrape -> collectors. Fakes in the unit tests
implement the same protocols.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol, TypeVar

log = logging.getLogger("memexporter")
T = TypeVar("T")

# torch.cuda.get_allocator_backend() answers. Under cudaMallocAsync only allocated, active and
# reserved bytes are measured (from the driver's pool); the native-only statistics read zero.
ALLOCATOR_NATIVE = "native"
ALLOCATOR_ASYNC = "cudaMallocAsync"
ALLOCATOR_PLUGGABLE = "pluggable"  # torch.cuda.memory.CUDAPluggableAllocator: no statistics at all


def committed(stats: Mapping[str, int], backend: str, expandable: bool) -> int | None:
    """The bytes a device's limit is met by: the memory the caching allocator cannot hand back.

    A caching allocator reserves segments and carves tensors out of them. Before it reports an
    OOM it frees its wholly free cached segments and retries, so those never count; the rest does:

    - native: ``allocated`` plus ``inactive_split`` (free blocks stranded in partly used segments,
      which only smaller requests can reuse). On an H200 under a 6 GiB memory fraction, a job
      leaking 8 MiB a step got 20 MiB segments: ``reserved`` grew 10 MiB a step against 8, and the
      OOM came with ``allocated`` at 79 % of the limit and ``allocated + inactive_split`` at 99.7 %.
    - expandable segments (``expandable_segments:True``): ``reserved``, the mapped pages, which stay
      close to ``allocated`` (100 % and 99.2 % at the same OOM).
    - ``cudaMallocAsync``: ``allocated``. The driver's pool keeps freed memory that the next
      allocation takes back; its ``reserved`` reached 136 % of the fraction with no OOM.

    XPU keeps the native statistics (``inactive_split`` from torch 2.11); MPS only allocated and
    reserved, so its figure is ``allocated``. ``None`` when the allocator reports nothing.
    """
    allocated = stats.get("allocated_bytes.all.current")
    if allocated is None:
        return None
    if backend == ALLOCATOR_ASYNC:
        return allocated
    if expandable:
        return max(allocated, stats.get("reserved_bytes.all.current", allocated))
    return allocated + stats.get("inactive_split_bytes.all.current", 0)


def expandable_in(settings: str) -> bool:
    """Whether allocator settings (``"expandable_segments:True,max_split_size_mb:128"``, the
    ``PYTORCH_CUDA_ALLOC_CONF`` syntax) turn expandable segments on."""
    for item in settings.split(","):
        key, _, value = item.partition(":")
        if key.strip() == "expandable_segments":
            return value.strip().lower() == "true"
    return False


class Reading(NamedTuple):
    """One device read at one instant on the training thread, in bytes: ``used`` (allocated, or the
    process RSS on ``cpu``), its lifetime high-water mark ``peak``, and ``committed``, what the limit
    is met by (``committed()``; the RSS on ``cpu``)."""

    used: int
    peak: int
    committed: int


# The device families torch's caching allocators serve, by torch.device type. ROCm's HIP build
# answers through torch.cuda, so an AMD GPU is "cuda" here too (device_info's vendor tells).
CUDA, XPU, MPS = "cuda", "xpu", "mps"


def device_label(family: str, index: int) -> str:
    """The ``device`` label of an ordinal as the process sees it: ``cuda:N``, ``xpu:N``, or ``mps``
    (Apple silicon has one GPU; torch names it ``mps``)."""
    return MPS if family == MPS else f"{family}:{index}"


def cuda_label(index: int) -> str:
    """``device_label`` of a CUDA (or ROCm) ordinal: ``cuda:N``."""
    return device_label(CUDA, index)


@dataclass(frozen=True)
class DeviceMemory:
    """One device as its driver library reports it (NVML, amdsmi, or torch.xpu). Sizes in bytes.

    ``uuid`` is the library's spelling (NVML: ``GPU-...`` or ``MIG-...``), ``name`` the model
    name, ``pci_bus_id`` the PCI address. On an NVIDIA MIG slice ``gpu_uuid`` is the physical
    GPU's UUID and ``gpu_instance_id`` its GPU instance id, which is how dcgm-exporter labels a
    slice (``UUID``, ``GPU_I_ID``); on a whole GPU ``gpu_uuid`` equals ``uuid`` and
    ``gpu_instance_id`` is empty. ``vendor``: ``nvidia``, ``amd`` or ``intel``.

    ``reserved`` is what the driver sets aside for itself (NVML v2's ``reserved``), where the library
    reports it apart: then ``used`` excludes it and ``total = used + reserved + free``. ``None``
    where it cannot be told apart (NVML v1, amdsmi, Level Zero), and ``used`` may include it.
    """

    uuid: str
    name: str
    total: int
    used: int
    free: int
    pci_bus_id: str = ""
    gpu_uuid: str = ""
    gpu_instance_id: str = ""
    vendor: str = "nvidia"
    reserved: int | None = None


@dataclass(frozen=True)
class DeviceIdentity:
    """What a device is, as its driver library names it, looked up once per device (the fields
    are ``DeviceMemory``'s, without the sizes, which are read at every scrape)."""

    uuid: str
    name: str
    pci_bus_id: str = ""
    gpu_uuid: str = ""
    gpu_instance_id: str = ""
    vendor: str = "nvidia"

    def with_memory(self, total: int, used: int, free: int, reserved: int | None = None) -> DeviceMemory:
        """This device's ``DeviceMemory`` with the sizes just read (bytes; ``reserved``: see there)."""
        return DeviceMemory(
            self.uuid,
            self.name,
            total,
            used,
            free,
            self.pci_bus_id,
            self.gpu_uuid,
            self.gpu_instance_id,
            self.vendor,
            reserved,
        )


@dataclass(frozen=True)
class ProcessMemory:
    """This process's memory on one device as the driver counts it (NVML's
    ``nvmlDeviceGetComputeRunningProcesses``, amdsmi's process list): everything the process
    holds there, the caching allocator's reserved bytes plus what it never sees (the context,
    cuBLAS/cuDNN or rocBLAS/MIOpen workspaces, NCCL/RCCL buffers, other libraries' allocations).

    ``used`` in bytes, ``None`` when the driver cannot say, and ``why``: ``hidden`` (the driver
    lists the device's processes under PIDs of another PID namespace, as in a container without
    the host's PID namespace, so none is this one), ``not_available`` (the driver lists this
    process without a figure: NVML's ``NVML_VALUE_NOT_AVAILABLE``, amdsmi's ``"N/A"``) or
    ``error`` (the call failed).
    """

    used: int | None
    why: str = ""


class AllocatorSource(Protocol):
    """What the scrape and the step tracker need from a caching allocator's backend: ``TorchBackend``
    (torch.cuda, on NVIDIA and on ROCm), ``XpuBackend`` (torch.xpu) or ``MpsBackend`` (torch.mps).

    ``device_stats`` answers in ``torch.cuda.memory_stats()``'s flat vocabulary, whatever the
    family. No method raises: an unreadable figure is ``None`` (or ``1.0`` for the fraction), so
    one failing call costs only its own figure.
    """

    family: str

    def label(self, index: int) -> str: ...
    def devices_in_use(self) -> list[int]: ...
    def device_stats(self) -> dict[int, Mapping[str, int]]: ...
    def allocator_backend(self) -> str: ...
    def expandable_segments(self) -> bool: ...
    def reading(self, index: int) -> Reading: ...
    def uuid(self, index: int) -> str | None: ...
    def total_memory(self, index: int) -> int | None: ...
    def memory_fraction(self, index: int) -> float: ...
    def mem_get_info(self, index: int) -> tuple[int, int] | None: ...
    def host_pinned_stats(self) -> Mapping[str, float]: ...
    def versions(self) -> tuple[str, str]: ...


class DriverSource(Protocol):
    """What the scrape needs from a driver library's backend: ``NvmlBackend`` (NVIDIA),
    ``AmdSmiBackend`` (AMD), ``XpuBackend`` (Intel, through torch.xpu) or ``NoDriver``. Devices
    are named by torch's UUID (``AllocatorSource.uuid``), never by index."""

    def memory(self, uuid: str, index: int | None = None) -> DeviceMemory | None: ...  # index: torch's ordinal
    def process_memory(self, uuid: str, pid: int) -> ProcessMemory | None: ...


@dataclass(frozen=True)
class HostSample:
    """Host memory in bytes. ``available`` and ``limit`` are cgroup-aware. A figure whose read
    failed is ``None``, and ``failed`` says which reads failed and why."""

    rss: int | None
    children_rss: int | None
    available: int | None
    limit: int | None
    failed: tuple[str, ...] = ()


class HostSource(Protocol):
    """What the scrape and the step tracker need from ``backends.host.HostBackend``."""

    def rss(self) -> int: ...
    def sample(self) -> HostSample: ...
    def close(self) -> None: ...


class LogOnce:
    """Log the first occurrence of each kind of failure, then stay quiet (debug level).

    A backend call that fails on every scrape must not flood the training job's log.
    """

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def warning(self, key: str, msg: str, *args: object) -> None:
        with self._lock:
            first = key not in self._seen
            self._seen.add(key)
        log.log(logging.WARNING if first else logging.DEBUG, msg, *args)

    def read(self, key: str, fn: Callable[[], T], default: T, msg: str, *args: object) -> T:
        """``fn()``; if it raises, ``default``, and ``msg % (*args, the exception)`` logged as above.

        A backend's reads are each one such call: one failing figure costs only itself.
        """
        try:
            return fn()
        except Exception as exc:
            self.warning(key, msg, *args, exc)
            return default


def reading_of(nested: Mapping[str, object], layout: tuple[str, bool]) -> Reading:
    """A ``Reading`` from a ``memory_stats_as_nested_dict()`` answer (no flattening) and the
    allocator's ``(backend, expandable segments)``."""

    def current(family: str, field: str = "current") -> int | None:
        node = nested.get(family)
        value = node.get("all", {}).get(field) if isinstance(node, Mapping) else None
        return int(value) if value is not None else None

    figures = {
        f"{family}.all.current": value
        for family in ("allocated_bytes", "inactive_split_bytes", "reserved_bytes")
        if (value := current(family)) is not None
    }
    used = figures.get("allocated_bytes.all.current", 0)
    held = committed(figures, *layout)
    return Reading(used, current("allocated_bytes", "peak") or 0, used if held is None else held)
