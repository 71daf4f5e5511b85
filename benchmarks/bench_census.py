"""Cost of the tensor census (``debug=True`` / ``oom_dump_dir``), on CPU.

1. A GPT-2-small-sized model (124 M parameters, AdamW, after a training step: parameters,
   gradients and optimizer state alive): the census itself and the holder walk for one growing
   group (milliseconds, median over ``--repeat``), the training step of the same model, and the
   census amortised over ``--every`` steps as a share of that step.
2. The same small GPT loop as ``bench_overhead.py`` with no exporter, ``start()`` and
   ``start(debug=True)``, alternating block by block in one run: the mean step time of each
   (the mean, not the median: a census is a rare, long step) and its ratio to the plain loop.

    python benchmarks/bench_census.py [--threads 1 --clock cpu] [--repeat 7] [--every 50] [--rounds 4 --block 200]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.nn.functional as F
from bench_overhead import GPT

import memexporter
from memexporter.diagnose import census
from memexporter.diagnose.holders import find_holders


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Median wall and CPU (this thread) seconds of ``fn()``."""
    walls, cpus = [], []
    for _ in range(repeat):
        w, c = time.perf_counter(), time.thread_time()
        fn()
        cpus.append(time.thread_time() - c)
        walls.append(time.perf_counter() - w)
    return statistics.median(walls), statistics.median(cpus)


def gpt2_small(args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    model = GPT(vocab=50257, d=768, layers=12, heads=12, ctx=1024)
    model.leak_store = [torch.ones(1, 2048) for _ in range(8)]  # type: ignore[assignment]  # a growing group's holder
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 50257, (args.batch, args.seq))

    def step() -> None:
        opt.zero_grad(set_to_none=True)  # first: the census below sees the gradients, as at a boundary
        loss = F.cross_entropy(model(x).flatten(0, 1), x.flatten())
        loss.backward()
        opt.step()

    step()
    params = sum(p.numel() for p in model.parameters())
    scan = census.take(1, None)
    print(
        f"GPT-2-small-sized model: {params / 1e6:.1f} M parameters, {scan.census.storages} storages, "
        f"{scan.census.bytes / 2**30:.2f} GiB in {scan.census.tensors} tensors"
    )
    del scan
    c_wall, c_cpu = timed(lambda: census.take(1, None), args.repeat)
    samples = model.leak_store[-4:]  # type: ignore[index]
    h_wall, h_cpu = timed(lambda: find_holders(samples), args.repeat)
    s_wall, s_cpu = timed(step, args.steps)
    print(f"  census        wall {c_wall * 1e3:8.1f} ms   cpu {c_cpu * 1e3:8.1f} ms")
    print(f"  holder walk   wall {h_wall * 1e3:8.1f} ms   cpu {h_cpu * 1e3:8.1f} ms   (one growing group, 4 samples)")
    print(
        f"  training step wall {s_wall * 1e3:8.1f} ms   cpu {s_cpu * 1e3:8.1f} ms   (batch {args.batch} x seq {args.seq})"
    )
    for label, cost, per_step in (("wall", c_wall, s_wall), ("cpu", c_cpu, s_cpu)):
        share = cost / args.every / per_step
        needed = math.ceil(cost / (0.005 * per_step))
        print(
            f"  {label:4s}: census every {args.every} steps costs {100 * share:.4f} % of the step "
            f"({cost / args.every * 1e3:.2f} ms/step); 0.5 % allows a census every {needed} steps"
        )


def overhead(args: argparse.Namespace, clock: Callable[[], float]) -> None:
    torch.manual_seed(0)
    model = GPT(ctx=64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randint(0, 512, (8, 64)), torch.randint(0, 512, (8, 64))

    def step() -> None:
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    variants: dict[str, dict[str, object] | None] = {
        "plain": None,
        "start": {},
        "start(debug)": {"debug": True, "census_every": args.every},
    }
    means: dict[str, list[float]] = {name: [] for name in variants}
    censuses = 0
    for _ in range(5):
        step()
    for r in range(args.rounds):
        for name in variants if r % 2 == 0 else reversed(list(variants)):
            options = variants[name]
            exp = memexporter.start(port=0, addr="127.0.0.1", **options) if options is not None else None
            t0 = clock()
            for _ in range(args.block):
                step()
            means[name].append((clock() - t0) / args.block)
            if exp is not None:
                if exp.diagnostics is not None and exp.diagnostics.diagnosis.findings is not None:
                    censuses += len(exp.diagnostics.diagnosis.findings.history)
                exp.stop()
        print(f"  round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    base = statistics.mean(means["plain"])
    print(
        f"Small GPT loop, {args.rounds} rounds x {args.block} steps per variant, mean step time ({args.clock} clock):"
    )
    for name, ms in means.items():
        paired = statistics.median(m / p for m, p in zip(ms, means["plain"], strict=True))
        print(
            f"  {name:13s} {statistics.mean(ms) * 1e3:8.2f} ms   ratio {statistics.mean(ms) / base:.4f}   "
            f"paired ratio {paired:.4f}"
        )
    print(f"  censuses taken in the debug blocks: {censuses}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7, help="censuses and holder walks timed")
    ap.add_argument("--steps", type=int, default=3, help="GPT-2-small training steps timed")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--every", type=int, default=50, help="census interval in steps (the default knob)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--block", type=int, default=200, help="steps per variant per round")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: the training thread's CPU time, census included (with --threads 1: immune to a busy machine)",
    )
    ap.add_argument("--skip-overhead", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    gpt2_small(args)
    if not args.skip_overhead:
        overhead(args, time.thread_time if args.clock == "cpu" else time.perf_counter)


if __name__ == "__main__":
    main()
