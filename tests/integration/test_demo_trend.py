"""Issue 3's acceptance, measured on the real demo (real torch on CPU) through /metrics:
a leaking demo reports its leak within ±25 % after at most 150 steps with a finite ETA, and a
healthy one reports |leak| < 1 MiB/step with no ETA (or more than a week)."""

from __future__ import annotations

import math
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.demo import SMALL_MODEL, running_demo
from tests.support.ports import free_port
from tests.support.web import get_text

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MiB = 1 << 20
# The leak estimate does not need a big model; a tiny one keeps the test fast on a busy CI box.
# 10 steps/s, a training job's pace: the leak estimate skips the first 20 steps and 5 s and needs
# a 3 s span (trend.py), so a demo at 20 steps/s would show its leak only after ~160 steps.
TINY = (*SMALL_MODEL, "--step-interval", "0.1")
WEEK = 7 * 24 * 3600


def scrape(port: int) -> dict[str, float]:
    body = get_text(f"http://127.0.0.1:{port}/metrics")
    out = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            if s.labels.get("device", "cpu") == "cpu" and "module" not in s.labels:
                out[s.name] = s.value
    return out


def at_step(port: int, steps: int, timeout: float = 300) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = scrape(port)
        if m.get("memexporter_steps_total", 0) >= steps:
            return m
        time.sleep(0.2)
    raise AssertionError(f"demo did not reach {steps} steps in {timeout}s")


def test_leaking_demo_reports_its_leak_within_150_steps() -> None:
    port = free_port()
    with running_demo(port, *TINY, "--leak-mib-per-step", "8", "--no-track"):
        m = at_step(port, 150)
    leak = m["memexporter_leak_bytes_per_step"]
    print(
        f"leak after {m['memexporter_steps_total']:.0f} steps: {leak / MiB:.2f} MiB/step, "
        f"ETA {m['memexporter_oom_eta_seconds']:.0f} s"
    )
    assert abs(leak - 8 * MiB) <= 0.25 * 8 * MiB
    assert math.isfinite(m["memexporter_oom_eta_seconds"])
    assert m["memexporter_leak_rate_bytes_per_second"] > 0


def test_healthy_demo_reports_no_leak() -> None:
    port = free_port()
    with running_demo(port, *TINY, "--eval-every", "25"):
        m = at_step(port, 150)
    leak = m["memexporter_leak_bytes_per_step"]
    eta = m["memexporter_oom_eta_seconds"]
    print(f"healthy demo after {m['memexporter_steps_total']:.0f} steps: leak {leak / MiB:.3f} MiB/step, ETA {eta}")
    assert abs(leak) < MiB
    assert eta == math.inf or eta > WEEK
