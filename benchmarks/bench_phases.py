"""What the exporter with its phases costs the training thread, per step.

One model trains on CPU in alternating blocks of ``--block`` steps for ``--rounds`` rounds, in three
arms, timed in the training thread's CPU time (``time.thread_time``):

- ``plain``: memexporter's trackers switched off (its global optimizer hooks return at once):
  the same loop without memexporter;
- ``shipped``: ``start()`` and ``track(model)`` as shipped: step tracking, module rows and the
  automatic forward/backward/optimizer phases;
- ``shipped+user``: the same, each step also inside ``with memexporter.phase("train")``, and the
  evaluation forward (every 10 steps, in every arm) inside ``memexporter.phase("eval")``.

A step takes three readings of memory (the end of the forward, before and after the optimizer
step: RSS and the high-water mark on CPU, one allocator-stats read per CUDA device); the automatic
phases share them and add only their bookkeeping. A user phase takes one reading at each end.

Reported: the median step of each arm and its ratio to ``plain`` (and "paired": the median of the
per-round ratios, which drift in the machine's speed disturbs least).

    python benchmarks/bench_phases.py [--layers 2 --d 64 --batch 4 --seq 32] [--rounds 30 --block 20]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn.functional as F

import memexporter
from benchmarks.bench_overhead import GPT
from memexporter.tracking import boundaries, phases

ARMS = ("plain", "shipped", "shipped+user")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--block", type=int, default=20)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: least noise)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT(d=args.d, layers=args.layers, heads=4, ctx=args.seq)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randint(0, 512, (args.batch, args.seq))
    y = torch.randint(0, 512, (args.batch, args.seq))
    exporter = memexporter.start(port=0, addr="127.0.0.1")
    handle = memexporter.track(model, opt)
    step_tracker, phase_tracker = exporter.sources.steps, exporter.sources.phases
    train, evaluation = memexporter.phase("train"), memexporter.phase("eval")

    def arm(name: str) -> None:
        """Switch the process to ``name``'s set-up (outside the timed block)."""
        boundaries.activate(None if name == "plain" else step_tracker, auto_step=True)
        phases.activate(None if name == "plain" else phase_tracker)

    def one_step(i: int, user: bool) -> None:
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i % 10 == 9:
            with evaluation if user else contextlib.nullcontext(), torch.no_grad():
                model(x)

    def block(name: str) -> float:
        arm(name)
        user = name == "shipped+user"
        t0 = time.thread_time()
        for i in range(args.block):
            if user:
                with train:
                    one_step(i, user)
            else:
                one_step(i, user)
        return (time.thread_time() - t0) / args.block

    for name in ARMS * 2:  # warm-up: allocator, caches, the first recording
        block(name)
    print(
        f"GPT layers={args.layers} d={args.d} batch={args.batch} seq={args.seq}, threads={args.threads}, "
        f"{args.rounds} rounds x {args.block} steps, CPU time of the training thread"
    )
    times: dict[str, list[float]] = {name: [] for name in ARMS}
    for r in range(args.rounds):
        for name in ARMS if r % 2 == 0 else ARMS[::-1]:
            times[name].append(block(name))
    med = {k: statistics.median(v) for k, v in times.items()}
    for name in ARMS:
        paired = statistics.median(t / q for t, q in zip(times[name], times["plain"], strict=True))
        extra = (med[name] - med["plain"]) * 1e6
        print(
            f"{name:>12}: {med[name] * 1e3:8.3f} ms/step  ratio {med[name] / med['plain']:.3f} "
            f"(paired {paired:.3f})  {extra:+7.1f} us/step"
        )
    arm("shipped")
    handle.remove()
    memexporter.stop()


if __name__ == "__main__":
    main()
