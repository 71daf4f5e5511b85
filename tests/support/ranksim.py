"""The rank simulator: the ranks of one training run, each serving memexporter's real exposition.

A ``RankSim`` holds one exposition per kind of rank (``rank_exposition.py`` makes them with the
exporter itself) and renders rank ``r`` from it: the ``rank`` label (and the labels that differ per
rank: local rank, host, GPU UUID and bus id, world size) substituted, and values that move over time
as a ``Trajectory``: the step counter and last-step time advance, used/peak/baseline differ a little
per rank, and a leaking rank's memory grows while its leak rate and OOM ETA say so (values that make
the shipped leak and OOM-forecast rules fire). ``ranksim_server.py`` serves the bodies on one port
per rank; ``series()`` gives the same series and trajectories for a TSDB backfill
(``tsdb_blocks.py``), so the history and the live scrapes join without a seam.

Policies: ``before`` is the exposition as it was before issue 25 (every rank exports everything);
``after`` is today's exporter with torchrun's variables set: at world >= 64 the first node's ranks
(0-7) export the detail set (``detail="representative"``), the others the core set.
"""

from __future__ import annotations

import gzip
import math
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client import utils

from tests.support.rank_exposition import DETAIL_WORLD, LOCAL_WORLD

Policy = Literal["before", "after"]
MiB = 1 << 20
STEP_COUNTERS = frozenset({"memexporter_steps_total", "memexporter_phase_completed_total"})
STEP_TIMES = frozenset({"memexporter_last_step_timestamp_seconds", "memexporter_phase_last_change_timestamp_seconds"})
# cuda:0 series that move with the rank's memory (+1) or against it (-1: free bytes).
FOLLOWS = {
    f"memexporter_{n}": 1
    for n in (
        "memory_used_bytes",
        "memory_committed_bytes",
        "memory_peak_bytes",
        "memory_committed_peak_bytes",
        "memory_baseline_bytes",
        "allocator_allocated_bytes",
        "allocator_active_bytes",
        "allocator_requested_bytes",
        "allocator_reserved_bytes",
        "allocator_peak_allocated_bytes",
        "allocator_peak_reserved_bytes",
        "device_used_bytes",
        "phase_peak_bytes",
    )
}
FOLLOWS["memexporter_device_free_bytes"] = -1
CPU_FOLLOWS = frozenset(
    {
        "memexporter_memory_used_bytes",
        "memexporter_memory_committed_bytes",
        "memexporter_memory_peak_bytes",
        "memexporter_memory_committed_peak_bytes",
        "memexporter_memory_baseline_bytes",
        "memexporter_host_rss_bytes",
    }
)
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Trajectory:
    """A series' value over Unix time ``t``: ``before`` until ``switch``, then ``start + slope *
    (t - switch)``, the time taken in whole ``quantum`` seconds when set (a counter of steps)."""

    before: float
    switch: float = math.inf
    start: float = 0.0
    slope: float = 0.0
    quantum: float = 0.0

    def at(self, t: float) -> float:
        if t < self.switch:
            return self.before
        x = t - self.switch
        return self.start + self.slope * (self.quantum * math.floor(x / self.quantum) if self.quantum else x)

    def constant(self, t0: float, t1: float) -> float | None:
        if t1 < self.switch:
            return self.before
        return self.start if t0 >= self.switch and self.slope == 0 else None


@dataclass
class Template:
    """One kind of rank's exposition, both formats, as lines: a comment (``str``) or a sample
    ``(name, labels, value)``; ``rank`` is the rank it was made as."""

    kind: str
    rank: int
    formats: dict[bool, list[str | tuple[str, dict[str, str], float]]]  # openmetrics? -> lines

    @classmethod
    def parse(cls, kind: str, made: Mapping[str, Any]) -> Template:
        formats: dict[bool, list[str | tuple[str, dict[str, str], float]]] = {}
        for om in (True, False):
            lines: list[str | tuple[str, dict[str, str], float]] = []
            for line in made["openmetrics" if om else "text"].splitlines():
                m = _LINE.match(line)
                lines.append(
                    line
                    if line.startswith("#") or m is None
                    else (m.group(1), dict(_LABEL.findall(m.group(2) or "")), float(m.group(3)))
                )
            formats[om] = lines
        return cls(kind, int(made["rank"]), formats)

    def samples(self) -> Iterator[tuple[str, dict[str, str], float]]:
        yield from (x for x in self.formats[True] if not isinstance(x, str))


