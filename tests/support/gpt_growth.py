"""The demo's GPT on CPU at varying lengths: the exporter's predicted peak growth to twice the longest length.

Run as ``python -m tests.support.gpt_growth`` (tests/integration/test_input_capacity_cpu.py runs it in a
fresh interpreter whose glibc maps large blocks: see there). It trains ``memexporter.cli.demo.TinyGPT``
(batch 8) with the exporter started (no HTTP: see ``main``) and the model tracked, the lengths lengthening from ``LONGEST`` / 4
to ``LONGEST`` over ``RAMP`` steps (a length warm-up) and then drawn at random in that range; reads the
capacity's fit (``collectors.inputs.capacities``: what the exporter would publish) and predicts the
step peak's growth from ``LONGEST`` to ``2 * LONGEST``; then runs one step at each and reads the
exporter's own step peak (``memexporter_memory_peak_bytes{device="cpu"}``) after each. Prints one JSON
line: ``predicted``, ``measured`` (bytes) and the fit.
"""

from __future__ import annotations

import json
import random

import torch
from torch import nn

import memexporter
from memexporter.cli.demo import TinyGPT
from memexporter.collectors.inputs import capacities
from memexporter.collectors.scrape import Scrape

BATCH, LONGEST, RAMP, RANDOM = 8, 128, 24, 16


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)  # one arena: the run's own memory, not the thread pool's
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # http=False: no publisher thread in this process. On the host its own memory is in the RSS the step
    # peak reads, and its first module-row renderings raised it ~5 MiB once, mid-ramp, which the fit over
    # a length ramp reads as growth with the input (+24 % with it on). A GPU's peak never sees it.
    exp = memexporter.start(model=model, optimizer=opt, http=False, log_level="error")
    loss_fn = nn.CrossEntropyLoss()

    def step(length: int) -> None:
        tokens = torch.randint(0, 512, (BATCH, length + 1))
        loss = loss_fn(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def peak() -> float:
        got = exp.registry.get_sample_value("memexporter_memory_peak_bytes", {"rank": "0", "device": "cpu"})
        assert got is not None
        return got

    try:
        rng, short = random.Random(0), LONGEST // 4
        for i in range(RAMP):
            step(short + (LONGEST - short) * i // (RAMP - 1))
        for _ in range(RANDOM):
            step(rng.randint(short, LONGEST))
        cpu = capacities(Scrape(exp.sources))["cpu"]
        fit = cpu.fit
        predicted = fit.predict(2 * BATCH * LONGEST, 2 * LONGEST) - fit.predict(BATCH * LONGEST, LONGEST)
        step(LONGEST)
        before = peak()
        step(2 * LONGEST)
        measured = peak() - before
        print(json.dumps({"predicted": predicted, "measured": measured, "fit": vars(fit)}), flush=True)
    finally:
        memexporter.stop()


if __name__ == "__main__":
    main()
