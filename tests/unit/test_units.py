"""``memexporter.units``: the one formatting of bytes and durations (log lines, inspect, top, the demo, the live page)."""

from __future__ import annotations

import math

import pytest

from memexporter.units import GiB, KiB, MiB, fmt_bytes, fmt_duration, fmt_eta


@pytest.mark.parametrize(
    ("n", "said"),
    [
        (0, "0.0 B"),
        (1023, "1023.0 B"),
        (1024, "1.0 KiB"),
        (8 * MiB, "8.0 MiB"),
        (-3 * GiB // 2, "-1.5 GiB"),
        (5 * 1024 * GiB, "5.0 TiB"),
        (3 * 1024**5, "3072.0 TiB"),
        (math.inf, "inf"),
        (KiB * 1.25, "1.2 KiB"),
    ],
)
def test_bytes_in_binary_units_with_one_decimal(n: float, said: str) -> None:
    assert fmt_bytes(n) == said


@pytest.mark.parametrize(
    ("s", "said"), [(None, "none"), (math.inf, "none"), (0, "0m00s"), (90, "1m30s"), (3 * 3600 + 5 * 60 + 59, "3h05m")]
)
def test_eta_for_a_column(s: float | None, said: str) -> None:
    assert fmt_eta(s) == said


@pytest.mark.parametrize(
    ("s", "said"),
    [(40, "40 s"), (14 * 60 + 59, "14 m"), (2 * 3600 + 10 * 60, "2 h 10 m"), (3 * 86400 + 4 * 3600 + 59, "3 d 4 h")],
)
def test_duration_as_a_person_says_it(s: float, said: str) -> None:
    assert fmt_duration(s) == said