@dataclass
class RankSim:
    """``ranks`` ranks of run ``run_id``, with the templates of ``policy``, stepping every
    ``step_seconds`` since ``run_start``. ``leaks`` maps a leaking rank to when its leak began (Unix s)."""

    templates: dict[str, Template]  # kind -> template: "before", or "per_rank"/"representative"/"core"
    ranks: int
    policy: Policy
    run_id: str = "scale-bench"
    step_seconds: float = 1.0
    run_start: float = field(default_factory=lambda: time.time() - 12 * 3600)
    leak_rate: float = 4 * MiB  # bytes/s: 15 % of an 80 GB limit an hour; ETA under 2 h within the hour
    refresh_seconds: float = 15.0
    leaks: dict[int, float] = field(default_factory=dict)
    detail_ranks: int = LOCAL_WORLD
    _compiled: dict[tuple[int, bool], tuple[list[str], list[Trajectory]]] = field(default_factory=dict)
    _bodies: dict[tuple[int, bool, bool], tuple[int, bytes]] = field(default_factory=dict)

    def kind(self, r: int) -> str:
        if self.policy == "before":
            return "before"
        if self.ranks < DETAIL_WORLD:
            return "per_rank"
        return "representative" if r < self.detail_ranks else "core"

    def set_leak(self, which: Literal["all", "none"] | int, start: float | None = None) -> None:
        """Leak on every rank, none, or one rank (others stop), from ``start`` (default now). Safe
        while serving: the caches are replaced, not cleared under a reader."""
        began = time.time() if start is None else start
        self.leaks = (
            {} if which == "none" else {r: began for r in range(self.ranks)} if which == "all" else {int(which): began}
        )
        self._compiled, self._bodies = {}, {}

    def offset(self, r: int) -> float:
        # A permutation of 0..1023 times 256 KiB: every rank a little apart (at most 0.3 % of 80 GB),
        # not in rank order, far below the rank-imbalance alert's 10 %.
        return float((r * 2654435761) % 1024 * 256 * 1024)

    def trajectory(self, name: str, labels: Mapping[str, str], value: float, r: int, tpl: Template) -> Trajectory:
        """How one series of rank ``r`` moves (see the module doc)."""
        step, t0 = self.step_seconds, self.run_start
        if name in STEP_COUNTERS:
            return Trajectory(0.0, t0, 0.0, 1.0 / step, step)
        if name in STEP_TIMES:
            return Trajectory(t0, t0, t0, 1.0, step)
        if name == "memexporter_step_interval_seconds":
            return Trajectory(step)
        device, off, leak = labels.get("device", ""), self.offset(r), self.leaks.get(r)
        if (device == "cpu" and name in CPU_FOLLOWS) or name == "memexporter_host_rss_bytes":
            return Trajectory(value + off / 4)
        if device != "cuda:0":
            return Trajectory(value)
        if name in FOLLOWS:
            v, sign = value + FOLLOWS[name] * off, FOLLOWS[name]
            return Trajectory(v) if leak is None else Trajectory(v, leak, v, sign * self.leak_rate)
        if leak is None:
            return Trajectory(value)
        if name == "memexporter_leak_rate_bytes_per_second":
            return Trajectory(value, leak, self.leak_rate)
        if name == "memexporter_leak_bytes_per_step":
            return Trajectory(value, leak, self.leak_rate * step)
        if name == "memexporter_oom_eta_seconds":
            # The committed peak fills the limit (an exporter's ETA runs to it).
            limit, peak = (_value(tpl, f"memexporter_memory_{k}_bytes", "cuda:0") for k in ("limit", "committed_peak"))
            return Trajectory(value, leak, (limit - peak - off) / self.leak_rate, -1.0)
        return Trajectory(value)

    def relabel(self, labels: Mapping[str, str], r: int, tpl: Template) -> dict[str, str]:
        """The labels of rank ``r``: what names the rank, its node and its GPU, substituted."""
        out = dict(labels)
        swaps = {
            "rank": str(r),
            "local_rank": str(r % LOCAL_WORLD),
            "world_size": str(self.ranks),
            "hostname": f"node-{r // LOCAL_WORLD:03d}",
            "run_id": self.run_id,
        }
        for key, new in swaps.items():
            if key in out:
                out[key] = new
        for key in ("uuid", "gpu_uuid"):
            if key in out and len(out[key]) >= 12:
                out[key] = out[key][:-12] + f"{r:012x}"
        if "pci_bus_id" in out:
            out["pci_bus_id"] = f"00000000:{0x18 + 0x10 * (r % LOCAL_WORLD):02X}:00.0"
        return out

    def series(self, r: int) -> Iterator[tuple[str, dict[str, str], Trajectory]]:
        """Rank ``r``'s series: name, labels (as exported: no job/instance), trajectory."""
        tpl = self.templates[self.kind(r)]
        for name, labels, value in tpl.samples():
            yield name, self.relabel(labels, r, tpl), self.trajectory(name, labels, value, r, tpl)

    def compiled(self, r: int, openmetrics: bool) -> tuple[list[str], list[Trajectory]]:
        """Rank ``r``'s exposition as fixed text around the values that move: ``texts[i]``, the
        value of ``moving[i]``, ``texts[i + 1]``... Built once per rank, format and leak setting."""
        key = (r, openmetrics)
        hit = self._compiled.get(key)
        if hit is not None:
            return hit
        tpl = self.templates[self.kind(r)]
        texts, moving, cur = [], [], []
        for line in tpl.formats[openmetrics]:
            if isinstance(line, str):
                cur.append(line + "\n")
                continue
            name, labels, value = line
            text = ",".join(f'{k}="{v}"' for k, v in self.relabel(labels, r, tpl).items())
            prefix = f"{name}{{{text}}} " if text else f"{name} "
            traj = self.trajectory(name, labels, value, r, tpl)
            if traj.switch == math.inf:  # never moves: part of the text
                cur.append(prefix + fmt(traj.before) + "\n")
                continue
            cur.append(prefix)
            texts.append("".join(cur))
            moving.append(traj)
            cur = ["\n"]
        texts.append("".join(cur))
        self._compiled[key] = (texts, moving)
        return texts, moving

    def body(self, r: int, openmetrics: bool, gzipped: bool, now: float | None = None) -> bytes:
        """Rank ``r``'s ``/metrics`` body at ``now``, rendered at most once per ``refresh_seconds``
        (the values as of the start of that interval)."""
        tick = int((time.time() if now is None else now) // self.refresh_seconds)
        key = (r, openmetrics, gzipped)
        hit = self._bodies.get(key)
        if hit is not None and hit[0] == tick:
            return hit[1]
        texts, moving = self.compiled(r, openmetrics)
        at = tick * self.refresh_seconds
        parts = [texts[0]]
        for traj, text in zip(moving, texts[1:], strict=True):
            parts.append(fmt(traj.at(at)))
            parts.append(text)
        data = "".join(parts).encode()
        data = gzip.compress(data, compresslevel=1) if gzipped else data
        self._bodies[key] = (tick, data)
        return data


def fmt(value: float) -> str:
    """A value as prometheus_client writes it (``floatToGoString``: 5.0, 3.3e+10, +Inf)."""
    return str(utils.floatToGoString(value))  # type: ignore[no-untyped-call]


def _value(tpl: Template, name: str, device: str) -> float:
    return next(v for n, labels, v in tpl.samples() if n == name and labels.get("device") == device)
