"""SYNTHETIC training-memory traces, scraped through the real trend estimator, as promtool input series.

A ``Process`` is one lifetime of one rank: its steps (seconds since the trace start, baseline bytes,
peak bytes) and its limit. ``scrape()`` plays the exporter: at every scrape it feeds the steps
finished so far to ``memexporter.oom.trend.TrendWindow`` and reads ``estimate()``, exactly as the trend
collector does, so the leak rate and the ETA in a scenario are what the exporter would report for
that trace, warm-up gate, noise gate and sustained-growth gate included. After a process ends, its
series go stale; ``up`` reads 0 while the target is still listed (a static config), or goes stale
too (a pod that is gone). The next process with the same labels is a restart. A process that ``ended``
(issue 35) has a helper that outlives it by ``grace`` seconds: its last figures stay, up 1, with
``memexporter_job_end_info`` saying how it ended; then its series go stale as above.

``series()`` writes promtool's expanding notation (``a+bxN``, ``_xN``, ``stale``) compactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from memexporter.oom.trend import TrendWindow, estimate

Step = tuple[float, ...]  # seconds since the trace start, baseline bytes, peak bytes[, committed bytes]
Value = float | None  # None: no sample (a blank), math.nan: the stale marker


@dataclass(frozen=True)
class Process:
    """One process lifetime. ``labels``: job, instance, rank, device, and any target labels (say
    ``namespace``, or a relabelled ``run_id``). ``gone``: the target leaves service discovery when
    the process ends (``up`` goes stale instead of reading 0). ``run_id``: the exporter's
    ``memexporter_run_info`` (``exported_run_id`` when the target sets its own ``run_id``); empty:
    an exporter from before run_info."""

    labels: dict[str, str]
    limit: float
    steps: Sequence[Step]
    gone: bool = False
    warmup_steps: int = 20
    window: int = 200
    failed: frozenset[int] = frozenset()  # scrapes (by index) that fail: stale markers, up 0
    missing: frozenset[int] = frozenset()  # scrapes without the exporter's series (a collector raised), up 1
    run_id: str = ""
    run_id_source: str = "memexporter"
    build_info: bool = False  # memexporter_build_info, the one info series of an exporter before run_info
    used: bool = False  # memexporter_memory_used_bytes, scraped mid-step: halfway from baseline to peak
    ended: dict[str, str] | None = None  # the helper's memexporter_job_end_info labels (cause, exit_code, signal)
    grace: float = 65.0  # seconds the helper serves after the end
    committed: bool = False  # memexporter_memory_committed_peak_bytes: from each step's 4th figure

    @property
    def end(self) -> float:
        return self.steps[-1][0] if self.steps else 0.0


def steps(
    n: int,
    step_seconds: float,
    baseline: Callable[[int], float],
    peak: Callable[[int, float], float],
    start: float = 0.0,
) -> list[Step]:
    """``n`` steps, one every ``step_seconds`` from ``start``: ``peak(i, baseline(i))`` bytes."""
    return [(start + (i + 1) * step_seconds, baseline(i), peak(i, baseline(i))) for i in range(n)]


def jitter(seed: int, amplitude: float) -> Callable[[int], float]:
    """A fixed pseudo-random offset per step in [-amplitude, amplitude] (batch shapes vary): a hash,
    so traces stay identical across numpy versions."""
    return lambda i: amplitude * (((i * 2654435761 + seed * 97) % 1000) / 500.0 - 1.0)


@dataclass
class Scraped:
    """Per-scrape values of every series, keyed by the series text ``name{labels}``."""

    interval: float
    count: int
    values: dict[str, list[Value]] = field(default_factory=dict)

    def put(self, name: str, labels: dict[str, str], k: int, value: Value) -> None:
        key = name + "{" + ",".join(f'{n}="{v}"' for n, v in labels.items()) + "}"
        self.values.setdefault(key, [None] * self.count)[k] = value


def scrape(processes: Iterable[Process], interval: float, duration: float) -> Scraped:
    """Every exporter series (and ``up``) at each scrape ``k * interval``, ``k`` = 0 .. duration / interval."""
    out = Scraped(interval, round(duration / interval) + 1)
    by_target: dict[tuple[str, ...], list[Process]] = {}
    for p in processes:
        by_target.setdefault(tuple(p.labels.values()), []).append(p)
    for lifetimes in by_target.values():
        for p in lifetimes:
            _scrape_process(out, p, [q for q in lifetimes if q.steps and q.steps[0][0] > p.end])
    return out


def _scrape_process(out: Scraped, p: Process, later: list[Process]) -> None:
    labels, rank_labels = p.labels, {k: v for k, v in p.labels.items() if k != "device"}
    target = {k: v for k, v in p.labels.items() if k not in ("rank", "device")}
    # A target label run_id wins: Prometheus renames the exporter's label exported_run_id.
    info = {
        **rank_labels,
        ("exported_run_id" if "run_id" in rank_labels else "run_id"): p.run_id,
        "run_id_source": p.run_id_source,
        "detail": "per_rank",
    }
    build = {**rank_labels, "version": "0.9.0", "torch_version": "2.4.0", "cuda_version": "12.4"}
    window, done = TrendWindow(p.window, p.warmup_steps), 0
    start = p.steps[0][0] - p.steps[0][0] % out.interval if p.steps else 0.0
    restart = min((q.steps[0][0] for q in later), default=math.inf)
    ended = {**rank_labels, **{k: v for k, v in (p.ended or {}).items() if v}}  # Prometheus drops empty labels
    for k in range(out.count):
        t = k * out.interval
        if t < start or t >= restart:
            continue
        serving = p.ended is not None and t <= p.end + p.grace + 1e-9  # the helper's grace period
        if serving and t > p.end + 1e-9:
            out.put("memexporter_job_end_info", ended, k, 1.0)
        if t > p.end + 1e-9 and not serving:
            if p.ended is not None and done >= 0:
                out.put("memexporter_job_end_info", ended, k, math.nan)
            if done >= 0:  # the first scrape after the process ended: stale markers
                for name in _GAUGES:
                    out.put(name, labels, k, math.nan)
                out.put("memexporter_steps_total", rank_labels, k, math.nan)
                if p.run_id:
                    out.put("memexporter_run_info", info, k, math.nan)
                if p.used:
                    out.put("memexporter_memory_used_bytes", labels, k, math.nan)
                if p.committed:
                    out.put("memexporter_memory_committed_peak_bytes", labels, k, math.nan)
                if p.build_info:
                    out.put("memexporter_build_info", build, k, math.nan)
                done = -1
            out.put("up", target, k, math.nan if p.gone else 0.0)
            continue
        while done < len(p.steps) and p.steps[done][0] <= t + 1e-9:
            when, base, peak, *held = p.steps[done]
            done += 1
            window.add(done, when, base, peak, held[0] if held else None)
        if k in p.failed or k in p.missing:  # a failed scrape, or series gone from it: stale markers
            for name in _GAUGES + (("memexporter_memory_committed_peak_bytes",) if p.committed else ()):
                out.put(name, labels, k, math.nan if done else None)
            out.put("memexporter_steps_total", rank_labels, k, math.nan)
            if p.run_id:  # a failed scrape loses it too; a failing trend collector does not
                out.put("memexporter_run_info", info, k, math.nan if k in p.failed else 1.0)
            out.put("up", target, k, 0.0 if k in p.failed else 1.0)
            continue
        est = estimate(window.snapshot(), p.limit)
        values = {
            "memexporter_memory_limit_bytes": p.limit,
            "memexporter_memory_peak_bytes": est.peak_bytes,
            "memexporter_memory_baseline_bytes": est.baseline_bytes,
            "memexporter_leak_rate_bytes_per_second": est.leak_bytes_per_second,
            "memexporter_leak_bytes_per_step": est.leak_bytes_per_step,
            "memexporter_oom_eta_seconds": est.oom_eta_seconds,
        }
        if p.used:
            values["memexporter_memory_used_bytes"] = (est.baseline_bytes + est.peak_bytes) / 2
        if p.committed:
            values["memexporter_memory_committed_peak_bytes"] = est.committed_peak_bytes
        for name, value in values.items():
            out.put(name, labels, k, value if done else None)
        out.put("memexporter_steps_total", rank_labels, k, float(done))
        if p.build_info:
            out.put("memexporter_build_info", build, k, 1.0)
        if p.run_id:
            out.put("memexporter_run_info", info, k, 1.0)
        out.put("up", target, k, 1.0)


_GAUGES = (
    "memexporter_memory_limit_bytes",
    "memexporter_memory_peak_bytes",
    "memexporter_memory_baseline_bytes",
    "memexporter_leak_rate_bytes_per_second",
    "memexporter_leak_bytes_per_step",
    "memexporter_oom_eta_seconds",
)


def as_written(v: float) -> float:
    """``v`` as promtool reads it back from ``encode``'s text (numbers are written to 0.1)."""
    return float(_number(v))


