"""Alerts that fire from the first evaluation, for ``bench_scale.py``'s leak scenarios.

The shipped alerts hold for 10 to 30 minutes before they fire. Prometheus restores that progress
after a restart from its ``ALERTS_FOR_STATE`` series (value: when the alert became active; looked
up over ``--rules.alert.for-outage-tolerance``, 1 h), so an alert that had been pending longer than
its ``for`` fires at the first evaluation after the restore (``rules/manager.go RestoreForState``).

``restore_as_firing`` gives the benchmark's Prometheus that history: a probe Prometheus (over hard
links to the same blocks, so its own WAL stays out) evaluates the rules on the history's last
minutes and lists the alerts that are active; their ``ALERTS_FOR_STATE``, active since long before
the history ends, is written over the history's last hour as one more block.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.scale_prometheus import Prom
from tests.support.ranksim import Trajectory
from tests.support.tsdb_blocks import write_block


def restore_as_firing(
    workdir: Path, data: Path, rule_files: Sequence[Path], end: float, eval_s: float, rounds: int = 3
) -> dict[str, Any]:
    """Probe the active alerts at the history's end (``end``, Unix s; it must be under 5 minutes
    old: the lookback) and write their ``ALERTS_FOR_STATE``; returns how many and how long it took."""
    t0 = time.monotonic()
    probe_data = workdir / "probe-data"
    shutil.copytree(data, probe_data, copy_function=os.link)
    try:
        with Prom(workdir / "probe", probe_data, [], rule_files, eval_s) as prom:
            # Every group evaluated a few times: alerts that read another group's series see them.
            deadline = time.monotonic() + rounds * eval_s + 60
            seen: dict[str, set[str]] = {}
            while time.monotonic() < deadline and (not seen or min(len(v) for v in seen.values()) < rounds):
                for group, (at, _) in prom.rule_groups().items():
                    seen.setdefault(group, set()).add(at)
                time.sleep(1.0)
            alerts = prom.api("alerts")["alerts"]
    finally:
        shutil.rmtree(probe_data, ignore_errors=True)
    if alerts:
        count = int(3600 / eval_s) - 1
        ts = [int((end - (count - 1 - i) * eval_s) * 1000) for i in range(count)]
        since = Trajectory(end - 3 * 3600)  # pending for 3 h: longer than any alert's for
        write_block(
            data, [((("__name__", "ALERTS_FOR_STATE"), *sorted(a["labels"].items())), since) for a in alerts], ts
        )
    return {"alerts": len(alerts), "seconds": round(time.monotonic() - t0, 1)}
