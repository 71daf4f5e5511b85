"""The workers' queue (tests/support/schedule.py): the longest tests first, a short one second.

Run on a tiny suite under real pytest-xdist, as scripts/test.sh runs the suite (``--dist loadgroup
--no-loadscope-reorder``): ten quick tests in file order, then two slow ones of different lengths
and an xdist_group whose length is on one member. Each worker writes the order it collected and
the tests it ran. Before this plugin the file order held, so the longest started last: in a
fresh-clone run of 2026-11-28 the suite ended on a two-minute test that had started at 9.5 min.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO_ROOT

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
"""
CONFTEST = """
import os

pytest_plugins = ["tests.support.schedule"]

def pytest_configure(config):
    config.addinivalue_line("markers", "slow(seconds): a long test")

def pytest_collection_finish(session):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(os.environ["SCHEDULE_LOG"] + "." + worker + ".order", "w") as f:
        f.write("\\n".join(item.name for item in session.items))
"""


def run_tiny(tmp_path: Path, *options: str, suite: str = SUITE) -> None:
    """The tiny suite in ``tmp_path`` under pytest with ``options``; it must pass."""
    (tmp_path / "test_tiny.py").write_text(suite, encoding="utf-8")
    (tmp_path / "conftest.py").write_text(CONFTEST, encoding="utf-8")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            *options,
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), "SCHEDULE_LOG": str(tmp_path / "log")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_longest_start_first_and_a_short_test_waits_behind_each(tmp_path: Path) -> None:
    run_tiny(tmp_path, "-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder")
    orders = {p.read_text() for p in tmp_path.glob("log.gw*.order")}
    assert len(orders) == 1, "the workers sorted their collections alike (xdist refuses a run otherwise)"
    # The two longest units (the pair counts as 70 s, its first member's), then the two shortest
    # (the last quick tests in file order), then the rest longest first, equals in file order.
    quick = [f"test_quick[{i}]" for i in range(10)]
    assert orders.pop().splitlines() == [
        "test_longest",
        "test_pair_first",
        "test_pair_second",
        *quick[8:],
        "test_long",
        *quick[:8],
    ]
    first = {p.read_text().splitlines()[0] for p in tmp_path.glob("log.gw*.ran")}
    assert first == {"test_longest", "test_pair_first"}, "each worker starts on one of the two longest"


def test_without_xdist_the_file_order_holds(tmp_path: Path) -> None:
    run_tiny(tmp_path, suite=SUITE.replace('os.environ["PYTEST_XDIST_WORKER"]', '"main"'))
    ran = (tmp_path / "log.main.ran").read_text().splitlines()
    assert ran[:10] == [f"test_quick[{i}]" for i in range(10)] and ran[-1] == "test_pair_second", ran
