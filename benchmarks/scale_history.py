"""Hours of history for ``bench_scale.py``, so that range queries over 6 h read 6 h of data at once.

- ``raw_history``: every simulated rank's series (as Prometheus would have stored them: the
  exporter's labels plus ``job`` and ``instance``, and ``up``) at every scrape of the past hours,
  as one TSDB block (``tests/support/tsdb_blocks.py``: promtool's OpenMetrics backfill would take
  half an hour and 80 GB of text at 1,024 ranks).
- ``rule_history``: the recording rules over the same hours, evaluated by Prometheus itself through
  ``promtool tsdb create-blocks-from rules``, one dependency level at a time (a rule that reads
  another rule's series needs that history first).
- ``settle``: Prometheus' own compaction merges the overlapping blocks into one before anything is
  measured (it compacts overlapping blocks a minute after it starts: in the middle of the
  measurement otherwise).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from benchmarks.scale_prometheus import Prom, binary
from tests.support.ranksim import RankSim, Trajectory
from tests.support.tsdb_blocks import Labels, write_block

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _series(sim: RankSim, targets: Sequence[str], job: str) -> Iterator[tuple[Labels, Trajectory]]:
    for r in range(sim.ranks):
        target = (("instance", targets[r]), ("job", job))
        yield (("__name__", "up"), *target), Trajectory(1.0)
        for name, labels, traj in sim.series(r):
            yield (("__name__", name), *target, *labels.items()), traj


def raw_history(
    sim: RankSim, targets: Sequence[str], data: Path, end: float, hours: float, step_s: float, job: str = "memexporter"
) -> dict[str, Any]:
    """Write the ranks' history from ``end - hours`` to ``end`` (Unix s) every ``step_s`` into ``data``."""
    t0 = time.monotonic()
    count = round(hours * 3600 / step_s)
    ts = [int((end - (count - 1 - i) * step_s) * 1000) for i in range(count)]
    block = write_block(data, _series(sim, targets, job), ts)
    (data / "wal").mkdir(exist_ok=True)
    meta = json.loads((block / "meta.json").read_text())
    return {
        "seconds": round(time.monotonic() - t0, 1),
        "series": meta["stats"]["numSeries"],
        "samples": meta["stats"]["numSamples"],
        "bytes": sum(f.stat().st_size for f in block.rglob("*") if f.is_file()),
    }


def recording_levels(rule_files: Sequence[Path]) -> list[dict[str, Any]]:
    """The recording rules of ``rule_files`` as rule files, one per dependency level: level 0 reads
    only exported series, level k reads a series recorded at level k - 1 or below."""
    groups = [g for f in rule_files for g in (yaml.safe_load(f.read_text()) or {}).get("groups", [])]
    recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    level: dict[str, int] = {}
    pending = [r for g in groups for r in g["rules"] if "record" in r]
    while pending:
        progress = []
        for rule in pending:
            deps = {n for n in _NAME.findall(rule["expr"]) if n in recorded and n != rule["record"]}
            if all(d in level for d in deps):
                level[rule["record"]] = max((level[d] + 1 for d in deps), default=0)
                progress.append(rule)
        if not progress:
            raise ValueError(f"recording rules with circular dependencies: {[r['record'] for r in pending]}")
        pending = [r for r in pending if r not in progress]
    out = []
    for k in range(max(level.values(), default=-1) + 1):
        kept = [
            {
                **{key: v for key, v in g.items() if key != "rules"},
                "rules": [r for r in g["rules"] if "record" in r and level[r["record"]] == k],
            }
            for g in groups
        ]
        out.append({"groups": [g for g in kept if g["rules"]]})
    return out


def rule_history(
    workdir: Path, data: Path, rule_files: Sequence[Path], start: float, end: float, eval_s: float
) -> dict[str, Any]:
    """Backfill the recording rules over ``[start, end]`` into ``data`` (see the module doc); the
    blocks overlap the history's: ``settle`` them before measuring."""
    t0 = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    levels = recording_levels(rule_files)
    for k, rules in enumerate(levels):
        path, out = workdir / f"rules-level{k}.yml", workdir / f"rule-blocks-{k}"
        path.write_text(yaml.safe_dump(rules, sort_keys=False))
        with Prom(workdir / f"backfill-{k}", data, []) as prom:
            done = subprocess.run(
                [
                    binary("promtool"),
                    "tsdb",
                    "create-blocks-from",
                    "rules",
                    f"--start={int(start)}",
                    f"--end={int(end)}",
                    f"--url={prom.url}",
                    f"--output-dir={out}",
                    f"--eval-interval={int(eval_s)}s",
                    str(path),
                ],
                capture_output=True,
                text=True,
                timeout=3600,
                check=False,
            )
        if done.returncode != 0:
            raise RuntimeError(f"promtool create-blocks-from rules (level {k}) failed:\n{done.stderr[-3000:]}")
        for block in out.iterdir():
            if (block / "meta.json").exists():
                shutil.move(str(block), data / block.name)
    return {"seconds": round(time.monotonic() - t0, 1), "levels": len(levels)}


def settle(workdir: Path, data: Path, timeout: float = 1800.0) -> dict[str, Any]:
    """Let Prometheus merge overlapping blocks into one (its compaction loop runs once a minute),
    so that no compaction runs while the benchmark measures; the blocks left and the seconds."""
    t0 = time.monotonic()
    with Prom(workdir, data, []) as prom:
        deadline = time.monotonic() + timeout
        while True:
            loaded = int(prom.one(prom.own_metrics(), "prometheus_tsdb_blocks_loaded"))
            if loaded <= 1 or time.monotonic() > deadline:
                return {"blocks": loaded, "seconds": round(time.monotonic() - t0, 1)}
            time.sleep(5.0)
