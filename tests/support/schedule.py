"""The order the xdist workers take the tests in: the long ones first, and never only waiting ones.

Under ``--dist loadgroup --no-loadscope-reorder`` (scripts/test.sh) pytest-xdist hands out units of
work (one test, or all the tests of an ``xdist_group``) in collection order: one to each worker at
the start, then another whenever a worker has two tests or fewer waiting (a group counts all its
tests). Collected in file order, the live tests that spend minutes waiting on Prometheus,
Alertmanager or a paced demo started wherever their file fell: in a fresh-clone run of 2026-11-28
the two-minute stalled-job test started at 9.5 minutes and the torchrun test at 9.6, the suite
ended on them with a core idle, and 16 % of the run's CPU time was idle. Sorted longest first, the
six longest were all waiting ones: six workers waited together and the cores sat 60 % idle for two
minutes.

So the order is planned. A unit's expected time is the ``seconds`` of its ``slow`` mark
(``@pytest.mark.slow(seconds=300)``: its wall time in a full run on 2 cores, rounded; for an
``xdist_group``, the whole group's), ``DEFAULT_SLOW_S`` for a slow test without one,
``INTEGRATION_S`` for an unmarked integration test and ``QUICK_S`` for the rest. ``waits=True`` on
the mark says it mostly waits (a tenth of a core or so). The plan gives the waiting units
``WAITING_SHARE`` of the workers and the others the rest, each group longest first on its own
workers (LPT scheduling), and hands the units out in the order the plan starts them. One subtlety:
a worker runs the unit it holds only once it holds the next one too (pytest tears fixtures down
knowing the next test), so the second unit each worker gets at the start waits for the first:
those are the quickest units of all.

Only the workers sort (each sorts its collection the same way: xdist checks that they agree); a
run without xdist keeps the file order. Registered by ``tests/conftest.py``.
"""

from __future__ import annotations

import heapq
import os
from dataclasses import dataclass

import pytest

DEFAULT_SLOW_S = 15.0  # a slow test without seconds: about the median of the slow tests' wall times
INTEGRATION_S = 3.0  # an unmarked integration test: a subprocess or a real binary, often torch's import
QUICK_S = 0.1  # an unmarked unit test: they average this
WAITING_SHARE = 0.5  # of the workers, at most this many hold waiting units in the plan


@dataclass(eq=False)  # units compare by identity
class Unit:
    """What xdist hands out as one: a test, or an ``xdist_group``'s tests."""

    name: str
    items: list[pytest.Item]
    seconds: float = 0.0
    waits: bool = False
    start: float = 0.0  # seconds after the run's start, in the plan


def _mark(item: pytest.Item) -> tuple[float, bool]:
    """Expected seconds and whether it mostly waits, from the closest ``slow`` mark."""
    mark = item.get_closest_marker("slow")
    if mark is None:
        return (INTEGRATION_S if item.get_closest_marker("integration") else QUICK_S), False
    return float(mark.kwargs.get("seconds", DEFAULT_SLOW_S)), bool(mark.kwargs.get("waits", False))


def mark_problem(item: pytest.Item) -> str | None:
    """What is wrong with the item's ``slow`` mark, if anything: a typo (``wait=True``) or a bare
    number (``slow(300)``) would plan the test as one of unknown length."""
    mark = item.get_closest_marker("slow")
    if mark is not None and (mark.args or set(mark.kwargs) - {"seconds", "waits"}):
        given = ", ".join([*map(repr, mark.args), *(f"{k}={v!r}" for k, v in mark.kwargs.items())])
        return f"@pytest.mark.slow takes seconds= and waits= only, not slow({given})"
    return None


def _group(item: pytest.Item) -> str | None:
    """The item's xdist group as pytest-xdist 3.8 names it (xdist/remote.py): all its marks' names, sorted, joined."""
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    return "_".join(sorted(names)) or None


def units_of(items: list[pytest.Item]) -> list[Unit]:
    """The items grouped as xdist groups them, in file order; a group is as long as its longest mark says."""
    units: dict[str, Unit] = {}
    for item in items:
        name = _group(item) or item.nodeid
        unit = units.setdefault(name, Unit(name, []))
        unit.items.append(item)
        seconds, waits = _mark(item)
        unit.seconds = max(unit.seconds, seconds)
        unit.waits = unit.waits or waits
    return list(units.values())


def _lpt(units: list[Unit], slots: int) -> None:
    """Start times of ``units`` on ``slots`` workers, longest first, each on the first one free."""
    free = [0.0] * max(slots, 1)
    for unit in sorted(units, key=lambda u: -u.seconds):  # stable: equal lengths keep file order
        unit.start = heapq.heappop(free)
        heapq.heappush(free, unit.start + unit.seconds)


def plan(units: list[Unit], workers: int) -> list[Unit]:
    """``units`` in the order the plan starts them, the second round of ``workers`` the quickest."""
    waiting = [u for u in units if u.waits]
    for_waiting = min(len(waiting), max(1, int(workers * WAITING_SHARE)))
    _lpt(waiting, for_waiting)
    _lpt([u for u in units if not u.waits], workers - for_waiting)
    order = sorted(units, key=lambda u: u.start)
    head, tail = order[:workers], order[workers:]
    quickest = sorted(tail, key=lambda u: u.seconds)[:workers]
    return head + quickest + [u for u in tail if u not in quickest]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """On an xdist worker of a parallel run, the items in the plan's order."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if os.environ.get("PYTEST_XDIST_WORKER") and workers > 1:
        items[:] = [item for unit in plan(units_of(items), workers) for item in unit.items]


@pytest.hookimpl
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test with a mistyped ``slow`` mark fails, naming the mark (on the worker, where a collection
    error would take the worker down without a word)."""
    if problem := mark_problem(item):
        pytest.fail(problem, pytrace=False)
