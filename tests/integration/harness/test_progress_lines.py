"""The suite's progress lines (tests/support/progress.py) name the slow-marked tests that take a
while and stay quiet about the quick ones: a run of the test command once printed ~100
"[slow] ... passed in 0.0s" lines (issue 27). Run on a tiny suite: a parametrized quick test and a
long one, all marked slow."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.process import run_tiny_suite
from tests.support.progress import QUIET_S

pytestmark = pytest.mark.integration

SUITE = f"""
import time, pytest

@pytest.mark.slow
@pytest.mark.parametrize("case", ["first", "second", "third"])
def test_quick(case):
    pass

@pytest.mark.slow
def test_takes_a_while():
    time.sleep({QUIET_S} + 1.0)
"""
CONFTEST = """
from tests.support.progress import Progress

def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a long test")
    config.pluginmanager.register(Progress(config), "memexporter-progress")
"""


def test_only_the_tests_that_take_a_while_are_named(tmp_path: Path) -> None:
    out = run_tiny_suite(tmp_path, SUITE, CONFTEST)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "[slow] started test_tiny.py::test_takes_a_while" in text, text
    assert "[slow] passed test_tiny.py::test_takes_a_while in" in text, text
    said = [line for line in text.splitlines() if "test_quick" in line]
    assert said == ["[slow] started test_tiny.py::test_quick[first]"], text
