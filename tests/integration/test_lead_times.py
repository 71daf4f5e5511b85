"""Issue 9's lead times, measured: promtool evaluates the scenarios at every step and reports when
each alert first fires (tests/support/probe.py). The figures are printed (pytest -s) and recorded;
the bounds are the issue's acceptance criteria."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO_ROOT
from tests.support.probe import lead_times
from tests.support.rules import DEFAULT_RULES, render_preset

pytestmark = pytest.mark.integration

# what -> (at least, at most) seconds
BOUNDS = {
    "young job: warning before the OOM": (20 * 60, None),
    "young job: page before the OOM": (5 * 60, None),
    "young job: MemoryLeak after the leak's start": (0, 30 * 60),
    "3-hour leak: warning before the OOM": (45 * 60, None),
    "3-hour leak: page before the OOM": (5 * 60, None),
    "3-hour leak: MemoryLeak after the leak's start": (0, 30 * 60),
    # Alertmanager's chat route adds its group_wait of 30 s; the live test needs the warning 30 s
    # before the stop, so promtool must show it at least 60 s before.
    "demo (promtool): warning before the stop": (60, None),
}


@pytest.mark.slow(seconds=40)
def test_lead_times(tmp_path: Path, record_property: Any) -> None:
    measured = lead_times(REPO_ROOT, {"default": DEFAULT_RULES, "demo": render_preset(tmp_path, "demo")})
    assert [what for what, _ in measured] == list(BOUNDS)
    for what, seconds in measured:
        print(f"{what:50s} {seconds / 60:6.1f} min ({seconds:.0f} s)")
        record_property(what, round(seconds))
    for what, seconds in measured:
        low, high = BOUNDS[what]
        assert seconds >= low, f"{what}: {seconds:.0f} s, needs >= {low}"
        assert high is None or seconds <= high, f"{what}: {seconds:.0f} s, needs <= {high}"
