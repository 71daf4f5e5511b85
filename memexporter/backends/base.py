"""What the rest of the package needs from a backend: the source protocols and device naming.

A leaf module (it imports nothing of memexporter at run time), so the layers point one way:
backends -> tracking (the training thread) -> scrape -> collectors. Fakes in the unit tests
implement the same protocols.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from memexporter.backends.host import HostSample
    from memexporter.backends.nvml import NvmlMemory, ProcessMemory

log = logging.getLogger("memexporter")

# torch.cuda.get_allocator_backend() answers. Under cudaMallocAsync only allocated, active and
# reserved bytes are measured (from the driver's pool); the native-only statistics read zero.
ALLOCATOR_NATIVE = "native"
ALLOCATOR_ASYNC = "cudaMallocAsync"
ALLOCATOR_PLUGGABLE = "pluggable"  # torch.cuda.memory.CUDAPluggableAllocator: no statistics at all


def cuda_label(index: int) -> str:
    """The ``device`` label of a CUDA ordinal as the process sees it: ``cuda:N``."""
    return f"cuda:{index}"


class CudaSource(Protocol):
    """What the scrape and the step tracker need from ``backends.torch.TorchBackend``.

    No method raises: an unreadable figure is ``None`` (or ``1.0`` for the fraction), so one
    failing call costs only its own figure.
    """

    def cuda_devices(self) -> list[int]: ...
    def device_stats(self) -> dict[int, Mapping[str, int]]: ...
    def allocator_backend(self) -> str: ...
    def allocated(self, index: int) -> tuple[int, int]: ...
    def uuid(self, index: int) -> str | None: ...
    def total_memory(self, index: int) -> int | None: ...
    def memory_fraction(self, index: int) -> float: ...
    def mem_get_info(self, index: int) -> tuple[int, int] | None: ...
    def host_pinned_stats(self) -> Mapping[str, float]: ...
    def versions(self) -> tuple[str, str]: ...


class NvmlSource(Protocol):
    """What the scrape needs from ``backends.nvml.NvmlBackend``."""

    def memory(self, uuid: str) -> NvmlMemory | None: ...
    def process_memory(self, uuid: str, pid: int) -> ProcessMemory | None: ...


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
