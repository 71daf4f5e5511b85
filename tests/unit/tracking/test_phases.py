"""Phases (tracking/phases.py, ``memexporter.phase``): per-phase peak arithmetic, and out-of-step phases
kept out of the step peak; the rig of scripted trackers the other phase tests share (conftest.py's
``rig`` makes it active). Nesting, threads, the decorator and the names: test_phases_nesting.py; the
automatic forward/backward/optimizer phases of a real tracked model: test_phases_automatic.py;
``step(count=)`` and the step rhythm: test_steps_rhythm.py. The exposition of a running exporter,
with promtool: tests/integration/test_exposition_promtool.py.

Memory traces are SYNTHETIC (a scripted host whose RSS and high-water mark the test sets)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry

import memexporter
from memexporter.backends.base import HostSample
from memexporter.tracking import boundaries
from memexporter.tracking.phases import OUT_OF_STEP_PHASES, PhaseStats, PhaseTracker
from memexporter.tracking.steps import StepTracker
from tests.support.fakes import FakeCuda, GiB, MiB, registry_for, sources
from tests.unit.tracking.test_steps import ScriptedHost


class Clock:
    """A fake clock: returns ``now``, which the test moves."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Host(ScriptedHost):
    """A scripted host whose lifetime high-water mark follows ``used`` upward (as ``ru_maxrss``
    does) and whose ``sample()`` agrees with ``rss()``."""

    def set(self, used: int) -> None:
        self.used = used
        self.hwm = max(self.hwm, used)

    def reset_peak(self) -> None:
        """What ``torch.cuda.reset_peak_memory_stats()`` does to a CUDA mark."""
        self.hwm = self.used

    def sample(self) -> HostSample:
        return HostSample(self.used, 0, 8 * GiB, 16 * GiB)


@dataclass
class Rig:
    host: Host
    cuda: FakeCuda
    steps: StepTracker
    phases: PhaseTracker
    clock: Clock  # monotonic seconds, for both trackers
    wall: Clock  # unix seconds

    def step(self, dt: float = 1.0) -> float:
        """One step boundary ``dt`` seconds after the last; the step's peak (bytes)."""
        self.clock.now += dt
        self.wall.now += dt
        self.steps.step()
        return peak(self.steps)

    def stats(self, name: str) -> PhaseStats:
        return self.phases.snapshot()[0][name]

    def registry(self) -> CollectorRegistry:
        """The full catalogue over these trackers, as a scrape sees them."""
        return registry_for(
            dataclasses.replace(sources(self.cuda, host=self.host, steps=self.steps), phases=self.phases)
        )


def peak(t: StepTracker, device: str = "cpu") -> float:
    last = t.snapshot().devices[device].last_peak
    assert last is not None
    return last


def make_rig(host: Host | None = None) -> Rig:
    host = host or Host()
    cuda, clock, wall = FakeCuda(), Clock(), Clock(1.8e9)
    t = StepTracker(cuda, host, window=64, warmup_steps=0, clock=clock, host_peak=lambda: host.hwm, wall=wall)
    return Rig(host, cuda, t, PhaseTracker(t, clock=clock, wall=wall), clock, wall)


# --- 1. Peak arithmetic ----------------------------------------------------------------------------


def test_peak_is_the_new_high_water_mark_when_it_rose_in_the_phase(rig: Rig) -> None:
    rig.host.set(150 * MiB)
    rig.host.set(100 * MiB)  # the lifetime mark is 150 MiB before the phase
    with memexporter.phase("data"):
        rig.host.set(300 * MiB)  # never sampled: only the mark knows
        rig.host.set(120 * MiB)
    assert rig.stats("data").peaks == {"cpu": 300 * MiB}


def test_flat_mark_peak_is_the_highest_sample(rig: Rig) -> None:
    rig.host.hwm = 900 * MiB  # an old mark: it says nothing about the phase
    with memexporter.phase("data"):
        rig.host.set(250 * MiB)
        boundaries.sample()  # e.g. the end of a tracked forward
        rig.host.set(120 * MiB)
    assert rig.stats("data").peaks == {"cpu": 250 * MiB}
    with memexporter.phase("data"):  # no sample inside: the boundaries bound it
        rig.host.set(200 * MiB)
        rig.host.set(130 * MiB)
    assert rig.stats("data").peaks == {"cpu": 130 * MiB}


@pytest.mark.parametrize(
    ("start", "inside", "end", "expected"),
    [
        (300, 200, 100, 300),  # the start's boundary
        (100, 200, 350, 350),  # the end's boundary
        (100, 400, 150, 400),  # a sample inside
    ],
)
def test_flat_mark_boundaries_count(rig: Rig, start: int, inside: int, end: int, expected: int) -> None:
    rig.host.hwm = 900 * MiB
    rig.host.set(start * MiB)
    with memexporter.phase("data"):
        rig.host.set(inside * MiB)
        boundaries.sample()
        rig.host.set(end * MiB)
    assert rig.stats("data").peaks["cpu"] == expected * MiB


