"""The sweep loop: run each configuration, judge it, skip what cannot fit, stop cleanly on Ctrl-C.

A run *ran out of memory* when the child caught an OOM (the allocator counted one, or its stderr
says so), when it was killed by a signal the sweep did not send (SIGKILL is what the kernel's OOM
killer sends), or when its peak went over the limit. It *fits* when none of that happened.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from memexporter.sweep.child import Child, Outcome, Timing
from memexporter.sweep.grid import Axis, Params, SweepError, dominates, label, plan, substitute
from memexporter.units import MiB

# What PyTorch (CUDA, ROCm, MPS), Python, the C++ runtime and the demo's simulated OOM print.
_OOM_TEXT = re.compile(
    r"OutOfMemoryError|out of memory|\bMemoryError\b|std::bad_alloc|Cannot allocate memory|simulated OOM", re.IGNORECASE
)
_PORT_TAKEN = re.compile(r"Address already in use|Errno 98")
PORT_RETRIES = 3


@dataclass
class Run:
    """One configuration and what it measured (bytes and seconds; ``None`` where not measured)."""

    params: dict[str, str]
    argv: list[str] = field(default_factory=list)
    status: str = "not run"  # ok | oom | failed | interrupted | skipped
    device: str | None = None
    steps: int = 0
    peak_bytes: float | None = None  # CUDA: reserved high-water mark; cpu: peak RSS
    peak_allocated_bytes: float | None = None
    peak_reserved_bytes: float | None = None
    peak_rss_bytes: float | None = None
    baseline_bytes: float | None = None
    split: dict[str, float] | None = None
    step_seconds: float | None = None
    limit_bytes: float | None = None
    oom: bool = False
    oom_reason: str | None = None
    fits: bool | None = None
    skipped_by: dict[str, str] | None = None  # the smaller run that ran out of memory
    exit_code: int | None = None
    error: str | None = None
    wall_seconds: float | None = None
    abort: str | None = None  # set when the sweep cannot go on: the command failed before its first step

    @property
    def skipped(self) -> bool:
        return self.status == "skipped"


@dataclass
class Sweep:
    """One sweep: the grid's axes, the command with its ``{NAME}`` placeholders, optimizer steps per run,
    ``--limit-mib``, and the runs so far; ``interrupted`` after Ctrl-C, ``error`` when it could not go on."""

    axes: list[Axis]
    command: list[str]
    steps: int
    limit_mib: float | None
    runs: list[Run] = field(default_factory=list)
    interrupted: bool = False
    error: str | None = None

    @property
    def limit_bytes(self) -> float | None:
        """``--limit-mib``, else the lowest limit any run's OOM view reported."""
        if self.limit_mib is not None:
            return self.limit_mib * MiB
        seen = [r.limit_bytes for r in self.runs if r.limit_bytes is not None]
        return min(seen) if seen else None


def tail_lines(text: str, lines: int = 15) -> str:
    """The last ``lines`` lines of ``text``, each indented four spaces (a command's output in a message)."""
    return "\n".join("    " + line for line in text.rstrip().splitlines()[-lines:])


def judge(run: Run, out: Outcome, limit_mib: float | None) -> None:
    """Fill ``run`` from the child's outcome: figures, OOM, fits, status."""
    obs = out.observed
    run.steps, run.exit_code, run.wall_seconds, run.step_seconds = (
        obs.steps,
        out.exit_code,
        out.wall_seconds,
        out.step_seconds,
    )
    run.device = obs.device if obs.scrapes else None
    dev = run.device or "cpu"
    run.peak_rss_bytes = max(out.max_rss, obs.peaks.get("cpu", 0.0), obs.host_rss) or None
    run.peak_allocated_bytes = obs.peak_allocated.get(dev)
    run.peak_reserved_bytes = obs.peak_reserved.get(dev)
    # What the device must provide: on CUDA the reserved mark (the allocator's cache and fragmentation
    # included: a reservation is what fails), on the host the resident set.
    run.peak_bytes = (run.peak_reserved_bytes or obs.peaks.get(dev)) if dev != "cpu" else run.peak_rss_bytes
    run.baseline_bytes = obs.baselines.get(dev)
    # Rows read before any step show no gradients or optimizer state yet: unknown, not 0 bytes.
    run.split = (
        obs.split
        if obs.split is None or obs.split_steps > 0
        else {k: v for k, v in obs.split.items() if k not in ("gradients", "optimizer_state")}
    )
    run.limit_bytes = limit_mib * MiB if limit_mib is not None else obs.limits.get(dev)
    ours = out.stopped_by is not None
    oom_line = next((ln.strip() for ln in reversed(out.stderr.splitlines()) if _OOM_TEXT.search(ln)), None)
    if obs.ooms > 0:
        run.oom_reason = f"the allocator counted {obs.ooms:.0f} OOM(s) (memexporter_allocator_ooms_total)"
    elif oom_line is not None:  # a crash, or an OOM the script caught and reported
        run.oom_reason = f"out of memory: {oom_line[:160]}"
    elif not ours and out.exit_code in (-signal.SIGKILL, 128 + signal.SIGKILL):
        run.oom_reason = "killed by SIGKILL, which the sweep did not send (the kernel's OOM killer?)"
    elif run.peak_bytes is not None and run.limit_bytes is not None and run.peak_bytes > run.limit_bytes:
        run.oom_reason = f"peak {run.peak_bytes / MiB:.1f} MiB over the limit {run.limit_bytes / MiB:.1f} MiB"
    run.oom = run.oom_reason is not None
    if run.oom:
        run.status, run.fits = "oom", False
    elif out.stopped_by == "interrupt":
        run.status = "interrupted"  # fits stays unknown: the run did not finish
    elif out.stopped_by == "timeout":
        run.status, run.error = "failed", f"timed out at step {run.steps}"
    elif out.stopped_by == "exporter":
        run.status, run.error = "failed", "the exporter did not start in the child"
    elif not ours and out.exit_code != 0:
        run.status, run.error = "failed", f"exit code {out.exit_code} after {run.steps} step(s)"
    else:
        run.status, run.fits = "ok", run.peak_bytes is not None


