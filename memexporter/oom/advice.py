"""Say what ran out and how to get it back: memory stranded in partly used segments.

Under PyTorch's native caching allocator a tensor is carved out of a segment, and the rest of the
segment can serve only smaller requests. On an NVIDIA H200 a job leaking 8 MiB a step got 20 MiB
segments: 4 MiB of every other one stayed free, and at the OOM 1.2 GiB of its 6 GiB limit (20 %)
was stranded so. With ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` the allocator grows one
mapping per stream instead, and the same job used 99.6 % of its limit before its OOM.

``advise()`` is the judgement, pure: under the native allocator (not already expandable), the
bytes stranded now exceed ``MIN_SHARE`` of the limit and their trend over the leak window keeps
growing (the trend's own gates: ``oom.trend.rates``). The figure is what stands stranded now: the
memory that expandable segments would likely give back. The trend collector exports it
(``memexporter_allocator_recoverable_bytes``), the live page and ``/debug/memory`` show it, and
``say_once()`` logs it once per device and process.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from memexporter.backends.base import ALLOCATOR_NATIVE
from memexporter.oom.trend import TrendPoints, rates
from memexporter.oom.view import MemoryView
from memexporter.units import fmt_bytes

log = logging.getLogger("memexporter")

MIN_SHARE = 0.10
"""Stranded bytes worth a remedy: over 10 % of the limit (the H200 job died with 20 %)."""
REMEDY = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"


@dataclass(frozen=True)
class Advice:
    """``recoverable_bytes`` of ``device`` that ``REMEDY`` would likely give back, against ``limit_bytes``."""

    device: str
    recoverable_bytes: float
    limit_bytes: float

    def describe(self) -> str:
        """One sentence for the log, the live page and ``inspect``."""
        share = self.recoverable_bytes / self.limit_bytes
        return (
            f"{self.device}: {fmt_bytes(self.recoverable_bytes)} ({share:.0%} of the {fmt_bytes(self.limit_bytes)} "
            f"limit) is stranded in partly used segments of the native caching allocator, and growing; "
            f"{REMEDY} would likely recover it"
        )


def applies(device: str, backend: str, expandable: bool) -> bool:
    """Whether the remedy exists here: a CUDA (or ROCm) device under the native allocator, not yet expandable."""
    return device.startswith("cuda") and backend == ALLOCATOR_NATIVE and not expandable


def advise(device: str, points: TrendPoints, view: MemoryView, backend: str, expandable: bool) -> Advice | None:
    """The advice for ``device`` now, or None (see the module docstring)."""
    if not applies(device, backend, expandable) or not view.limit or view.stranded <= MIN_SHARE * view.limit:
        return None
    if not points.committed:
        return None
    stranded = tuple(c - b for c, b in zip(points.committed, points.baselines, strict=True))
    per_step, _ = rates(points, stranded)
    return Advice(device, view.stranded, view.limit) if per_step > 0 else None


_said: set[str] = set()
_lock = threading.Lock()


def say_once(advice: Advice) -> None:
    """Log ``advice`` the first time its device needs it in this process (a warning)."""
    with _lock:
        first = advice.device not in _said
        _said.add(advice.device)
    if first:
        log.warning("memexporter: %s", advice.describe())
