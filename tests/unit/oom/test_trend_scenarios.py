"""The promtool scenarios stay what the trend estimator computes for their traces.

``alerts/tests/young_job.yml``, ``fatal_oom.yml``, ``runs.yml`` and ``tests/promtool/demo_young.yml``
are generated whole; the leak-rate and ETA series of ``oom_forecast.yml`` and ``healthy.yml`` are
re-derived from their own peak and baseline. A change to ``memexporter/oom/trend.py`` that changes what the exporter
reports shows up here first (then ``python -m tests.support.scenarios`` and promtool tell by how much).
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import pytest

from tests.support import REPO_ROOT
from tests.support.scenarios import HAND_WRITTEN, rederive, renderings
from tests.support.traces import Value, decode, encode


@cache
def rendered() -> dict[Path, str]:
    return renderings()


@pytest.mark.slow(seconds=35)  # every scrape of 8 hours of trace through the estimator: 23 to 52 s in full runs
def test_committed_scenarios_are_current() -> None:
    stale = [
        str(path.relative_to(REPO_ROOT))
        for path, text in rendered().items()
        if path.read_text(encoding="utf-8") != text
    ]
    assert not stale, f"stale: {stale}; run python -m tests.support.scenarios"


def test_a_hand_edited_exporter_series_is_caught() -> None:
    # Not vacuous: write the old, hand-modelled warm-up read (a finite ETA for 40 minutes after the
    # start) into healthy.yml's rank 0 ETA; the re-derivation puts the estimator's back.
    path = next(p for p in HAND_WRITTEN if p.name == "healthy.yml")
    text = path.read_text(encoding="utf-8")
    key = '- series: \'memexporter_oom_eta_seconds{job="memexporter",instance="trainer-0:9400",rank="0",device="cuda:0"}\''
    head, tail = text.split(key, 1)
    values_line = tail.split("\n", 2)[1]
    edited = head + key + tail.replace(values_line, "        values: 'Inf+0x19 6600-15x40 6000x118 Inf+0x779'", 1)
    assert edited != text
    assert rederive(edited) == text


@pytest.mark.parametrize(
    "values",
    [
        [1.0, 2.0, 3.0, 3.0, 3.0, None, None, math.nan, None, 7.5],
        [math.inf, math.inf, math.inf, 2.0, math.nan],
        [100e9, 100e9, 99.5e9, 99e9, None],
        [0.0, 16666666.7, 16666666.7, -3.0, -6.0, -9.0],
    ],
)
def test_encode_decode_round_trip(values: list[Value]) -> None:
    text = encode(values)
    back = decode(text)
    while values and values[-1] is None:
        values = values[:-1]
    assert len(back) == len(values), text
    for got, want in zip(back, values, strict=True):
        if want is None or got is None:
            assert got is want, text
        elif math.isnan(want):
            assert math.isnan(got), text
        else:
            assert got == pytest.approx(want), text
