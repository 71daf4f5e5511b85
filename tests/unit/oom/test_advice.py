"""``oom.advice``: when stranded memory is worth ``expandable_segments:True``, on SYNTHETIC step
windows (the real case, the H200's native trace, is replayed in test_trend_replay.py)."""

from __future__ import annotations

import logging

import pytest

from memexporter.oom import advice
from memexporter.oom.trend import TrendWindow
from memexporter.oom.view import MemoryView

MiB = 1 << 20
LIMIT = 6144 * MiB


def window(stranded_per_step: float, start: float = 700 * MiB, steps: int = 120) -> tuple[TrendWindow, float]:
    """A job leaking 8 MiB a step whose stranded bytes start at ``start`` and grow by ``stranded_per_step``."""
    w = TrendWindow(200, 20)
    for s in range(steps):
        used = 1024 * MiB + 8 * MiB * s
        w.add(s, s * 0.03, used, used + 40 * MiB, used + start + stranded_per_step * s)
    return w, start + stranded_per_step * (steps - 1)


def view(stranded: float, used: float = 2000 * MiB) -> MemoryView:
    return MemoryView(used, LIMIT, used + stranded)


def test_growing_stranded_memory_over_a_tenth_of_the_limit_gets_the_remedy() -> None:
    w, stranded = window(2 * MiB)
    found = advice.advise("cuda:0", w.snapshot(), view(stranded), "native", False)
    assert found == advice.Advice("cuda:0", stranded, LIMIT)
    assert found.describe().endswith("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True would likely recover it")
    assert "(15% of the 6.0 GiB limit)" in found.describe()


@pytest.mark.parametrize(
    ("per_step", "start", "backend", "expandable", "device", "why"),
    [
        (0.0, 900 * MiB, "native", False, "cuda:0", "stranded, but not growing"),
        (2 * MiB, 100 * MiB, "native", False, "cuda:0", "growing, but under 10 % of the limit"),
        (2 * MiB, 700 * MiB, "native", True, "cuda:0", "already expandable"),
        (2 * MiB, 700 * MiB, "cudaMallocAsync", False, "cuda:0", "no segments to strand"),
        (2 * MiB, 700 * MiB, "native", False, "xpu:0", "no such setting on XPU"),
    ],
)
def test_no_remedy_where_it_would_not_help(
    per_step: float, start: float, backend: str, expandable: bool, device: str, why: str
) -> None:
    w, stranded = window(per_step, start)
    assert advice.advise(device, w.snapshot(), view(stranded), backend, expandable) is None, why


def test_said_once_per_device(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(advice, "_said", set())
    found = advice.Advice("cuda:0", 1200 * MiB, LIMIT)
    with caplog.at_level(logging.WARNING, logger="memexporter"):
        for _ in range(3):
            advice.say_once(found)
        advice.say_once(advice.Advice("cuda:1", 900 * MiB, LIMIT))
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2
    assert said[0].startswith("memexporter: cuda:0: 1.2 GiB (20% of the 6.0 GiB limit)")
    assert said[1].startswith("memexporter: cuda:1: 900.0 MiB")
