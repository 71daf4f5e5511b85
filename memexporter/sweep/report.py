"""The sweep's outputs: the terminal table and progress, ``--json`` and ``--csv``.

``as_json`` is the one description of a sweep; the CSV is its runs, flattened, so the two never
disagree. Bytes are integers in both; the table shows MiB (GiB from 10 GiB up).
"""

from __future__ import annotations

import csv
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from memexporter.sweep.fit import MaxFit, Prediction
from memexporter.sweep.grid import Params, label, plan
from memexporter.sweep.runner import Progress, Run, Sweep
from memexporter.units import GiB, MiB

SPLIT_COLUMNS = (
    ("parameters", "params"),
    ("gradients", "grads"),
    ("optimizer_state", "optim"),
    ("activations", "activ"),
)


def size(n: float | None) -> str:
    """Bytes for the table: MiB with one decimal, GiB with two from 10 GiB up; ``-`` when unknown."""
    if n is None:
        return "-"
    return f"{n / GiB:.2f} GiB" if abs(n) >= 10 * GiB else f"{n / MiB:.1f} MiB"


def seconds(s: float | None) -> str:
    """Seconds for the table: milliseconds below 1 s, else seconds with two decimals; ``-`` when unknown."""
    return "-" if s is None else f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def _int(n: float | None) -> int | None:
    return None if n is None else round(n)


def headroom(run: Run) -> float | None:
    """The run's limit minus its peak, in bytes (negative: over the limit); None when either is unknown."""
    return None if run.limit_bytes is None or run.peak_bytes is None else run.limit_bytes - run.peak_bytes


def outcome(run: Run) -> str:
    """The table's last column."""
    if run.status == "skipped":
        return f"skipped ({label(run.skipped_by or {})} ran out of memory)"
    if run.status == "oom":
        return f"OOM: {run.oom_reason}"
    if run.status == "failed":
        return f"failed: {(run.error or '').splitlines()[0]}"
    return {"ok": "fits", "interrupted": "interrupted"}.get(run.status, run.status)


def _prediction_json(sweep: Sweep, p: Prediction) -> dict[str, Any]:
    line = p.line
    return {
        "params": _typed(sweep, p.others),
        "predicted": p.value,
        "reason": p.reason,
        "fit": None
        if line is None
        else {
            "slope_bytes_per_unit": line.slope,
            "intercept_bytes": line.intercept,
            "points": line.points,
            "max_residual_bytes": line.max_residual,
        },
    }


def _typed(sweep: Sweep, params: Mapping[str, str]) -> dict[str, int | float | str]:
    axes = {a.name: a for a in sweep.axes}
    return {k: axes[k].typed(v) for k, v in params.items()}


def run_json(sweep: Sweep, r: Run) -> dict[str, Any]:
    """One run as ``--json`` writes it: its parameters typed, bytes as integers, times in seconds."""
    return {
        "params": _typed(sweep, r.params),
        "command": r.argv,
        "status": r.status,
        "device": r.device,
        "steps": r.steps,
        "peak_bytes": _int(r.peak_bytes),
        "peak_allocated_bytes": _int(r.peak_allocated_bytes),
        "peak_reserved_bytes": _int(r.peak_reserved_bytes),
        "peak_rss_bytes": _int(r.peak_rss_bytes),
        "baseline_bytes": _int(r.baseline_bytes),
        "split_bytes": None if r.split is None else {k: _int(r.split.get(k)) for k, _ in SPLIT_COLUMNS},
        "step_seconds": r.step_seconds,
        "limit_bytes": _int(r.limit_bytes),
        "headroom_bytes": _int(headroom(r)),
        "fits": r.fits,
        "oom": r.oom,
        "oom_reason": r.oom_reason,
        "skipped": r.skipped,
        "skipped_because": None if r.skipped_by is None else _typed(sweep, r.skipped_by),
        "exit_code": r.exit_code,
        "error": r.error,
        "wall_seconds": r.wall_seconds,
    }


def as_json(sweep: Sweep, mf: MaxFit) -> dict[str, Any]:
    """The whole sweep as ``--json`` writes it (the CSV is its runs): command, grid, runs, the
    configurations not run, and ``max_fit``."""
    first = sweep.axes[0].name
    ran = [r.params for r in sweep.runs]
    top = mf.predicted
    return {
        "command": sweep.command,
        "grid": {a.name: [a.typed(v) for v in a.values] for a in sweep.axes},
        "steps": sweep.steps,
        "limit_bytes": _int(sweep.limit_bytes),
        "limit_source": "--limit-mib"
        if sweep.limit_mib is not None
        else "memexporter_memory_limit_bytes (lowest seen)",
        "interrupted": sweep.interrupted,
        "error": sweep.error,
        "runs": [run_json(sweep, r) for r in sweep.runs],
        "not_run": [_typed(sweep, p) for p in plan(sweep.axes) if p not in ran],
        "max_fit": {
            "measured": None if mf.measured is None else _typed(sweep, mf.measured),
            "predicted": top.value,
            "predicted_params": None if top.value is None else {first: top.value, **_typed(sweep, top.others)},
            "reason": top.reason,
            "fit": _prediction_json(sweep, top)["fit"],
            "series": [_prediction_json(sweep, p) for p in mf.series],
        },
    }


