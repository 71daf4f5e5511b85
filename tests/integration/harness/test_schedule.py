"""The workers' queue (tests/support/schedule.py): long tests first, waiting ones on at most half
the workers, and the quickest units second.

Run on a tiny suite under real pytest-xdist, as scripts/test.sh runs the suite (``--dist loadgroup
--no-loadscope-reorder``): ten quick tests in file order, then slow ones of different lengths, an
xdist_group whose length is on one member, and two that mostly wait. Each worker writes the order
it collected and the tests it ran. Before the plugin the file order held, so the longest started
last (in a fresh-clone run of 2026-11-28 the suite ended on a two-minute test that had started at
9.5 min); sorted by length alone, the waiting tests took every worker at the start and the cores
sat 60 % idle for two minutes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.process import run_tiny_suite
from tests.support.schedule import Unit, plan

pytestmark = pytest.mark.integration

SUITE = """
import os, pytest

def _ran(request):
    with open(os.environ["SCHEDULE_LOG"] + "." + os.environ["PYTEST_XDIST_WORKER"] + ".ran", "a") as f:
        f.write(request.node.name + "\\n")

@pytest.mark.parametrize("i", range(10))
def test_quick(request, i):
    _ran(request)

@pytest.mark.slow(seconds=50)
def test_long(request):
    _ran(request)

@pytest.mark.slow(seconds=100)
def test_longest(request):
    _ran(request)

@pytest.mark.xdist_group("pair")
@pytest.mark.slow(seconds=70)
def test_pair_first(request):
    _ran(request)

@pytest.mark.xdist_group("pair")
def test_pair_second(request):
    _ran(request)

@pytest.mark.slow(seconds=300, waits=True)
def test_waits_300(request):
    _ran(request)

@pytest.mark.slow(seconds=200, waits=True)
def test_waits_200(request):
    _ran(request)
"""
CONFTEST = """
import os

pytest_plugins = ["tests.support.schedule"]

def pytest_configure(config):
    config.addinivalue_line("markers", "slow(seconds, waits): a long test")

def pytest_collection_finish(session):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(os.environ["SCHEDULE_LOG"] + "." + worker + ".order", "w") as f:
        f.write("\\n".join(item.name for item in session.items))
"""


def run_tiny(tmp_path: Path, *options: str, suite: str = SUITE, rc: int = 0) -> str:
    """The tiny suite under pytest with ``options``: its output; it must exit ``rc``."""
    result = run_tiny_suite(tmp_path, suite, CONFTEST, *options, env={"SCHEDULE_LOG": str(tmp_path / "log")})
    assert result.returncode == rc, result.stdout + result.stderr
    return result.stdout + result.stderr


def test_a_long_test_and_a_waiting_one_start_first_and_a_quick_one_waits_behind_each(tmp_path: Path) -> None:
    run_tiny(tmp_path, "-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder")
    orders = {p.read_text() for p in tmp_path.glob("log.gw*.order")}
    assert len(orders) == 1, "the workers sorted their collections alike (xdist refuses a run otherwise)"
    # Two workers: one for the waiting tests (the 200 s one starts when the 300 s one ends, in the
    # plan), one for the rest, longest first (the pair counts as 70 s, its first member's mark).
    # The first two units start at once; the next two, queued behind them, are the quickest.
    quick = [f"test_quick[{i}]" for i in range(10)]
    assert orders.pop().splitlines() == [
        "test_longest",
        "test_waits_300",
        *quick[:2],
        "test_pair_first",
        "test_pair_second",
        "test_long",
        *quick[2:],
        "test_waits_200",
    ]
    first = {p.read_text().splitlines()[0] for p in tmp_path.glob("log.gw*.ran")}
    assert first == {"test_longest", "test_waits_300"}, "one worker starts the longest, the other the waiting one"


def test_without_xdist_the_file_order_holds(tmp_path: Path) -> None:
    run_tiny(tmp_path, suite=SUITE.replace('os.environ["PYTEST_XDIST_WORKER"]', '"main"'))
    ran = (tmp_path / "log.main.ran").read_text().splitlines()
    assert ran[:10] == [f"test_quick[{i}]" for i in range(10)] and ran[-1] == "test_waits_200", ran


def test_six_workers_start_three_waiting_units_and_the_three_longest_others() -> None:
    # The suite's shape: live chains that wait for minutes, CPU-bound tests, many quick ones.
    waiting = [Unit(f"wait-{s}", [], float(s), waits=True) for s in (300, 200, 140, 100, 90, 85)]
    busy = [Unit(f"busy-{s}", [], float(s)) for s in (55, 55, 40, 40, 30, 15, 15)]
    quick = [Unit(f"quick-{i}", [], 0.1) for i in range(40)]
    units = [*quick, *busy, *waiting]
    order = [u.name for u in plan(units, workers=6)]
    assert sorted(order[:6]) == ["busy-40", "busy-55", "busy-55", "wait-140", "wait-200", "wait-300"]
    assert order[6:12] == [f"quick-{i}" for i in range(6)], "the second round: the quickest"
    # The next waiting unit enters when the plan's first one ends (140 s), after the busy ones begun by then.
    assert order.index("wait-100") > order.index("busy-15")
    assert sorted(order) == sorted(u.name for u in units), "every unit once"


def test_a_mistyped_slow_mark_fails_its_test_with_the_reason(tmp_path: Path) -> None:
    suite = SUITE.replace("@pytest.mark.slow(seconds=50)", "@pytest.mark.slow(secs=50)")
    out = run_tiny(tmp_path, "-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder", suite=suite, rc=1)
    assert "ERROR test_tiny.py::test_long" in out and "1 error" in out, out
    assert "@pytest.mark.slow takes seconds= and waits= only, not slow(secs=50)" in out, out
