"""Which census groups grow steadily: table-driven cases of the pure growth analysis."""

from __future__ import annotations

import pytest

from memexporter.diagnose.growth import MIN_RISES, Point, find_growth, median_slope

KEY = ("cpu", "float32", (1, 2097152), "other")
OTHER = ("cpu", "float32", (8, 64), "other")
MiB = 1 << 20


def history(counts: list[int | None], every: int = 50, nbytes: int = 8 * MiB, complete: bool = True) -> list[Point]:
    """Censuses every ``every`` steps; ``None``: the group is not in that census."""
    out = []
    for i, c in enumerate(counts):
        groups = {OTHER: (1, 2048)}
        if c is not None:
            groups[KEY] = (c, c * nbytes)
        out.append(Point((i + 1) * every, groups, complete))
    return out


@pytest.mark.parametrize(
    ("counts", "confirmed", "per_step"),
    [
        ([49, 99, 149, 199, 249], False, 1.0),  # a tensor a step: exact
        ([49, 99, 149], True, 1.0),  # two rises suffice once the leak estimate is positive
        ([49, 99, 149], False, None),  # ... but not before: a healthy run needs four in a row
        ([1, 1, 1, 1, 1, 1], False, None),  # flat
        ([1, 1, 1, 26, 51, 76, 101], False, 0.5),  # a leak that starts late; flat censuses ignored
        ([0, 5, 0, 5, 0, 5, 0, 5], True, None),  # a queue that fills and drains
        ([10, 20, 30, 5, 10, 15], True, 0.1),  # a fall (cache cleared) starts the count again
        ([10, 20, 30, 40, 5], True, None),  # ... and a fall at the end ends the growth
        ([1, 1, 1, 1, 40, 40, 40], True, None),  # a one-time jump (state created) is no leak
        ([10, 20, 20, 20, 20, 30, 30], True, None),  # rises in fewer than half the intervals
    ],
)
def test_growth_cases(counts: list[int], confirmed: bool, per_step: float | None) -> None:
    found = find_growth(history(counts), frozenset({"cpu"}) if confirmed else frozenset())
    if per_step is None:
        assert found == []
        return
    assert [g.key for g in found] == [KEY]
    assert found[0].count_per_step == pytest.approx(per_step)
    assert found[0].bytes_per_step == pytest.approx(per_step * 8 * MiB)
    assert found[0].count == counts[-1]


def test_rates_are_robust_to_one_odd_census() -> None:
    counts = [50, 100, 150, 160, 250, 300]  # one census came a few steps late
    (g,) = find_growth(history(counts), frozenset({"cpu"}))
    assert g.count_per_step == pytest.approx(1.0)


def test_a_group_missing_from_a_complete_census_had_none() -> None:
    found = find_growth(history([None, 50, 100, 150, 200]))
    assert found and found[0].since_step == 50 and found[0].censuses == 5


def test_a_group_missing_from_a_truncated_census_is_unknown_not_zero() -> None:
    # Truncated censuses (more groups than kept): the gap is skipped, not read as a fall to 0.
    points = history([50, None, 150, None, 250, 300], complete=False)
    found = find_growth(points, frozenset({"cpu"}))
    assert [g.count_per_step for g in found] == [pytest.approx(1.0)]


def test_only_the_confirmed_device_gets_the_shortcut() -> None:
    points = history([49, 99, 149])
    assert find_growth(points, frozenset({"cuda:0"})) == []
    assert MIN_RISES > 2


def test_fastest_first() -> None:
    points = [Point(s, {KEY: (s, s * 100), OTHER: (s, s * 1000)}) for s in (10, 20, 30, 40, 50)]
    assert [g.key for g in find_growth(points)] == [OTHER, KEY]


def test_median_slope() -> None:
    assert median_slope([0, 1, 2, 3, 4], [0, 2, 4, 6, 100]) == 2.0  # one outlier of five
    assert median_slope([1, 1], [0, 5]) == 0.0
