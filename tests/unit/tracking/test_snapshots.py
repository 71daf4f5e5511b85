"""``fold()``, pure: hand-written snapshots folded to ``max_modules`` rows (no torch involved)."""

from __future__ import annotations

import pytest

from memexporter.tracking.snapshots import Layout, Snapshot, fold


def snapshot(parents: tuple[int, ...], values: list[int], max_modules: int) -> Snapshot:
    names = tuple(f"m{i}" for i in range(len(parents)))
    v = tuple(values)
    zeros = (0,) * len(values)
    return Snapshot(Layout(names, parents), max_modules, v, zeros, v, zeros)


@pytest.mark.parametrize(
    ("parents", "values", "max_modules", "expected"),
    [
        # root -> a(1) -> a.x(5); root -> b(2). Cap 1: the smallest leaf (b) folds first, then a.x.
        ((-1, 0, 1, 0), [0, 1, 5, 2], 1, {"m0": 2, "m1": 6}),
        ((-1, 0, 1, 0), [0, 1, 5, 2], 2, {"m0": 2, "m1": 1, "m2": 5}),
        ((-1, 0, 1, 0), [0, 1, 5, 2], 3, {"m0": 0, "m1": 1, "m2": 5, "m3": 2}),
        # zero rows are left out, the root never is
        ((-1, 0, 0), [0, 0, 3], 5, {"m0": 0, "m2": 3}),
        ((-1,), [7], 1, {"m0": 7}),
    ],
)
def test_fold(parents: tuple[int, ...], values: list[int], max_modules: int, expected: dict[str, int]) -> None:
    rows = fold(snapshot(parents, values, max_modules))
    assert {name: v[0] for name, v in rows} == expected
    assert all(v[0] == v[2] for _, v in rows)  # columns fold together
