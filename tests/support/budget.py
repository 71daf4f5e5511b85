"""The plan's seconds, checked against the run: a parallel run fails when they drift far apart.

``tests/support/schedule.py`` orders the tests by the ``seconds`` of their ``slow`` marks. A mark
that no longer matches its test (the test grew, or lost its wait) costs the run its order quietly:
the long unit starts late and the run ends on it. So each xdist worker measures the units it ran
(setup to teardown, every item of an ``xdist_group``) and sends them to the controller with its
plan's seconds (``workeroutput``); the controller, at the end of the run:

- takes the machine's pace, the median of measured/planned over the units planned ``TIMED_S`` or
  longer that passed (a slow machine runs every test slower: that is no drift);
- fails the run, naming each unit and the ``seconds=`` that would fit it, when a unit that passed
  took ``FACTOR`` times more or less than its plan at that pace, and at least ``FLOOR_S`` of the
  plan's seconds apart from it (a unit without a ``slow`` mark is planned as schedule.py plans it:
  an unmarked test that takes a minute fails the check);
- says why it checked nothing when fewer than ``MIN_TIMED`` units were timed (a run of a few tests).

Units with a failed or skipped item are left out: their time says nothing of the plan.
``MEMEXPORTER_TEST_PLAN_CHECK=0`` turns the check off (a run under a profiler, say). Registered by
``tests/conftest.py``.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

import pytest

from tests.support.schedule import units_of

TIMED_S = 10.0  # the units whose pace sets the machine's: long enough to be measured well
MIN_TIMED = 5
FACTOR = 3.0
FLOOR_S = 45.0  # a test whose time swings x2 from run to run (a trace replay: 23 s, then 52 s) is no drift
KEY = "memexporter_plan"


@dataclass(frozen=True)
class Timed:
    """One unit of a run: its name, planned and measured seconds, and whether all its items passed."""

    name: str
    planned: float
    measured: float
    passed: bool


def drift(units: list[Timed], factor: float = FACTOR, floor_s: float = FLOOR_S) -> tuple[float | None, list[str]]:
    """The machine's pace and a line per unit whose plan drifted far (the module docstring)."""
    timed = [u.measured / u.planned for u in units if u.passed and u.planned >= TIMED_S]
    if len(timed) < MIN_TIMED:
        return None, []
    pace = statistics.median(timed)
    lines = []
    for u in sorted(units, key=lambda u: -abs(u.measured / pace - u.planned)):
        fit = u.measured / pace  # the unit's seconds in the plan's terms
        if u.passed and abs(fit - u.planned) >= floor_s and not u.planned / factor <= fit <= u.planned * factor:
            lines.append(
                f"{u.name}: planned {u.planned:.0f} s, took {u.measured:.1f} s, {fit:.0f} s at this run's pace "
                f"(x{pace:.2f}): @pytest.mark.slow(seconds={max(1, round(fit))}, ...)"
            )
    return pace, lines


class Budget:
    """Measures on the workers, judges on the controller."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.spent: dict[str, float] = {}
        self.ok: dict[str, bool] = {}
        self.units: list[Timed] = []
        self.plan: dict[str, tuple[str, float]] = {}  # node id -> (unit, planned seconds)

    @pytest.hookimpl
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.plan = {item.nodeid: (u.name, u.seconds) for u in units_of(items) for item in u.items}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.spent[report.nodeid] = self.spent.get(report.nodeid, 0.0) + report.duration
        passed = report.passed or (report.when != "call" and not report.failed and not report.skipped)
        self.ok[report.nodeid] = self.ok.get(report.nodeid, True) and passed

    def measured(self) -> list[dict[str, object]]:
        """This worker's units: the items it ran, summed by unit."""
        by_unit: dict[str, dict[str, object]] = {}
        for nodeid, (unit, planned) in self.plan.items():
            if nodeid not in self.spent:
                continue  # another worker's
            row = by_unit.setdefault(unit, {"name": unit, "planned": planned, "measured": 0.0, "passed": True})
            row["measured"] = float(row["measured"]) + self.spent[nodeid]  # type: ignore[arg-type]
            row["passed"] = bool(row["passed"]) and self.ok[nodeid]
        return list(by_unit.values())

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: object, error: object) -> None:
        for row in getattr(node, "workeroutput", {}).get(KEY, []):
            self.units.append(
                Timed(str(row["name"]), float(row["planned"]), float(row["measured"]), bool(row["passed"]))
            )

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """A worker hands its units to the controller; the controller judges them, and a drifted plan
        fails an otherwise green run."""
        workeroutput = getattr(self.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput[KEY] = self.measured()
            return
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if not self.units or tr is None:
            return
        pace, lines = drift(self.units)
        if pace is None:
            tr.write_line(f"[plan] not checked: {len(self.units)} units ran, fewer than {MIN_TIMED} of them timed")
            return
        tr.write_line(f"[plan] {len(self.units)} units; this machine ran x{pace:.2f} the plan's seconds")
        if lines:
            tr.write_line(f"[plan] FAILED: {len(lines)} units far from their plan (tests/support/budget.py):")
            for line in lines:
                tr.write_line(f"[plan]   {line}")
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    """Register the plugin unless ``MEMEXPORTER_TEST_PLAN_CHECK=0``."""
    if os.environ.get("MEMEXPORTER_TEST_PLAN_CHECK", "1") != "0":
        config.pluginmanager.register(Budget(config), "memexporter-budget")