def test_a_step_boundary_inside_a_phase_is_one_of_its_samples(rig: Rig) -> None:
    rig.host.hwm = 900 * MiB
    with memexporter.phase("train"):
        for used in (120, 180, 140):
            rig.host.set(used * MiB)
            rig.step()
        rig.host.set(110 * MiB)
    assert rig.stats("train").peaks["cpu"] == 180 * MiB


def test_a_peak_reset_inside_the_phase_counts_the_mark_since_the_reset(rig: Rig) -> None:
    rig.host.hwm = 900 * MiB
    rig.host.set(100 * MiB)
    with memexporter.phase("data"):
        rig.host.reset_peak()  # the user's reset: the mark falls to 100 MiB
        rig.host.set(200 * MiB)  # unsampled, but the new mark has it
        rig.host.set(120 * MiB)
    assert rig.host.hwm == 200 * MiB < 900 * MiB
    assert rig.stats("data").peaks["cpu"] == 200 * MiB
    rig.host.hwm = 900 * MiB
    with memexporter.phase("data"):
        rig.host.set(260 * MiB)
        boundaries.sample()  # sampled before the reset: above the mark since the reset
        rig.host.set(100 * MiB)
        rig.host.reset_peak()
        rig.host.set(200 * MiB)
        rig.host.set(120 * MiB)
    assert rig.stats("data").peaks["cpu"] == 260 * MiB


def test_a_device_that_appears_during_the_phase_gets_its_whole_mark(rig: Rig) -> None:
    with memexporter.phase("data"):  # cpu only so far
        rig.cuda.stats[0] = {"allocated_bytes.all.current": 1 * GiB, "allocated_bytes.all.peak": 3 * GiB}
        rig.step()  # a boundary rescans the devices: cuda:0 from now on
    assert set(rig.stats("data").peaks) == {"cpu", "cuda:0"}
    assert rig.stats("data").peaks["cuda:0"] == 3 * GiB


# --- 2. Out-of-step phases stay out of the step peak -----------------------------------------------


def _train_steps(rig: Rig, excursions: list[int], base: int = 100) -> list[float]:
    """Steps that go start -> start + excursion (sampled, as at a forward's end) -> start."""
    peaks = []
    for excursion in excursions:
        rig.host.set((base + excursion) * MiB)
        boundaries.sample()
        rig.host.set(base * MiB)
        peaks.append(rig.step())
    return peaks


@pytest.mark.parametrize("name", sorted(OUT_OF_STEP_PHASES))
def test_an_evaluation_above_everything_leaves_the_step_peaks_alone(rig: Rig, name: str) -> None:
    rig.host.set(100 * MiB)
    rig.step()  # the first boundary starts the window
    before = _train_steps(rig, [30, 40, 50, 50, 50])  # the mark rises on the first three
    assert before == [130 * MiB, 140 * MiB, 150 * MiB, 150 * MiB, 150 * MiB]

    with memexporter.phase(name):  # 64 MiB above every step: a new lifetime mark
        rig.host.set(150 * MiB)
        boundaries.sample()
        rig.host.set((150 + 64) * MiB)
        boundaries.sample()  # sampled too (an evaluation forward's end): still not the step's
        rig.host.set(100 * MiB)
    assert rig.host.hwm == 214 * MiB

    after = _train_steps(rig, [50, 50, 50])
    assert after == before[-3:]  # not 214 MiB: the evaluation's mark is not the steps'
    assert rig.stats(name).peaks == {"cpu": 214 * MiB}  # exact: the mark rose in it
    assert rig.stats(name).completed == 1
    assert (
        rig.registry().get_sample_value("memexporter_phase_peak_bytes", {"rank": "3", "device": "cpu", "phase": name})
        == 214 * MiB
    )


def test_what_the_first_step_kept_is_not_added_to_the_steps_after_an_evaluation(rig: Rig) -> None:
    # The HF Trainer test of issue 40, as its run read the RSS (MiB): the first step grew the process from
    # 719 to 747 and kept it (the optimizer's state), the second stayed flat to the byte (its mark did not
    # rise, so no exact step followed), an evaluation raised the lifetime mark to 813. Every later step
    # then read 775-779 MiB: 747 plus the first step's growth, taken for an excursion. One time in three.
    rig.host.set(719 * MiB)
    rig.step()
    rig.host.set(747 * MiB)
    assert rig.step() == 747 * MiB  # exact: the mark rose
    assert rig.step() == 747 * MiB  # flat: the mark stayed, the estimate starts at 747
    with memexporter.phase("eval"):
        rig.host.set(813 * MiB)
        boundaries.sample()
        rig.host.set(747 * MiB)
    after = [rig.step() for _ in range(3)]
    assert after == [747 * MiB] * 3, [a / MiB for a in after]


def test_a_phase_that_is_part_of_the_step_keeps_its_memory_in_the_step_peak(rig: Rig) -> None:
    rig.host.set(100 * MiB)
    rig.step()
    _train_steps(rig, [30, 40, 50, 50, 50])
    with memexporter.phase("data"):
        rig.host.set((150 + 64) * MiB)
        boundaries.sample()
        rig.host.set(100 * MiB)
    after = _train_steps(rig, [50])
    assert after == [214 * MiB]  # the data loading is the step's: its peak is the step's
    assert rig.stats("data").peaks == {"cpu": 214 * MiB}