def _number(v: float) -> str:
    if math.isinf(v):
        return "Inf" if v > 0 else "-Inf"
    r = round(v, 1)
    return str(int(r)) if r == int(r) else repr(r)


def encode(values: Sequence[Value]) -> str:
    """promtool's notation, runs folded: ``5 5 5`` -> ``5x2``, ``1 2 3`` -> ``1+1x2``, blanks ``_xN``."""
    toks: list[str] = []
    i, n = 0, len(values)
    while n and values[n - 1] is None:
        n -= 1  # trailing blanks say nothing
    while i < n:
        v = values[i]
        if v is None:
            j = i
            while j < n and values[j] is None:
                j += 1
            toks.append("_" if j - i == 1 else f"_x{j - i}")
        elif math.isnan(v):
            toks.append("stale")
            j = i + 1
        else:
            nums = [_number(x) if x is not None and not math.isnan(x) else "" for x in values[i:n]]
            j = _run(values, i, n, nums)
            if j - i == 1:
                toks.append(nums[0])
            elif math.isinf(v):
                toks.append(f"{nums[0]}+0x{j - i - 1}")  # Infxn does not parse on promtool 2.42
            else:
                step = _number(float(nums[1]) - float(nums[0]))
                toks.append(
                    f"{nums[0]}x{j - i - 1}"
                    if step == "0"
                    else f"{nums[0]}{'' if step.startswith('-') else '+'}{step}x{j - i - 1}"
                )
        i = j
    return " ".join(toks)


