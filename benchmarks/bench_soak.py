"""The long soak with faults: does anything leak, in either process, over the run this project exists for?

A model trains in this process with ``memexporter.start(debug=True)`` and ``track()``: first a quiet run
(``--quiet`` seconds, half before the soak and half after: nothing but the exporter), then ``--duration`` seconds
during which

- a client process (``soak_load.py``) scrapes at ``--scrape-rate`` a second over every route (``/metrics`` as text,
  OpenMetrics+gzip and ``?name[]=``, ``/live.json``, ``/``, ``/healthz``) and asks ``/debug/memory`` every
  ``--debug-every`` seconds;
- the helper is killed (SIGKILL) every ``--kill-every`` seconds, and the time until its port answers again taken;
- the training loop forks a child every ``--fork-every`` seconds (as a DataLoader worker: some tensor work,
  ``step()``, ``flush()``, exit), reaped as ``multiprocessing`` does.

Every ``--sample-every`` seconds it reads both processes (RSS, descriptors, threads from ``/proc``) and the zombies
among the job's children. Step times are kept as one median per 10 s window (the soak must not grow its own
memory). It reports, after ``--warmup`` seconds of the soak: the job's RSS growth, the helper's RSS growth within
each of its lives (a restart starts a new process) and from one life to the next, descriptors and threads at the
start and the end in both, zombies, restarts (``memexporter_helper_restarts_total``) against the kills, the
restart latencies, and the step time under the soak against the quiet run (with the quiet run's own spread).

    python benchmarks/bench_soak.py --duration 1800                      # the issue's 30-minute soak
    python benchmarks/bench_soak.py --duration 60 --kill-every 20 --fork-every 15 --json out.json   # the test's

``--pace`` sleeps that many seconds after each step (the suite's version: a job that is not at full CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.soak_load import as_dict, get, sample, zombies  # after the path: run as a script


class Soak:
    """The run's state and its figures; ``run()`` drives it, ``report()`` sums it up."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        import memexporter

        self.args, self.torch, self.memexporter = args, torch, memexporter
        torch.manual_seed(0)
        torch.set_num_threads(args.threads)  # one: the stand-in's training thread, not a pool spinning on 2 cores
        layers: list[torch.nn.Module] = []
        for _ in range(args.layers):
            layers += [torch.nn.Linear(args.width, args.width), torch.nn.GELU(), torch.nn.LayerNorm(args.width)]
        self.model = torch.nn.Sequential(*layers)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.x = torch.randn(args.batch, args.width)
        self.exp = memexporter.start(port=0, addr="127.0.0.1", debug=True, model=self.model)
        assert self.exp.port is not None, "the exporter did not bind"
        self.port = self.exp.port
        self.windows: dict[str, list[float]] = {"quiet": [], "soak": []}  # median step (s) per 10 s window
        self.samples: list[dict[str, Any]] = []
        self.kills: list[dict[str, Any]] = []
        self.forks = 0
        self.children: list[int] = []  # forked, not reaped yet

    def step(self) -> float:
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        self.model(self.x).square().mean().backward()
        self.opt.step()
        return time.perf_counter() - t0

    def train(self, seconds: float, phase: str, soak: bool = False) -> None:
        """Train ``seconds``; during the soak, the faults and the samples come from this loop, between steps."""
        start = now = time.monotonic()
        window: list[float] = []
        window_end, next_kill = start + 10, start + self.args.kill_every
        next_fork, next_sample = start + self.args.fork_every, start
        while now - start < seconds:
            window.append(self.step())
            if self.args.pace:
                time.sleep(self.args.pace)
            now = time.monotonic()
            if now >= window_end:
                self.windows[phase].append(statistics.median(window))
                window, window_end = [], now + 10
            self.reap()
            if not soak:
                continue
            if now >= next_sample:
                self.look(now - start)
                next_sample = now + self.args.sample_every
            if now >= next_kill:
                self.kill(now - start)
                next_kill = time.monotonic() + self.args.kill_every
            if now >= next_fork:
                self.fork()
                next_fork = now + self.args.fork_every
        if window:
            self.windows[phase].append(statistics.median(window))

    def look(self, at: float) -> None:
        helper = self.exp.helper_pid
        self.samples.append(
            {
                "at": round(at, 1),
                "job": as_dict(sample(os.getpid())),
                "helper": as_dict(sample(helper)) if helper is not None else None,
                "zombies": len(zombies(os.getpid())),
            }
        )

    def kill(self, at: float) -> None:
        """SIGKILL the helper; train on while waiting for its port to answer again (on a thread of the loop's
        own: a few GETs, as a scraper would)."""
        pid = self.exp.helper_pid
        if pid is None:
            self.kills.append({"at": at, "pid": None})
            return
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        back = None
        while time.monotonic() - killed < 30:
            self.step()
            if get(self.port, "/healthz", timeout=1.0) == 200:
                back = time.monotonic() - killed
                break
        self.kills.append({"at": round(at, 1), "pid": pid, "answering_after_s": back})

    def fork(self) -> None:
        """A child as a DataLoader worker is: tensor work, the exporter's calls (no-ops there), exit."""
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                (self.torch.randn(64, self.args.width) * 2).sum()
                self.memexporter.step()
                code = 3 if self.exp.flush() else 0  # 3: the child published
                time.sleep(1.0)
            finally:
                os._exit(code)
        self.forks += 1
        self.children.append(pid)

    def reap(self) -> None:
        for pid in list(self.children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                self.children.remove(pid)
                if status != 0:
                    print(f"a forked child exited with status {status}", file=sys.stderr)

    def run(self) -> dict[str, Any]:
        half = self.args.quiet / 2
        self.train(half, "quiet")
        load = subprocess.Popen(
            [
                sys.executable,
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "soak_load.py"),
                str(self.port),
                str(self.args.scrape_rate),
                str(self.args.debug_every),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "SOAK_TOKEN": self.token()},
        )
        self.train(self.args.duration, "soak", soak=True)
        counts = json.loads(load.communicate(timeout=60)[0] or "{}")  # its stdin closed: it stops and counts
        self.train(half, "quiet")
        while self.children:
            self.reap()
            time.sleep(0.05)
        self.look(self.args.duration + self.args.quiet)
        report = self.report(counts)
        self.exp.stop()
        return report

    def token(self) -> str:
        diagnostics = self.exp.diagnostics
        assert diagnostics is not None and diagnostics.token is not None
        return str(diagnostics.token.value)

    def report(self, counts: dict[str, Any]) -> dict[str, Any]:
        from benchmarks.soak_report import summarise

        restarts = self.exp.registry.get_sample_value("memexporter_helper_restarts_total", {"rank": "0"})
        return summarise(
            self.args, self.samples, self.windows, self.kills, self.forks, restarts, counts, zombies(os.getpid())
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=1800.0, help="seconds of soak (faults and load)")
    p.add_argument("--quiet", type=float, default=120.0, help="seconds of quiet run, half before and half after")
    p.add_argument("--warmup", type=float, default=120.0, help="seconds of the soak before figures count")
    p.add_argument("--scrape-rate", type=float, default=10.0, help="scrapes a second over every route")
    p.add_argument("--debug-every", type=float, default=10.0, help="seconds between /debug/memory requests")
    p.add_argument("--kill-every", type=float, default=300.0, help="seconds between SIGKILLs of the helper")
    p.add_argument("--fork-every", type=float, default=60.0, help="seconds between forked children")
    p.add_argument("--sample-every", type=float, default=10.0, help="seconds between looks at both processes")
    p.add_argument("--pace", type=float, default=0.0, help="seconds slept after each step")
    p.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--json", help="write the report there as JSON too")
    args = p.parse_args()
    from benchmarks.soak_report import text

    report = Soak(args).run()
    print(text(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
