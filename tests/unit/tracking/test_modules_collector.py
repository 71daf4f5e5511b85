"""The modules collector over real tracked models: the four families per rank and module, the
forward deltas, nothing without a tracked model, and scrapes racing a training loop."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from memexporter.collectors.modules import ModulesCollector
from memexporter.collectors.scrape import Scrape
from memexporter.tracking.modules import hook_errors, track
from memexporter.tracking.snapshots import FAMILIES
from tests.support.fakes import sources
from tests.support.models import (
    TiedNet,
    batch,
    train_step,
    unique_param_bytes,
)


def test_collector_exports_four_families_per_rank_and_module() -> None:
    model = TiedNet()
    opt = torch.optim.AdamW(model.parameters())
    track(model, opt, max_modules=3)
    collector = ModulesCollector()
    assert list(collector.collect(Scrape(sources()))) != []
    train_step(model, opt, batch())
    fams = {f.name: f for f in collector.collect(Scrape(sources()))}
    # No parameter is sharded: no unsharded family (it would only repeat the parameter bytes).
    assert set(fams) == set(FAMILIES) - {"memexporter_module_parameter_unsharded_bytes"}
    param = fams["memexporter_module_parameter_bytes"]
    assert {s.labels["rank"] for s in param.samples} == {"3"}
    assert len(param.samples) <= 4
    assert sum(s.value for s in param.samples) == unique_param_bytes(model)


def test_collector_without_tracked_models_yields_nothing() -> None:
    assert list(ModulesCollector(lambda: ()).collect(Scrape(sources()))) == []


def test_forward_deltas_are_exported_when_recorded() -> None:
    """SYNTHETIC allocation counter standing in for torch.cuda (the real one runs in tests/cuda)."""
    counter = iter(range(0, 10**9, 4096))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with track(model, cuda_forward_delta=True, allocated=lambda: next(counter), prefix="d") as handle:
        model(torch.randn(2, 4, requires_grad=True)).sum().backward()
        deltas = handle.forward_deltas()
        assert deltas, "the synthetic counter moved during the forward"
        fams = {f.name: f for f in ModulesCollector().collect(Scrape(sources()))}
        got = {s.labels["module"]: s.value for s in fams["memexporter_module_forward_delta_bytes"].samples}
        assert got == {k: float(v) for k, v in deltas.items()}


@pytest.mark.slow
def test_scrapes_race_training_without_errors() -> None:
    seconds = float(os.environ.get("MEMEXPORTER_STRESS_SECONDS", "8"))  # the suite's share; longer by hand
    torch.manual_seed(0)
    model = TiedNet(False)
    opt = torch.optim.AdamW(model.parameters())
    track(model, opt)
    collector, scrape_src = ModulesCollector(), sources()
    stop = threading.Event()
    failures: list[BaseException] = []
    scrapes = [0, 0]

    def scraper(i: int) -> None:
        try:
            while not stop.is_set():
                names = {f.name for f in collector.collect(Scrape(scrape_src))}
                if names != set(FAMILIES) - {"memexporter_module_parameter_unsharded_bytes"}:
                    raise AssertionError(f"scrape returned {sorted(names)}")
                scrapes[i] += 1
                time.sleep(0)  # back to back, but let the training thread take the GIL
        except BaseException as e:
            failures.append(e)

    threads = [threading.Thread(target=scraper, args=(i,), daemon=True) for i in range(2)]
    errors_before = hook_errors()
    for t in threads:
        t.start()
    steps, deadline, data = 0, time.monotonic() + seconds, batch()
    try:
        while time.monotonic() < deadline:
            train_step(model, opt, data)
            with torch.no_grad():
                model(data[0])
            steps += 1
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not failures, failures
    assert hook_errors() == errors_before
    assert steps > 0 and min(scrapes) > 0
    print(f"stress: {seconds:.0f}s, {steps} steps, {sum(scrapes)} scrapes, no errors")