def _run(values: Sequence[Value], i: int, n: int, nums: list[str]) -> int:
    """The end of the arithmetic run of exactly-written numbers that starts at ``i``."""
    if i + 1 >= n or not nums[1]:
        return i + 1
    a, b = float(nums[0]), float(nums[1])
    if math.isinf(a) or math.isinf(b):
        j = i + 1
        while j < n and nums[j - i] == nums[0]:
            j += 1
        return j
    d, j = b - a, i + 2
    while (
        j < n
        and nums[j - i]
        and not math.isinf(float(nums[j - i]))
        and _number(a + d * (j - i)) == nums[j - i]
        and float(nums[j - i]) == a + d * (j - i)
    ):
        j += 1
    return j


def input_series(scraped: Scraped, comments: dict[str, str] | None = None) -> str:
    """The ``input_series:`` block (indented for a test in ``tests:``), series in a stable order."""
    lines = ["    input_series:"]
    for key in sorted(scraped.values, key=_order):
        if comments and key in comments:
            lines.append(f"      # {comments[key]}")
        lines.append(f"      - series: '{key}'")
        lines.append(f"        values: '{encode(scraped.values[key])}'")
    return "\n".join(lines) + "\n"


def _order(key: str) -> tuple[str, str]:
    name, labels = key.split("{", 1)
    return labels, name


def decode(text: str) -> list[Value]:
    """The inverse of ``encode``: promtool's notation expanded, one value per interval."""
    out: list[Value] = []
    for tok in text.split():
        if tok == "stale":
            out.append(math.nan)
        elif tok.startswith("_"):
            out.extend([None] * (int(tok[2:]) if tok.startswith("_x") else 1))
        elif "x" in tok:
            head, times = tok.rsplit("x", 1)
            split = max(head.rfind("+"), head.rfind("-"))
            if split > 0 and head[split - 1] not in "eE":
                start, step = float(head[:split]), float(head[split:])
            else:
                start, step = float(head), 0.0
            out.extend(start + step * i for i in range(int(times) + 1))
        else:
            out.append(float(tok))
    return out