def write_csv(doc: Mapping[str, Any], path: Path) -> None:
    """One row per run: the axes, then every scalar of the JSON run (the split as ``<family>_bytes``)."""
    rows = []
    for run in doc["runs"]:
        row = dict(run["params"])
        for k, v in run.items():
            if k == "split_bytes":
                row.update({f"{f}_bytes": (v or {}).get(f) for f, _ in SPLIT_COLUMNS})
            elif k == "skipped_because":
                row[k] = label({a: str(b) for a, b in v.items()}) if v else None
            elif k == "command":
                row[k] = " ".join(v)
            elif k != "params":
                row[k] = v
        rows.append(row)
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["params"])
        writer.writeheader()
        writer.writerows(rows)


def table(sweep: Sweep, mf: MaxFit) -> str:
    """The runs as an aligned text table, with the limit and the answer below it."""
    names = [a.name for a in sweep.axes]
    cuda = any(r.device not in (None, "cpu") for r in sweep.runs)
    split = any(r.split for r in sweep.runs)
    head = ["#", *names, "peak"] + (["alloc peak"] if cuda else []) + ["baseline"]
    head += [short for _, short in SPLIT_COLUMNS] if split else []
    head += ["step", "headroom", "result"]
    rows = []
    for i, r in enumerate(sweep.runs, 1):
        row = [str(i), *(r.params[n] for n in names), size(r.peak_bytes)]
        row += [size(r.peak_allocated_bytes)] if cuda else []
        row += [size(r.baseline_bytes)]
        row += [size((r.split or {}).get(f)) if r.split else "-" for f, _ in SPLIT_COLUMNS] if split else []
        row += [seconds(r.step_seconds), size(headroom(r)), outcome(r)]
        rows.append(row)
    widths = [max(len(h), *(len(row[c]) for row in rows)) if rows else len(h) for c, h in enumerate(head)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [head, *rows]]
    devices = sorted({r.device for r in sweep.runs if r.device})
    source = "--limit-mib" if sweep.limit_mib is not None else "lowest memexporter_memory_limit_bytes seen"
    lines.append("")
    lines.append(
        f"device {', '.join(devices) or '-'}; limit {size(sweep.limit_bytes)} ({source}); "
        f"peak is the {'CUDA reserved' if cuda else 'RSS'} high-water mark; {sweep.steps} steps per run"
    )
    lines.append(f"largest that fits, measured:  {label(mf.measured) if mf.measured else 'none'}")
    p = mf.predicted
    if p.value is not None and p.line is not None:
        lines.append(
            f"largest that fits, predicted: {sweep.axes[0].name}={p.value:g}{' ' + label(p.others) if p.others else ''} "
            f"(line through {p.line.points} runs: {size(p.line.slope)} per {sweep.axes[0].name} "
            f"+ {size(p.line.intercept)})"
        )
    else:
        lines.append(f"largest that fits, predicted: none ({p.reason})")
    return "\n".join(lines)


class TerminalProgress(Progress):
    """One line per run on stderr; on a terminal the line of the running one counts its steps."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._started = time.monotonic()
        self._shown = ""

    def _line(self, text: str, end: str = "\n") -> None:
        self.stream.write(("\r\033[K" if self.tty else "") + text + end)
        self.stream.flush()

    def start(self, i: int, n: int, params: Params) -> None:
        self._started = time.monotonic()
        self._line(f"[{i + 1}/{n}] {label(params)}: starting", end="" if self.tty else "\n")

    def step(self, i: int, n: int, params: Params, steps: int, target: int) -> None:
        text = f"[{i + 1}/{n}] {label(params)}: step {min(steps, target)}/{target} ({time.monotonic() - self._started:.0f} s)"
        if self.tty and text != self._shown:  # polled 10 times a second: redraw only what changed
            self._shown = text
            self._line(text, end="")

    def done(self, i: int, n: int, run: Run) -> None:
        figures = "" if run.skipped else f"peak {size(run.peak_bytes)}, {seconds(run.step_seconds)}/step, "
        self._line(f"[{i + 1}/{n}] {label(run.params)}: {figures}{outcome(run)}")
