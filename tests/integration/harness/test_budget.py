"""The plan's seconds against the run's (tests/support/budget.py): a unit far from its ``slow`` mark
fails a parallel run and is named with the mark that would fit it; a machine slower or faster as a
whole is no drift. The pure judgement on tables, then the plumbing (worker to controller to exit
status) on a tiny suite under real pytest-xdist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.budget import Timed, drift
from tests.support.process import run_tiny_suite

pytestmark = pytest.mark.integration

STEADY = [Timed(f"t{i}", 60.0, 60.0, True) for i in range(5)]


@pytest.mark.parametrize(
    ("units", "pace", "named"),
    [
        (STEADY, 1.0, []),
        ([Timed(u.name, u.planned, u.measured * 2.5, True) for u in STEADY], 2.5, []),  # a slow machine
        ([*STEADY, Timed("grew", 60.0, 300.0, True)], 1.0, ["grew"]),
        ([*STEADY, Timed("shrank", 300.0, 20.0, True)], 1.0, ["shrank"]),
        ([*STEADY, Timed("unmarked", 3.0, 75.0, True)], 1.0, ["unmarked"]),  # planned as integration_s
        ([*STEADY, Timed("near", 3.0, 20.0, True)], 1.0, []),  # x6, but 17 s off: under the floor
        ([*STEADY, Timed("failed", 60.0, 600.0, False)], 1.0, []),  # its time says nothing of the plan
        ([*STEADY[:3], Timed("grew", 60.0, 600.0, True)], None, []),  # 4 timed units: too few to judge
    ],
    ids=["steady", "slow-machine", "grew", "shrank", "unmarked", "under-floor", "failed", "too-few"],
)
def test_drift(units: list[Timed], pace: float | None, named: list[str]) -> None:
    got_pace, lines = drift(units)
    assert got_pace == (pytest.approx(pace) if pace is not None else None)
    assert [line.split(":")[0] for line in lines] == named, lines


SUITE = """
import time, pytest

@pytest.mark.parametrize("i", range(6))
@pytest.mark.slow(seconds=100)
def test_steady(i):
    time.sleep(0.3)

@pytest.mark.slow(seconds=100)
def test_grew():
    time.sleep(0.3 * GROWTH)
"""
CONFTEST = """
pytest_plugins = ["tests.support.schedule", "tests.support.budget"]

def pytest_configure(config):
    config.addinivalue_line("markers", "slow(seconds, waits): a long test")
"""


@pytest.mark.slow(seconds=12)
@pytest.mark.parametrize(("growth", "rc"), [(1, 0), (10, 1)])
def test_a_drifted_unit_fails_the_parallel_run(tmp_path: Path, growth: int, rc: int) -> None:
    result = run_tiny_suite(tmp_path, SUITE.replace("GROWTH", str(growth)), CONFTEST, "-n", "2")
    out = result.stdout + result.stderr
    assert result.returncode == rc, out
    assert "[plan] 7 units" in out, out
    if rc:
        fit = re.search(r"test_tiny.py::test_grew: planned 100 s, .* @pytest.mark.slow\(seconds=(\d+)", out)
        assert fit is not None and 500 <= int(fit[1]) <= 2000, out  # about 10 times the steady tests' 100
        assert "7 passed" in out, out  # every test passed: the plan alone failed the run
    else:
        assert "FAILED" not in out, out
