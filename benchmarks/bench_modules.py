"""What per-module tracking costs the training thread, per tracked module per step.

Two identical models train side by side on CPU, one plain and one tracked (``track()`` once, as a
user would: the hooks stay on), in alternating blocks of ``--block`` steps for ``--rounds``
rounds, timed in the training thread's CPU time (``time.thread_time``: another process's load does
not count). Reported: the median step of each, their ratio (and the median of the per-round
ratios, "paired", which drift in the machine's speed disturbs least), and the extra time per
tracked module per step (``(tracked - plain) / modules``, modules = the root plus every hooked
module; "paired": ``(paired - 1) * plain / modules``).

Two regimes, because a forward is recorded at most once per ``RECORD_INTERVAL_S`` (1 s) and one
in ``RECORD_EVERY`` (8):

- ``steady``: as shipped. Fast steps pay for a recording once a second, slow ones (a large model
  on a GPU, slower than the interval) one step in eight.
- ``every``: every forward recorded (the bound a recorded forward costs; what every forward cost
  before the interval existed).

    python benchmarks/bench_modules.py [--layers 4 --d 128] [--rounds 15 --block 20]
    python benchmarks/bench_modules.py --layers 12 --d 512 --batch 8 --seq 256 --block 3   # a ~330 ms step

Runs against whatever memexporter is importable, so the same command measures an older checkout
(where every forward was recorded and ``--regime`` does not apply).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn.functional as F

from benchmarks.bench_overhead import GPT
from memexporter.tracking.modules import track

try:
    from memexporter.tracking import schedule
except ImportError:  # a checkout from before the record schedule: every forward recorded
    schedule = None  # type: ignore[assignment]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--block", type=int, default=20)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: least noise)")
    p.add_argument("--regime", choices=["steady", "every", "both"], default="both")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    plain = GPT(d=args.d, layers=args.layers, heads=4, ctx=args.seq)
    tracked = copy.deepcopy(plain)
    opts = {id(m): torch.optim.AdamW(m.parameters()) for m in (plain, tracked)}
    x = torch.randint(0, 512, (args.batch, args.seq))
    y = torch.randint(0, 512, (args.batch, args.seq))

    def block(model: torch.nn.Module) -> float:
        opt = opts[id(model)]
        t0 = time.thread_time()
        for _ in range(args.block):
            F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return (time.thread_time() - t0) / args.block

    handle = track(tracked, opts[id(tracked)], max_modules=1000)
    modules = 1 + len(handle.counts.plan.hooked)
    shipped, every = (schedule.RECORD_INTERVAL_S, schedule.RECORD_EVERY) if schedule else (None, 1)
    regimes = ["steady", "every"] if args.regime == "both" else [args.regime]
    if shipped is None:
        regimes = ["(every forward: this checkout has no record interval)"]
    for model in (plain, tracked, plain, tracked):  # warm-up: allocator, caches, the first recording
        block(model)
    print(
        f"GPT layers={args.layers} d={args.d} batch={args.batch} seq={args.seq}, threads={args.threads}, "
        f"{modules} tracked modules, {args.rounds} rounds x {args.block} steps, CPU time of the training thread"
    )
    for regime in regimes:
        if shipped is not None:
            schedule.RECORD_INTERVAL_S = 0.0 if regime == "every" else shipped
            schedule.RECORD_EVERY = 1 if regime == "every" else every
        times: dict[str, list[float]] = {"plain": [], "tracked": []}
        for r in range(args.rounds):
            order = ("plain", "tracked") if r % 2 == 0 else ("tracked", "plain")
            for name in order:
                times[name].append(block(plain if name == "plain" else tracked))
        med = {k: statistics.median(v) for k, v in times.items()}
        paired = statistics.median(t / q for t, q in zip(times["tracked"], times["plain"], strict=True))
        per_module = (med["tracked"] - med["plain"]) / modules * 1e6
        per_module_paired = (paired - 1) * med["plain"] / modules * 1e6  # less sensitive to drift
        print(
            f"{regime:>8}: plain {med['plain'] * 1e3:8.2f} ms  tracked {med['tracked'] * 1e3:8.2f} ms  "
            f"ratio {med['tracked'] / med['plain']:.3f} (paired {paired:.3f})  per module per step "
            f"{per_module:6.2f} us (paired {per_module_paired:6.2f} us)"
        )
    if shipped is not None:
        schedule.RECORD_INTERVAL_S, schedule.RECORD_EVERY = shipped, every
    handle.remove()


if __name__ == "__main__":
    main()
