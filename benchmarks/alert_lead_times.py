"""Lead times of the OOM alerts on the promtool scenarios (issue 9), measured with the real promtool.

For each scenario, promtool evaluates the rules at every step and reports which alerts fire; this
prints how long before the OOM the warning and the page arrive, and how long after a leak's start
MemexporterMemoryLeak fires. tests/integration/test_lead_times.py asserts the same figures' bounds.

    python benchmarks/alert_lead_times.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.support import REPO_ROOT
from tests.support.probe import lead_times
from tests.support.rules import DEFAULT_RULES, render_preset


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="memexporter-leadtimes-") as tmp:
        rows = lead_times(REPO_ROOT, {"default": DEFAULT_RULES, "demo": render_preset(Path(tmp), "demo")})
    for what, seconds in rows:
        print(f"{what:50s} {seconds / 60:6.1f} min ({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
