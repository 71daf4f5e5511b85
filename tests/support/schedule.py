"""The order the xdist workers take the tests in: the longest first.

Under ``--dist loadgroup --no-loadscope-reorder`` (scripts/test.sh) pytest-xdist hands out units of
work (one test, or all the tests of an ``xdist_group``) in collection order: two to each worker at
the start, then one each time a worker finishes a test. Collected in file order, the live tests
that spend minutes waiting on Prometheus, Alertmanager or a paced demo started wherever their
file fell. In a fresh-clone run of 2026-11-28 the two-minute stalled-job test started at 9.5
minutes and the torchrun test at 9.6; the suite ended on them with a core idle, and 16 % of the
run's CPU time was idle.

Here the units are sorted by their expected wall time, longest first (LPT scheduling), so the long
waits overlap with the short CPU-bound tests, and the run ends on many short tests. One subtlety:
a worker runs the unit it holds only when it holds the next one too (pytest tears fixtures down
knowing the next test), so the second unit handed to each worker at the start waits for the
first. The first ``workers`` units are the longest; the next ``workers`` are short ones, then the
rest continue longest first.

A unit's expected time is the ``seconds`` of its ``slow`` mark (``@pytest.mark.slow(seconds=300)``:
its wall time in a full run on 2 cores, rounded; for an ``xdist_group``, the whole group's),
``DEFAULT_SLOW_S`` for a slow test without one, and 0 for the rest, which keep their order.
Only the workers sort (each sorts its collection the same way: xdist checks that they agree); a
run without xdist keeps the file order.

Registered by ``tests/conftest.py``.
"""

from __future__ import annotations

import os

import pytest

DEFAULT_SLOW_S = 15.0  # a slow test without seconds: the median of the slow tests' wall times


def expected_seconds(item: pytest.Item) -> float:
    """The item's expected wall time, from its ``slow`` mark (the closest: a function's over its module's)."""
    mark = item.get_closest_marker("slow")
    if mark is None:
        return 0.0
    return float(mark.kwargs.get("seconds", DEFAULT_SLOW_S))


def unit_of(item: pytest.Item) -> str:
    """What xdist hands out as one: the item's ``xdist_group``, else the item itself."""
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    return item.nodeid


def longest_first(items: list[pytest.Item], workers: int) -> list[pytest.Item]:
    """``items`` by unit, longest unit first, with the second round of ``workers`` units short ones."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(unit_of(item), []).append(item)
    length = {name: max(expected_seconds(i) for i in members) for name, members in units.items()}
    order = sorted(units, key=lambda name: -length[name])  # stable: equal lengths keep file order
    # The short units for the second round: the last ones, which are the shortest (and, among the
    # many of length 0, the last in file order: unit tests of a few milliseconds).
    head, tail = order[:workers], order[workers:]
    second = tail[-workers:] if len(tail) > 2 * workers else []
    rest = tail[: len(tail) - len(second)]
    return [item for name in (*head, *second, *rest) for item in units[name]]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if os.environ.get("PYTEST_XDIST_WORKER") and workers > 1:
        items[:] = longest_first(items, workers)
