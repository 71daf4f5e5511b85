"""A stand-in allocator whose step peak follows the step's input by a known law (issue 41's targets).

``run_standin`` drives the real ``StepTracker`` (its input log, its detail pacing) through a minute of
steps on a fake clock: each step notes its input as the tracked model's forward would, sets
``allocated`` to the law's peak above a fixed persistent level (the forward's end, sampled on detailed
steps), back to the level, and marks the boundary. The CUDA stand-in's lifetime high-water mark
follows ``allocated`` upward, as ``allocated_bytes.all.peak`` does. The true capacity is where the
law's peak meets the limit; the exporter's is the real collector's series.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from memexporter.collectors.scrape import Sources
from memexporter.tracking.steps import DETAIL_EVERY, DETAIL_INTERVAL_S, Detail, StepTracker
from tests.support.fakes import FakeCuda, FakeHost, MiB, one_gpu, registry_for, sources

LEVEL = 512 * MiB
"""What persists between steps: weights, gradients, optimizer state."""

Law = Callable[[float, float], float]
"""``(elements, length) -> the step's excursion above LEVEL`` in bytes."""


def linear_in_batch(elements: float, length: float) -> float:
    """Activations linear in the batch at a fixed length: 256 MiB plus 96 KiB an element."""
    return 256 * MiB + 96 * 1024 * elements


def square_in_length(elements: float, length: float) -> float:
    """At a fixed batch, linear plus square in the length: attention scores (elements x length)."""
    return 256 * MiB + 48 * 1024 * elements + 64 * elements * length


@dataclass
class Standin:
    cuda: FakeCuda
    tracker: StepTracker
    clock: list[float]
    limit: int
    sizes: list[tuple[int, int, int]]  # (elements, length, batch) noted, one per step

    def sources(self, **config: object) -> Sources:
        return sources(self.cuda, host=FakeHost(), steps=self.tracker, **config)

    def registry(self, **config: object) -> CollectorRegistry:
        return registry_for(self.sources(**config))

    def steps_peak_fullness(self) -> list[float]:
        """Each step peak of the trend window over the limit."""
        return [p / self.limit for p in self.tracker.snapshot().devices["cuda:0"].recent_peaks]

    def truth(self, law: Law) -> float:
        """The input (elements, at the largest input's length per element) whose peak meets the limit."""
        e0, l0, _ = max(self.sizes)
        k = e0 / l0
        lo, hi = 1.0, 1e12
        for _ in range(200):
            mid = math.sqrt(lo * hi)
            if LEVEL + law(mid, mid / k) > self.limit:
                hi = mid
            else:
                lo = mid
        return lo


def _set(cuda: FakeCuda, used: int) -> None:
    stats = cuda.stats[0]
    peak = max(stats["allocated_bytes.all.peak"], used)
    cuda.stats[0] = {
        **stats,
        "allocated_bytes.all.current": used,
        "allocated_bytes.all.peak": peak,
        "reserved_bytes.all.current": max(stats["reserved_bytes.all.current"], used),
        "inactive_split_bytes.all.current": 0,
    }


def run_standin(
    law: Law,
    shapes: Callable[[random.Random], tuple[int, int]],
    limit: int,
    seconds: float = 60.0,
    rate: float = 10.0,
    seed: int = 0,
    spike_every: int = 0,
    noise: float = 0.0,
    each_second: Callable[[Standin], None] | None = None,
) -> Standin:
    """``seconds`` of steps at ``rate`` a second; ``shapes(rng) -> (batch, length)``; a spike (an odd step,
    twice the law's excursion) every ``spike_every`` steps; ``noise``: a Gaussian sigma (bytes) on each peak;
    ``each_second(standin)`` after each simulated second's steps (a judge's pace)."""
    cuda, _ = one_gpu(**{"allocated_bytes.all.current": LEVEL, "allocated_bytes.all.peak": LEVEL})
    cuda.fraction = limit / cuda.total
    clock = [0.0]
    tracker = StepTracker(
        cuda,
        FakeHost(),
        200,
        20,
        clock=lambda: clock[0],
        host_peak=lambda: 0,
        wall=lambda: 1.8e9 + clock[0],
        detail=Detail(DETAIL_EVERY, DETAIL_INTERVAL_S),
    )
    rng = random.Random(seed)
    out = Standin(cuda, tracker, clock, limit, [])
    for n in range(int(seconds * rate)):
        batch, length = shapes(rng)
        elements = batch * length
        out.sizes.append((elements, length, batch))
        tracker.inputs.note(elements, length, batch)
        excursion = law(elements, length) * (2 if spike_every and n % spike_every == spike_every - 1 else 1)
        _set(cuda, LEVEL + int(excursion + rng.gauss(0, noise)))
        tracker.sample()  # the forward's end (read on detailed steps only)
        _set(cuda, LEVEL)
        clock[0] += 1 / rate
        tracker.step()
        if each_second is not None and (n + 1) % int(rate) == 0:
            each_second(out)
    return out
