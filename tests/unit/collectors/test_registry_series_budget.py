"""The series budget per rank (issue 25), measured on the exporter's own exposition.

A GPU rank as a 1,024-rank run has it: the demo's 12-layer transformer tracked with its module
rows, trained a few steps with AdamW (so the forward/backward/optimizer phases exist) and
evaluated once, on ONE SYNTHETIC 80 GB CUDA device (fakes.one_gpu: a ``memory_stats()`` dict
shaped like torch's, no GPU) beside the host. The docs' Scaling page (docs/scaling.md) states these
figures; this test keeps them true.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Iterator

import pytest
import torch
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from memexporter.cli.demo import TinyGPT
from memexporter.collectors.fleet import FLEET_WORLD_SIZE
from memexporter.collectors.registry import GuardedCatalogue, catalogue
from memexporter.collectors.scrape import Sources
from memexporter.tracking import boundaries, phases
from memexporter.tracking.modules import track
from memexporter.tracking.phases import PhaseTracker
from memexporter.tracking.steps import StepTracker
from tests.support import REPO_ROOT
from tests.support.fakes import IDENTITY, one_gpu, sources, with_host

RANKS, DETAIL_RANKS = 1024, 8  # 128 nodes x 8 GPUs; detail_ranks=auto: the first node's
BUDGET = 60  # series per rank on average, by default, at world size >= 64 (issue 25)


@pytest.fixture(scope="module")
def rank_sources() -> Iterator[Sources]:
    """Sources over a tracked, trained 12-layer model; the global hooks undone afterwards."""
    torch.manual_seed(0)
    cuda, nvml = one_gpu()
    host = with_host()
    steps = StepTracker(cuda, host, window=64, warmup_steps=0)
    phase_tracker = PhaseTracker(steps)
    model = TinyGPT(layers=12)
    optimizer = torch.optim.AdamW(model.parameters())
    boundaries.activate(steps, auto_step=True)
    phases.activate(phase_tracker)
    handle = track(model, optimizer)
    try:
        tokens = torch.randint(0, 512, (2, 16))
        for _ in range(3):
            model(tokens).float().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        evaluation = phase_tracker.enter("eval")
        with torch.no_grad():
            model(tokens)
        assert evaluation is not None
        phase_tracker.exit(evaluation)
        yield dataclasses.replace(sources(cuda, nvml, host, steps=steps), phases=phase_tracker)
    finally:
        handle.remove()
        phases.activate(None)
        boundaries.activate(None, auto_step=True)


def series(src: Sources, detail: str) -> Counter[str]:
    """Series per family in the exposition of a rank whose share of the detail is ``detail``."""
    src = dataclasses.replace(src, identity=dataclasses.replace(IDENTITY, detail=detail))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GuardedCatalogue(catalogue(), src))
    text = generate_latest(registry).decode()
    return Counter({f.name: len(f.samples) for f in text_string_to_metric_families(text) if f.samples})


def test_module_rows_and_automatic_phases_only_on_detail_ranks(rank_sources: Sources) -> None:
    full, core = series(rank_sources, "representative"), series(rank_sources, "core")
    assert full == series(rank_sources, "per_rank")
    assert full["memexporter_module_parameter_bytes"] >= 50, "the 12-layer model has its module rows"
    assert not {n for n in core if n.startswith("memexporter_module_")}
    # Everything the alerts read stays on every rank.
    for name in (
        "memexporter_memory_peak_bytes",
        "memexporter_oom_eta_seconds",
        "memexporter_run_info",
        "memexporter_allocator_inactive_split_bytes",
        "memexporter_allocator_fragmentation_ratio",
        "memexporter_last_step_timestamp_seconds",
    ):
        assert core[name] == full[name] > 0, name
    # A core rank does not run the modules collector at all: nothing it reads would be exported.
    assert core["memexporter_collector_success"] == full["memexporter_collector_success"] - 1
    assert core["memexporter_phase_active"] == 1, "eval; forward/backward/optimizer are detail"
    assert core["memexporter_phase_peak_bytes"] == 2, "eval on cuda:0 and cpu; forward/backward/optimizer are detail"


def test_budget_at_1024_ranks(rank_sources: Sources) -> None:
    full, core = series(rank_sources, "representative"), series(rank_sources, "core")
    average = (DETAIL_RANKS * sum(full.values()) + (RANKS - DETAIL_RANKS) * sum(core.values())) / RANKS
    assert average <= BUDGET, f"{average:.1f} series per rank on average at {RANKS} ranks"
    assert RANKS >= FLEET_WORLD_SIZE


def test_the_scaling_page_states_the_measured_budget(rank_sources: Sources) -> None:
    full, core = series(rank_sources, "representative"), series(rank_sources, "core")
    modules = sum(n for name, n in full.items() if name.startswith("memexporter_module_"))
    stated = {
        "core": sum(core.values()),
        "full": sum(full.values()),
        "without_modules": sum(full.values()) - modules,
        "module_rows": full["memexporter_module_parameter_bytes"],
    }
    page = (REPO_ROOT / "docs" / "scaling.md").read_text()
    found = dict(re.findall(r"<!-- series:(\w+) -->(\d+)<!-- -->", page))
    assert {k: int(v) for k, v in found.items()} == stated, "docs/scaling.md's series budget is stale"