def _no_step_error(run: Run, out: Outcome, timeout: float) -> tuple[str, str]:
    """Why a run that is not an OOM ended without a single step: short, and long with its output's tail."""
    who = f"{label(run.params)} ({' '.join(out.argv)})"
    if out.stopped_by == "exporter":
        why = "the exporter did not start in the child"
    elif out.stopped_by == "timeout":
        why = f"no training step within --timeout ({timeout:g} s)"
    elif out.exit_code != 0:
        why = f"the command failed before its first step (exit code {out.exit_code})"
    elif not out.observed.scrapes:
        why = (
            f"the command exited without ever serving /metrics on port {out.port}: run a Python training "
            "script (the exporter starts through PYTHONPATH and MEMEXPORTER_AUTOSTART), and leave the port to the sweep"
        )
    else:
        why = "the command exited without a training step (memexporter counts optimizer.step() and memexporter.step())"
    text = out.stderr.strip() or out.stdout.strip()
    return why, f"{who}: {why}" + (
        f"; its {'stderr' if out.stderr.strip() else 'stdout'} ends with:\n{tail_lines(text)}" if text else ""
    )


def measure(
    params: Params,
    argv: Sequence[str],
    steps: int,
    limit_mib: float | None,
    timing: Timing,
    on_poll: Callable[[int], None],
) -> tuple[Run, Outcome]:
    """Run one configuration (a fresh port when another process took the first)."""
    for attempt in range(PORT_RETRIES):
        try:
            out = Child(argv, steps, timing, on_poll).run()
        except OSError as exc:  # Popen: not found, not executable
            raise SweepError(f"{label(params)}: cannot start {argv[0]!r}: {exc.strerror or exc}") from None
        taken = out.observed.steps == 0 and _PORT_TAKEN.search(out.stderr) and not out.interrupted
        if not taken or attempt == PORT_RETRIES - 1:
            break
    run = Run(dict(params), list(argv))
    judge(run, out, limit_mib)
    if run.steps == 0 and not run.oom and not out.interrupted:
        run.status, run.fits = "failed", None
        run.error, run.abort = _no_step_error(run, out, timing.timeout)
    return run, out


def run_sweep(sweep: Sweep, timing: Timing, progress: Progress) -> Sweep:
    """Run the plan in order into ``sweep.runs``. Returns early (``sweep.interrupted`` or
    ``sweep.error``) on Ctrl-C or on a command that cannot be measured; what ran is kept."""
    todo = plan(sweep.axes)
    ooms: list[Params] = []
    try:
        for i, params in enumerate(todo):
            if blocker := next((o for o in ooms if dominates(sweep.axes, o, params)), None):
                run = Run(
                    dict(params),
                    substitute(sweep.command, params),
                    status="skipped",
                    fits=False,
                    skipped_by=dict(blocker),
                )
                sweep.runs.append(run)
                progress.done(i, len(todo), run)
                continue
            progress.start(i, len(todo), params)

            def on_poll(steps: int, i: int = i, params: Params = params) -> None:
                progress.step(i, len(todo), params, steps, sweep.steps)

            run, out = measure(params, substitute(sweep.command, params), sweep.steps, sweep.limit_mib, timing, on_poll)
            sweep.runs.append(run)
            progress.done(i, len(todo), run)
            if run.oom:
                ooms.append(params)
            if out.interrupted:
                sweep.interrupted = True
                break
            if run.abort is not None:
                sweep.error = run.abort
                break
    except KeyboardInterrupt:  # between runs: nothing is running
        sweep.interrupted = True
    return sweep


class Progress:
    """Where progress goes; ``report.TerminalProgress`` prints it."""

    def start(self, i: int, n: int, params: Params) -> None: ...
    def step(self, i: int, n: int, params: Params, steps: int, target: int) -> None: ...
    def done(self, i: int, n: int, run: Run) -> None: ...
