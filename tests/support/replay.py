"""Replay the H200's per-step allocator traces through the real backend, tracker, collectors and risk judge.

``tests/fixtures/recorded/traces/trace-*.json`` are what ``torch.cuda.memory_stats()`` answered after
every step of a job into a real ``OutOfMemoryError`` on an NVIDIA H200 (torch 2.11), of two kinds
(``h200_traces.py``): jobs that leaked 8 MiB (or 32 MiB) a step under a 6 GiB
``set_per_process_memory_fraction`` (2026-11-27), one trace per allocator backend (native,
``expandable_segments:True``, ``cudaMallocAsync``), no exporter running; and a GPT at variable lengths
whose longest batch died (2026-11-28), with the exporter watching and its readings kept in the trace.

``replay()`` plays one back at the trace's own timestamps (a fake clock): at each row the CUDA
stand-in (``cuda_standins.TorchStandIn``) answers the H200's recorded answer for that backend with
the row's figures swapped in, so ``backends/cuda.py`` reads them as it reads torch; the real
``StepTracker`` marks the boundary (and notes the step's input, where the trace has one); every
``scrape_every`` seconds the real collectors are collected (what ``/metrics`` would say), and every
``CHECK_INTERVAL_S`` the real ``RiskWatch`` judges, its callback running at the next boundary as in a
job. The exporter is configured as the recorded one was (its declared ``max_input_elements``), and
the limit applies from the row the job set it (``Trace.limit_from_step``).

``python -m tests.support.replay`` prints each trace's figures (the GPU check runs it too).
"""

from __future__ import annotations

import copy
import math
import statistics
import sys
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client import CollectorRegistry

from memexporter.backends.cuda import TorchBackend
from memexporter.backends.select import NoDriver
from memexporter.collectors.registry import GuardedCatalogue, catalogue
from memexporter.collectors.scrape import Identity, Sources
from memexporter.config import Config
from memexporter.oom.risk import CHECK_INTERVAL_S, OomRisk, RiskWatch
from memexporter.tracking.steps import DETAIL_EVERY, DETAIL_INTERVAL_S, Detail, StepTracker
from tests.support.cuda_standins import TorchStandIn, load
from tests.support.fakes import FakeHost
from tests.support.h200_traces import RECORDED, Trace, load_trace, trace_names

__all__ = ["Moment", "Replay", "Trace", "live_read", "load_trace", "replay", "summary", "trace_names"]

# The H200's recorded answer each backend's rows are swapped into (same GPU, torch and driver).
BASE = {
    "native": "nvidia-h200_torch2.11.0_native.json",
    "cudaMallocAsync": "nvidia-h200_torch2.11.0_cudamallocasync.json",
}
DEVICE = "cuda:0"


@dataclass(frozen=True)
class Moment:
    """What the exporter's ``/metrics`` said at trace time ``t`` (seconds), for ``cuda:0``: bytes, and
    the ETA in seconds (``math.inf``: not growing)."""

    t: float
    step: int
    eta: float
    used: float
    committed: float
    committed_peak: float
    limit: float
    leak_per_step: float
    recoverable: float  # memexporter_allocator_recoverable_bytes (NaN: no series)
    capacity: float = math.nan  # memexporter_input_capacity_elements (NaN: no series)

    @property
    def fullness(self) -> float:
        return self.committed / self.limit


@dataclass
class Replay:
    """A trace played back: what each scrape said, and when ``on_oom_risk`` ran (trace seconds)."""

    trace: Trace
    moments: list[Moment] = field(default_factory=list)
    fired: list[tuple[float, OomRisk]] = field(default_factory=list)

    def left(self, m: Moment) -> float:
        """The true seconds left at ``m``."""
        return self.trace.oom_at - m.t

    def eta_errors(self, until_before: float = 2.0) -> list[float]:
        """|ETA - true time left| / true time left, from the first finite ETA until ``until_before`` s before the OOM."""
        first = next((i for i, m in enumerate(self.moments) if math.isfinite(m.eta)), None)
        if first is None:
            return []
        span = [m for m in self.moments[first:] if self.left(m) >= until_before]
        return [abs(m.eta - self.left(m)) / self.left(m) for m in span]

    @property
    def first_finite_eta(self) -> Moment | None:
        return next((m for m in self.moments if math.isfinite(m.eta)), None)

    @property
    def lead(self) -> float | None:
        """Seconds between the first ``on_oom_risk`` call and the OOM."""
        return self.trace.oom_at - self.fired[0][0] if self.fired else None

    def at(self, t: float) -> Moment | None:
        """The scrape right after the row at trace time ``t`` (``replay(scrape_at=...)``), or None."""
        return next((m for m in self.moments if m.t == t), None)


