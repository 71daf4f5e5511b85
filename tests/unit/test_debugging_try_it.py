"""The "Try it" demo of docs/debugging.md (the debug endpoints) runs long enough for what the text asks next
(issue 27: it stopped itself with its simulated OOM 16 s after start, before a user could run
``memexporter inspect``). Its own figures, read from the command as written: steps until the
budget, at the step interval, against the census that names the leak (the leak window)."""

from __future__ import annotations

import re

from memexporter.config import Config
from tests.support import REPO_ROOT

BASELINE_MIB = 400  # what the demo holds before it leaks (its RSS on CPU: torch and the model)


def test_try_it_demo_outlives_the_leak_naming_by_minutes() -> None:
    page = (REPO_ROOT / "docs" / "debugging.md").read_text()
    command = re.search(r"Try it:\s*`(MEMEXPORTER_DEBUG=1 scripts/demo\.sh [^`]+)`", page)
    assert command is not None, "the Try it command of docs/debugging.md moved"
    flags = dict(re.findall(r"--([a-z-]+) ([0-9.]+)", command.group(1)))
    leak, limit, interval = (
        float(flags["leak-mib-per-step"]),
        float(flags["memory-limit-mib"]),
        float(flags["step-interval"]),
    )
    steps_to_oom = (limit - BASELINE_MIB) / leak
    named_by = Config.resolve({}, environ={}).leak_window * interval  # the leak is named within its window
    assert steps_to_oom * interval >= 120, f"the demo stops after {steps_to_oom * interval:.0f} s"
    assert steps_to_oom * interval - named_by >= 60, "less than a minute to run inspect once the leak is named"
