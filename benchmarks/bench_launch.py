"""The launch-bound stand-in: what memexporter costs a training thread that holds the GIL between tiny ops.

A GPT of tiny ops (d 16, 12 layers, 2 heads, batch 2 x 8, 126 modules) trains on one CPU thread. Each op does
almost nothing, so the step is spent in Python and in torch's dispatch, holding the GIL between ops, as the
training thread of a launch-bound GPU loop does between kernel launches (a small GPT on an H200 paid
x1.026-1.037 for ``start()`` and x1.088-1.111 for ``start()+track()`` in that regime; a GPU-bound model paid
nothing). Every moment another thread of the job holds the GIL, this loop waits: the benchmark that counts.

Two parts, each in interleaved rounds, each printed as paired ratios:

1. ``plain`` / ``start`` / ``start+track``: per round one block of each, in alternating order (ABC, CBA),
   a block being ``start()`` (and ``track()``) then an untimed settling of 0 to 1 s (random, so that any
   periodic work of the exporter falls anywhere in the timed part), then ``--block`` seconds timed, then
   ``stop()``. A round's ratio is the block's mean step (throughput: the steps that paid for background work
   count) over the ``plain`` block's of the same round.
2. ``flood`` / ``quiet``, with ``start()+track()`` running throughout: a client process of 4 threads
   requests every route (``/metrics`` as text, OpenMetrics+gzip and ``?name[]=``, ``/live.json``, ``/``,
   ``/healthz``) as fast as it can during the ``flood`` blocks. Also the job's own CPU time per block
   (``time.process_time``: every thread of the training process), flood minus quiet.

On a shared 2-core machine one step varies by +-15 % from one second to the next, so the figures are
robust ones: the median of the per-round ratios over at least 30 rounds, with its 95 % confidence interval
from order statistics (distribution-free), and the median step of each variant. Two clocks: the wall clock
(what a job feels; other engineers' processes move it) and the job's CPU time per step (``process_time``:
the training thread and every thread of the exporter in the job, the GIL time they take from training
included; another process on the machine moves it little, so it shows the job's own cost where the wall
clock's interval is too wide).

    python benchmarks/bench_launch.py [--rounds 30 --block 1.0] [--flood-rounds 30] [--part both|start|flood]
    python benchmarks/bench_launch.py --device cuda --d 256 --batch 2 --seq 128   # the H200's launch-bound GPT

Runs against whatever memexporter is importable, so the same command measures an older checkout.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import random
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.scraper import Client  # after the path: run as a script

ROUTES = (
    ("/metrics", ""),
    ("/metrics", "Accept: application/openmetrics-text;version=1.0.0\r\nAccept-Encoding: gzip\r\n"),
    ("/metrics?name[]=memexporter_steps_total&name[]=memexporter_memory_used_bytes", ""),
    ("/live.json", ""),
    ("/", ""),
    ("/healthz", ""),
)
FLOOD_THREADS = 4


def client(port: int) -> None:
    """The flood: ``FLOOD_THREADS`` threads cycling through ``ROUTES`` while stdin last said ``flood``."""
    on = threading.Event()
    counts = [0]

    def flood(offset: int) -> None:
        i = offset
        while True:
            on.wait()
            path, headers = ROUTES[i % len(ROUTES)]
            i += 1
            request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{headers}\r\n".encode()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                    s.sendall(request)
                    while s.recv(65536):
                        pass
                counts[0] += 1
            except OSError:
                time.sleep(0.01)

    for n in range(FLOOD_THREADS):
        threading.Thread(target=flood, args=(n,), daemon=True).start()
    for line in sys.stdin:
        if line.strip() == "flood":
            on.set()
        elif line.strip() == "quiet":
            on.clear()
        elif line.strip() == "count":
            print(counts[0], flush=True)


def median_ci(ratios: list[float]) -> tuple[float, float, float]:
    """The median of ``ratios`` and its 95 % confidence interval from order statistics (binomial, no
    assumption on the distribution: a round disturbed by the machine moves it by one rank at most)."""
    xs, n = sorted(ratios), len(ratios)
    k = max(0, math.floor(n / 2 - 1.96 * math.sqrt(n) / 2))
    return statistics.median(xs), xs[k], xs[min(n - 1, n - 1 - k)]


def line(name: str, wall: list[float], cpu: list[float], steps: list[float]) -> str:
    """A variant's paired ratios (wall clock and job CPU), with their 95 % intervals, and its median step."""
    (w, wlo, whi), (c, clo, chi) = median_ci(wall), median_ci(cpu)
    return (
        f"  {name:12s} wall x{w:.4f} (95% CI {wlo:.4f}..{whi:.4f})  job CPU x{c:.4f} (95% CI {clo:.4f}..{chi:.4f})  "
        f"median step {statistics.median(steps) * 1e3:6.2f} ms  [{len(wall)} rounds]"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--client", type=int, help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=30, help="rounds of plain/start/start+track (at least 30)")
    p.add_argument("--flood-rounds", type=int, default=30, help="rounds of flood/quiet")
    p.add_argument("--block", type=float, default=1.0, help="timed seconds per block")
    p.add_argument("--part", choices=["both", "start", "flood"], default="both")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: a launch-bound GPU loop itself")
    p.add_argument("--d", type=int, default=16, help="model width (the stand-in: 16)")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=8)
    args = p.parse_args()
    if args.client is not None:
        client(args.client)
        return

    import torch
    import torch.nn.functional as F

    import memexporter
    from benchmarks.bench_overhead import GPT

    logging.getLogger("memexporter").addHandler(logging.NullHandler())  # the "serving" line, once a block: not here

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    model = GPT(vocab=64, d=args.d, layers=args.layers, heads=2, ctx=args.seq).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = (torch.randint(0, 64, (args.batch, args.seq), device=args.device) for _ in range(2))

    def step() -> None:
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if args.device == "cuda":  # the benchmark's own measurement: the exporter never synchronises
            torch.cuda.synchronize()

    for _ in range(20):
        step()
    t0 = time.perf_counter()
    for _ in range(20):
        step()
    per_block = max(5, round(args.block / ((time.perf_counter() - t0) / 20)))
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else f"{os.cpu_count()} CPUs, 1 torch thread"
    print(
        f"torch {torch.__version__}, memexporter {memexporter.__version__}, {where}; d {args.d}, {args.layers} layers, "
        f"batch {args.batch} x {args.seq}, {sum(1 for _ in model.modules())} modules, {per_block} steps per timed block"
    )

    def timed(n: int) -> tuple[list[float], float]:
        steps, c0 = [], time.process_time()
        for _ in range(n):
            s0 = time.perf_counter()
            step()
            steps.append(time.perf_counter() - s0)
        return steps, time.process_time() - c0

    def settle() -> None:  # untimed steps for 0..1 s: periodic work of the exporter lands anywhere in the block
        end = time.perf_counter() + rng.random()
        while time.perf_counter() < end:
            step()

    state: dict[str, Any] = {}

    def start(track: bool) -> Callable[[], None]:
        def setup() -> None:
            state["exp"] = memexporter.start(port=0, addr="127.0.0.1")
            state["exp"].port  # noqa: B018 - serving before the block (where that is asynchronous: waits for it)
            if track:
                state["handle"] = memexporter.track(model, opt)

        return setup

    def teardown() -> None:
        if "handle" in state:
            state.pop("handle").remove()
        if "exp" in state:
            state.pop("exp").stop()

    if args.part in ("both", "start"):
        variants: dict[str, Callable[[], None]] = {
            "plain": lambda: None,
            "start": start(False),
            "start+track": start(True),
        }
        means: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}  # (wall, CPU) per step
        steps: dict[str, list[float]] = {name: [] for name in variants}
        for r in range(args.rounds):
            for name in variants if r % 2 == 0 else reversed(list(variants)):
                variants[name]()
                settle()
                ts, cpu = timed(per_block)
                teardown()
                means[name].append((statistics.fmean(ts), cpu / per_block))
                steps[name] += ts
        print("plain / start / start+track, interleaved (a round's ratio: the block's mean step over plain's)")
        for name in variants:
            pairs = list(zip(means[name], means["plain"], strict=True))
            print(line(name, [v[0] / b[0] for v, b in pairs], [v[1] / b[1] for v, b in pairs], steps[name]))

    if args.part in ("both", "flood"):
        start(True)()
        exp = state["exp"]
        flooder = Client(__file__, exp.port)
        tell = flooder.tell

        blocks: dict[str, list[tuple[float, float, float]]] = {"quiet": [], "flood": []}  # wall, CPU per step, per s
        steps = {"quiet": [], "flood": []}
        for r in range(args.flood_rounds):
            for name in ("quiet", "flood") if r % 2 == 0 else ("flood", "quiet"):
                tell(name)
                settle()
                ts, cpu = timed(per_block)
                blocks[name].append((statistics.fmean(ts), cpu / per_block, cpu / (sum(ts) or 1)))
                steps[name] += ts
        tell("quiet")
        tell("count")
        answered = int(flooder.answer())
        flooder.close()
        teardown()
        quiet, flood = blocks["quiet"], blocks["flood"]
        print(f"flood / quiet with start()+track(), interleaved ({answered} flood requests answered)")
        pairs = list(zip(flood, quiet, strict=True))
        print(line("quiet", [1.0] * len(quiet), [1.0] * len(quiet), steps["quiet"]))
        print(line("flood", [f[0] / q[0] for f, q in pairs], [f[1] / q[1] for f, q in pairs], steps["flood"]))
        med, lo, hi = median_ci([f[2] - q[2] for f, q in pairs])
        print(
            f"  job CPU seconds per wall second, flood minus quiet: {med * 1e3:+.1f} ms/s "
            f"(95% CI {lo * 1e3:+.1f} .. {hi * 1e3:+.1f}); quiet {statistics.median(q[2] for q in quiet):.3f} s/s"
        )


if __name__ == "__main__":
    main()