INPUT_COLUMNS = ("input_elements", "input_length", "input_batch", "forward_allocated")
"""A variable-length trace's step inputs and its forward's allocated bytes (tests/cuda/record_lengths.py):
noted and sampled as the tracked forward would (the sample read on detailed steps only, as in a job)."""


def live_read(trace: Trace) -> dict[str, Any]:
    """What the exporter watching a lengths trace read before its long batches (``record_lengths.py``):
    ``t`` (trace seconds), ``capacity_elements``, ``bytes_per_element``, ``largest_seen_elements``,
    ``limit_bytes``, ``on_oom_risk_before`` (what its callback was given); empty for a leak trace."""
    got: dict[str, Any] = trace.exporter.get("predicted_before_the_long_batches", {})
    return got


def _stats(base: dict[str, int], row: dict[str, float]) -> dict[str, int]:
    return {**base, **{k: int(v) for k, v in row.items() if k not in ("t", "step", *INPUT_COLUMNS)}}


@contextmanager
def _torch_as_recorded(trace: Trace, mp: pytest.MonkeyPatch) -> Iterator[TorchStandIn]:
    """torch.cuda as the H200 answered, under the trace's memory fraction and allocator settings."""
    answers: dict[str, Any] = copy.deepcopy(load(RECORDED / BASE[trace.backend])["answers"])
    device = answers["devices"]["0"]
    # The fraction that caps the limit at the trace's 6 GiB (set_per_process_memory_fraction).
    device["memory_fraction"] = (trace.limit + 0.5) / device["properties"]["total_memory"]
    standin = TorchStandIn(answers).install(mp)
    mp.setattr(torch._C, "_accelerator_getAllocatorSettings", lambda: trace.alloc_conf, raising=False)
    yield standin


def replay(
    trace: Trace, mp: pytest.MonkeyPatch, scrape_every: float = 0.25, scrape_at: Collection[float] = ()
) -> Replay:
    """Play ``trace`` through the real exporter parts (see the module docstring); scrape every
    ``scrape_every`` trace seconds, and also right after the rows at the times in ``scrape_at``."""
    out = Replay(trace)
    now = [trace.rows[0]["t"]]
    config = Config.resolve({"max_input_elements": trace.exporter.get("declared_max_elements")}, environ={})
    with _torch_as_recorded(trace, mp) as standin:
        device = standin.answers["devices"]["0"]
        base, fraction = dict(device["memory_stats"]), device["memory_fraction"]
        backend = TorchBackend()
        host = FakeHost()
        paced = Detail(DETAIL_EVERY, DETAIL_INTERVAL_S)  # the exporter's pacing of intra-step samples
        tracker = StepTracker(
            backend, host, 200, 20, clock=lambda: now[0], host_peak=lambda: 0, wall=lambda: now[0], detail=paced
        )
        sources = Sources(Identity("0", "0", "1", "replay"), config, backend, NoDriver(), host, tracker)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(GuardedCatalogue(catalogue(), sources))
        watch = RiskWatch(sources, callbacks=lambda: (lambda risk: out.fired.append((now[0], risk)),), start=False)
        next_scrape = next_check = now[0]
        for i, row in enumerate(trace.rows):
            now[0] = row["t"]
            device["memory_fraction"] = fraction if i >= trace.limit_from_step else 1.0
            device["memory_stats"] = _stats(base, row)
            if "input_elements" in row:
                tracker.inputs.note(*(int(row[c]) for c in INPUT_COLUMNS[:3]))
                forward = int(row["forward_allocated"])
                device["memory_stats"] = {**_stats(base, row), "allocated_bytes.all.current": forward}
                tracker.sample()
                device["memory_stats"] = _stats(base, row)
            tracker.step()
            if now[0] >= next_check:
                watch.check()
                next_check += CHECK_INTERVAL_S
            if now[0] >= next_scrape or row is trace.rows[-1] or now[0] in scrape_at:
                out.moments.append(_scrape(registry, now[0], tracker.steps))
                if now[0] >= next_scrape:
                    next_scrape += scrape_every
        watch.stop()
    return out


