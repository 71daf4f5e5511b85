"""Run the healthy CPU demo several times from a fresh start and read its ETA at every step.

``python -m tests.support.healthy_demo --runs N --steps S [demo options]`` imports torch once, then
forks one child per run (two at a time, one per core): each child is a fresh training process as far
as the C heap and torch's caches go (the parent never trained), and runs ``memexporter demo``'s own
loop (``memexporter.cli.demo.run``) with the exporter on a free loopback port. The demo computes the
trend estimate after every step for its progress line; the child wraps that call and also asks the
estimator what it reads against a limit only 1 GiB above the step peak (the headroom at which issue
9's misread would have meant an OOM in six minutes). Prints one JSON line per run:
``{"run", "steps", "misreads": [[step, MiB per step, ETA s], ...], "max_leak_mib", "min_eta_s"}``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

import torch

from memexporter.cli import demo
from memexporter.oom.trend import TrendEstimate, TrendPoints, estimate

GIB = float(1 << 30)
DAY = 86400.0


def _one_run(run: int, argv: list[str], out: str) -> None:
    """In the child: the demo's loop, with its estimate call observed."""
    misreads: list[list[float]] = []
    reads = {"steps": 0, "max_leak": 0.0, "min_eta": math.inf}

    def observed(points: TrendPoints, limit: float | None) -> TrendEstimate:
        est = estimate(points, limit)
        tight = estimate(points, (points.last_peak or 0.0) + GIB)
        reads["steps"] = max(reads["steps"], max(points.steps, default=0))
        reads["max_leak"] = max(reads["max_leak"], abs(tight.leak_bytes_per_step))
        reads["min_eta"] = min(reads["min_eta"], tight.oom_eta_seconds, est.oom_eta_seconds)
        if tight.leak_bytes_per_step != 0 or tight.oom_eta_seconds <= DAY or est.oom_eta_seconds <= DAY:
            step = points.steps[-1] if points.steps else 0
            misreads.append(
                [step, tight.leak_bytes_per_step / (1 << 20), min(tight.oom_eta_seconds, est.oom_eta_seconds)]
            )
        return est

    setattr(demo, "estimate", observed)  # noqa: B010  # demo._status calls it after every step
    torch.set_num_threads(1)  # one run per core: two threads each would spin against each other
    parser = argparse.ArgumentParser(prog="memexporter demo")
    demo.add_arguments(parser)  # the demo's own options, as `memexporter demo` parses them
    args = parser.parse_args(argv)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115  # the demo's progress lines
    rc = demo.run(args)
    line = {
        "run": run,
        "rc": rc,
        "steps": reads["steps"],
        "misreads": misreads,
        "max_leak_mib": reads["max_leak"] / (1 << 20),
        "min_eta_s": None if math.isinf(reads["min_eta"]) else reads["min_eta"],
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(line, f)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.healthy_demo")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=260)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--out", help="folder for the per-run results (default: a new one under /tmp)")
    args, demo_args = parser.parse_known_args(argv)
    base = ["--device", "cpu", "--port", "0", "--addr", "127.0.0.1", "--steps", str(args.steps), *demo_args]
    out = args.out or os.path.join("/tmp", f"memexporter-healthy-{os.getpid()}")
    os.makedirs(out, exist_ok=True)
    children: set[int] = set()
    failed = 0

    def reap() -> None:
        nonlocal failed
        pid, status = os.wait()
        children.discard(pid)
        failed += os.waitstatus_to_exitcode(status) != 0

    for run in range(args.runs):
        while len(children) >= args.parallel:
            reap()
        pid = os.fork()
        if pid == 0:  # the child: train, report, leave without running the parent's cleanup
            code = 1
            try:
                _one_run(run, base, os.path.join(out, f"run-{run}.json"))
                code = 0
            finally:
                os._exit(code)
        children.add(pid)
    while children:
        reap()
    results: list[dict[str, Any]] = []
    for run in range(args.runs):
        path = os.path.join(out, f"run-{run}.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                results.append(json.load(f))
    for result in results:
        print(json.dumps(result))
    return 1 if failed or len(results) != args.runs else 0


if __name__ == "__main__":
    raise SystemExit(main())
