"""CUDA caching-allocator access: the only module that imports ``torch.cuda``. ROCm's HIP build of
torch answers through the same ``torch.cuda`` functions (the HIP caching allocator keeps CUDA's
statistics), so this backend serves AMD GPUs too; ``backends/amdsmi.py`` is their driver view.

Observe, never initialise: every call first checks ``torch.cuda.is_initialized()`` and answers
empty when CUDA is not in use, so the exporter never creates a CUDA context on its own (a context
costs hundreds of MiB and cannot be freed). Every call names its device explicitly, because the
scrape thread does not inherit the training thread's current device, and calls that need a device
(properties, fraction, ``mem_get_info``) are made only for devices the process already uses.

No method raises. Allocators differ in what they can answer: a ``CUDAPluggableAllocator`` raises
on ``memory_stats()`` and ``get_per_process_memory_fraction()``; ``mem_get_info`` can fail; an
older torch lacks ``get_device_properties().uuid`` and the fraction getter. Each failure costs
only its own figure and is logged once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.cuda

from memexporter.backends.base import ALLOCATOR_NATIVE, CUDA, LogOnce, Reading, device_label, expandable_in, reading_of


def process_group() -> tuple[int, int] | None:
    """``(rank, world size)`` of torch.distributed's default group once it is initialised, else
    None. For launchers that set ``LOCAL_RANK`` but not ``RANK`` (Lightning's own DDP launcher):
    without it every rank would export ``rank="0"``. Never initialises anything."""
    try:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # a half-built group: the environment's answer (or 0) stands
        pass
    return None


def _initialized() -> bool:
    # Untyped in torch's stubs. True once the process itself has initialised CUDA.
    return bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


def _has_context(index: int) -> bool:
    """Whether the process holds a primary context on ``index`` (asks the driver, creates none)."""
    probe = getattr(torch._C, "_cuda_hasPrimaryContext", None)
    try:
        return bool(probe(index)) if probe is not None else False
    except Exception:
        return False


class TorchBackend:
    """Reads ``torch.cuda`` for initialised devices. All sizes are bytes."""

    family = CUDA

    def __init__(self) -> None:
        self._log = LogOnce()
        self._layout_cache: tuple[str, bool] | None = None

    def label(self, index: int) -> str:
        """``cuda:N``, on NVIDIA and ROCm alike (torch's own name for the device)."""
        return device_label(CUDA, index)

    def device_stats(self) -> dict[int, Mapping[str, int]]:
        """``{ordinal: memory_stats(ordinal)}`` for the devices in use.

        One ``memory_stats()`` call per visible device (host-side counters: no context, no sync),
        and the answer is the scrape's copy, so no device is read twice. A device is in use when
        the allocator has reserved memory on it: a rank that trains on ``cuda:3`` reports one
        device, not eight. When the allocator cannot report (a pluggable allocator), a device the
        process holds a context on is listed with ``{}``: its allocator figures are unknown, its
        NVML series still count. ``{}`` when CUDA is not initialised.
        """
        if not _initialized():
            return {}
        self._layout_cache = None  # read again at the next step: a scrape, or every 50 steps
        out: dict[int, Mapping[str, int]] = {}
        for index in range(torch.cuda.device_count()):
            try:
                stats = torch.cuda.memory_stats(index)
            except Exception as exc:
                self._log.warning(
                    "stats",
                    "memexporter: torch.cuda.memory_stats() failed under the %r allocator "
                    "(%s): no allocator series and no cuda used/limit",
                    self.allocator_backend(),
                    exc,
                )
                if _has_context(index):
                    out[index] = {}
                continue
            if stats.get("reserved_bytes.all.peak", 0) > 0:
                out[index] = stats
        return out

    def devices_in_use(self) -> list[int]:
        """Ordinals of the devices in use whose allocator reports memory (what the step tracker follows)."""
        return [index for index, stats in self.device_stats().items() if stats]

    def allocator_backend(self) -> str:
        """``torch.cuda.get_allocator_backend()``: ``native``, ``cudaMallocAsync`` or ``pluggable``.

        ``native`` on a torch without the getter (1.13, for one), where the native allocator was
        the only one.
        """
        getter = getattr(torch.cuda, "get_allocator_backend", None)
        if getter is None:
            return ALLOCATOR_NATIVE
        try:
            return str(getter())
        except AttributeError:  # a torch built without CUDA (torch._C has no _cuda_getAllocatorBackend): no choice
            return ALLOCATOR_NATIVE
        except Exception as exc:
            self._log.warning(
                "backend", "memexporter: torch.cuda.get_allocator_backend() failed (%s); assuming native", exc
            )
            return ALLOCATOR_NATIVE

    def expandable_segments(self) -> bool:
        """Whether the allocator maps expandable segments (``expandable_segments:True``).

        The allocator's own settings where torch answers them
        (``torch._C._accelerator_getAllocatorSettings()``, which also sees
        ``torch.cuda.memory._set_allocator_settings``), else the environment it reads at start-up:
        ``PYTORCH_ALLOC_CONF``, ``PYTORCH_CUDA_ALLOC_CONF``, ``PYTORCH_HIP_ALLOC_CONF``.
        """
        getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
        settings = self._log.read(
            "settings",
            lambda: str(getter()) if getter is not None else None,
            None,
            "memexporter: torch._C._accelerator_getAllocatorSettings() failed (%s); reading the environment",
        )
        if settings is None:
            names = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")
            settings = ",".join(os.environ.get(n, "") for n in names)
        return expandable_in(settings)

    def reading(self, index: int) -> Reading:
        """``used`` (``allocated_bytes.all.current``), its ``.peak`` and the committed bytes, for the
        step tracker, from one ``memory_stats_as_nested_dict`` call.

        Runs on the training thread, so it takes the nested dict that ``memory_stats()`` would
        flatten and sort (~150 keys) and reads the figures it needs. Raises what torch raises (the
        tracker counts it); only devices from ``devices_in_use()`` are asked.
        """
        if not _initialized():
            return Reading(0, 0, 0)
        nested = torch.cuda.memory_stats_as_nested_dict(index)
        return reading_of(nested, self._layout())

    def _layout(self) -> tuple[str, bool]:
        # The backend and the segments setting, read once: both are fixed when the allocator starts
        # (the getter answers the same string every time), and reading() runs on every step.
        if self._layout_cache is None:
            self._layout_cache = (self.allocator_backend(), self.expandable_segments())
        return self._layout_cache

    def uuid(self, index: int) -> str | None:
        """The device UUID as torch spells it: bare hex for a GPU and for a MIG slice alike.

        ``str(get_device_properties(index).uuid)``; the NVML backend matches it to NVML's
        ``GPU-``/``MIG-`` spelling. ``None`` on a torch without device UUIDs (1.13, for one).
        """
        if not _initialized():
            return None
        try:
            raw = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        except Exception as exc:
            self._log.warning("props", "memexporter: torch.cuda.get_device_properties(%d) failed (%s)", index, exc)
            return None
        if raw is None:
            self._log.warning(
                "uuid",
                "memexporter: torch %s reports no device UUID (get_device_properties().uuid); "
                "without it no NVML device can be matched: no memexporter_device_* series",
                torch.__version__,
            )
            return None
        return str(raw) or None

    def total_memory(self, index: int) -> int | None:
        """The CUDA total, ``get_device_properties(index).total_memory`` (``totalGlobalMem``).

        The figure ``set_per_process_memory_fraction`` multiplies; NVML's total is a larger one.
        """
        if not _initialized():
            return None
        try:
            return int(torch.cuda.get_device_properties(index).total_memory)
        except Exception as exc:
            self._log.warning("props", "memexporter: torch.cuda.get_device_properties(%d) failed (%s)", index, exc)
            return None

    def memory_fraction(self, index: int) -> float:
        """The cap set by ``set_per_process_memory_fraction``; 1.0 when unset or unreadable.

        A pluggable allocator raises here ("does not yet support getMemoryFraction"); a torch
        before the getter existed cannot tell. Both read as no cap.
        """
        getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        if getter is None or not _initialized():
            return 1.0
        return self._log.read(
            "fraction",
            lambda: float(getter(index)),
            1.0,
            "memexporter: torch.cuda.get_per_process_memory_fraction() failed (%s); the cuda limit "
            "ignores any memory fraction",
        )

    def mem_get_info(self, index: int) -> tuple[int, int] | None:
        """``(free, total)`` from ``cudaMemGetInfo``, for a device the allocator already uses.

        ``mem_get_info`` creates a context on a device that has none, so it is only a fallback
        for NVML and only called for devices listed by ``device_stats()``. ``None`` if it fails.
        """
        if not _initialized():
            return None
        info = self._log.read(
            "mem_get_info",
            lambda: torch.cuda.mem_get_info(index),
            None,
            "memexporter: torch.cuda.mem_get_info(%d) failed (%s); the cuda limit is unknown without NVML",
            index,
        )
        return None if info is None else (int(info[0]), int(info[1]))

    def host_pinned_stats(self) -> Mapping[str, float]:
        """``torch.cuda.host_memory_stats()``: the pinned (page-locked) host caching allocator's
        counters (``pin_memory()``, ``non_blocking`` copies, DataLoader ``pin_memory=True``), flat
        like ``memory_stats()``. Host-side counters: no context, no sync. ``{}`` before CUDA is
        initialised, and on a torch without the function (it came with torch 2.6)."""
        getter = getattr(torch.cuda, "host_memory_stats", None)
        if getter is None or not _initialized():
            return {}
        return self._log.read(
            "host_stats",
            lambda: dict(getter()),
            {},
            "memexporter: torch.cuda.host_memory_stats() failed (%s): no memexporter_host_pinned_* series",
        )

    def versions(self) -> tuple[str, str]:
        """``(torch.__version__, torch.version.cuda or "")``."""
        return str(torch.__version__), str(torch.version.cuda or "")

    # --- Diagnosis (memexporter/diagnose): allocator snapshots, history, the OOM observer. -----

    def is_initialized(self) -> bool:
        """Whether this process has initialised CUDA (cheap; creates nothing)."""
        return _initialized()

    def memory_snapshot(self) -> dict[str, Any] | None:
        """``torch.cuda.memory._snapshot()``: segments, blocks and, with history on, traces.

        ``None`` when CUDA is not initialised (a snapshot must not create a context).
        """
        if not _initialized():
            return None
        return dict(torch.cuda.memory._snapshot())

    def record_memory_history(self, max_entries: int) -> None:
        """Record allocation stack traces (Python frames) and the last ``max_entries`` events.

        ``_record_memory_history("all", context="all", stacks="python")``: PyTorch documents
        about 2 us per traced allocation and "several KB" per kept event. Python stacks only,
        because C++ frames make every snapshot slow to symbolise. Call after CUDA is initialised:
        the allocator applies it to the devices it has set up.
        """
        torch.cuda.memory._record_memory_history("all", context="all", stacks="python", max_entries=max_entries)

    def attach_oom_observer(self, observer: Callable[[int, int, int, int], None]) -> None:
        """Call ``observer(device, bytes asked, device limit, device free)`` at every CUDA OOM,
        before the exception unwinds (``torch._C._cuda_attach_out_of_memory_observer``). It
        cannot be detached; the observer must check whether it is still wanted."""
        torch._C._cuda_attach_out_of_memory_observer(observer)  # type: ignore[attr-defined]