def _scrape(registry: CollectorRegistry, t: float, step: int) -> Moment:
    def value(name: str) -> float:
        got = registry.get_sample_value(f"memexporter_{name}", {"rank": "0", "device": DEVICE})
        return math.nan if got is None else got

    return Moment(
        t,
        step,
        value("oom_eta_seconds"),
        value("memory_used_bytes"),
        value("memory_committed_bytes"),
        value("memory_committed_peak_bytes"),
        value("memory_limit_bytes"),
        value("leak_bytes_per_step"),
        value("allocator_recoverable_bytes"),
        value("input_capacity_elements"),
    )


def summary(r: Replay) -> str:
    """One line of figures for a replayed trace: the forecast's for a leak trace, else the capacity's."""
    if not r.trace.leaks:
        return _capacity_summary(r)
    errors = r.eta_errors()
    first, last = r.first_finite_eta, r.moments[-1]
    eta = (
        f"ETA error median {statistics.median(errors):.1%}, worst {max(errors):.1%} over {len(errors)} scrapes"
        if errors
        else "no finite ETA before the last 2 s"
    )
    lead = "on_oom_risk never ran" if r.lead is None else f"on_oom_risk {r.lead:.1f} s ahead"
    when = "never" if first is None else f"{r.trace.oom_at - first.t:.1f} s before the OOM (step {first.step})"
    return (
        f"{r.trace.name}: OOM at {r.trace.oom_at:.2f} s; first finite ETA {when}; {eta}; {lead}; "
        f"last step {last.fullness:.1%} full (committed), {last.used / last.limit:.1%} allocated; "
        f"leak {last.leak_per_step / (1 << 20):.2f} MiB/step (true {r.trace.leak_mib}); "
        f"recoverable with expandable segments {_recoverable(r)}"
    )


def _capacity_summary(r: Replay) -> str:
    """The capacity at the moment the live exporter read it (``live_read``), against that reading and
    against the longest input that ran and the one that died."""
    live, ex = live_read(r.trace), r.trace.exporter
    moment = r.at(live["t"]) if live else None
    if moment is None or math.isnan(moment.capacity):
        return f"{r.trace.name}: no capacity at the live exporter's reading (scrape_at=(live_read(trace)['t'],))"
    got, said = moment.capacity, live.get("capacity_elements")
    vs_live = f"the live exporter read {said:,.0f}: {got / said - 1:+.1%}" if said else "the live exporter read none"
    ran, died = ex["longest_that_ran"]["elements"], ex["died_at"]["elements"]
    fired = "on_oom_risk never ran" if not r.fired else f"on_oom_risk at {r.fired[0][0]:.2f} s ({r.fired[0][1].reason})"
    return (
        f"{r.trace.name}: capacity {got:,.0f} elements at {moment.t:.2f} s, before the long batches ({vs_live}); "
        f"truth between {ran:,} and {died:,} (the longest that ran, the one that died): {got / ran - 1:+.1%} against "
        f"the longest that ran; {fired} (live: {', '.join(f'{t} s' for t in ex.get('risk_fired_s', [])) or 'never'})"
    )


def _recoverable(r: Replay) -> str:
    first = next((m for m in r.moments if m.recoverable > 0), None)
    if first is None:
        return "none said" if not math.isnan(r.moments[-1].recoverable) else "n/a"
    return f"{r.moments[-1].recoverable / (1 << 30):.2f} GiB (said {r.trace.oom_at - first.t:.1f} s before the OOM)"


def main(argv: list[str] | None = None) -> int:
    """Replay the committed traces, or the ``trace-*.json`` files (or folders of them) named."""
    names: list[str] = []
    for arg in sys.argv[1:] if argv is None else argv:
        path = Path(arg)
        names += sorted(str(p) for p in path.glob("trace-*.json")) if path.is_dir() else [str(path)]
    for name in names or trace_names():
        trace = load_trace(name)
        live = live_read(trace)
        with pytest.MonkeyPatch.context() as mp:
            print(f"[replay] {summary(replay(trace, mp, scrape_at=(live['t'],) if live else ()))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
