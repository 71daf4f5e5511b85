"""Overhead of memexporter on an FSDP2 (``fully_shard``) training step: 2 CPU ranks under torchrun.

    torchrun --standalone --nproc-per-node=2 benchmarks/bench_fsdp2.py [--rounds 20] [--block 6]
    torchrun --standalone --nproc-per-node=2 benchmarks/bench_fsdp2.py --every-step   # worst case
    torchrun --standalone --nproc-per-node=2 benchmarks/bench_fsdp2.py --clock cpu    # a busy machine

Each rank trains bench_overhead's GPT (4 blocks, d=128, tied embedding/head, batch 8 x 64 tokens)
with ``fully_shard`` on each block and on the root, gloo, one compute thread per rank (the process
group's collectives run on CPU too). Three variants, interleaved block by block in one run with
bench_overhead's ``interleaved`` so drift hits them alike: ``plain`` (no memexporter), ``start``
(``memexporter.start()``: the server thread and the global optimizer step hooks) and
``start+track`` (also ``memexporter.track(model, optimizer)`` after ``fully_shard``). Every rank
runs the same sequence (their collectives pair up) and times its own steps; rank 0 prints the
median step time per variant, its ratio to ``plain`` (overall and paired: per round, then the
median over rounds) and the step-rate ratio. ``--every-step`` sets memexporter's recount
intervals to 0 (gradients, optimizer state and activations counted at every step instead of at
most once a second): the worst case, not the default.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
import torch.distributed as dist
from bench_overhead import GPT, VARIANTS, Job, interleaved, pct
from torch.distributed.fsdp import fully_shard

import memexporter.tracking.gradients as mx_optimizer
import memexporter.tracking.schedule as mx_schedule

NAMES = ("plain", "start", "start+track")


def build(batch: int, seq: int) -> Job:
    torch.manual_seed(0)  # the same initial model on every rank
    model = GPT(ctx=seq)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    g = torch.Generator().manual_seed(1 + dist.get_rank())  # each rank its own batch
    x = torch.randint(0, 512, (batch, seq), generator=g)
    y = torch.randint(0, 512, (batch, seq), generator=g)
    return Job(model, torch.optim.AdamW(model.parameters(), lr=1e-3), x, y)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--block", type=int, default=6, help="steps per variant per round")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank (default 1)")
    ap.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: the training thread's CPU time (what memexporter's hooks add, immune to a busy "
        "machine; leaves out waiting in collectives and the server thread's work)",
    )
    ap.add_argument(
        "--every-step",
        action="store_true",
        help="count gradients, state and activations at every step (memexporter's intervals set to 0)",
    )
    args = ap.parse_args()
    if "RANK" not in os.environ:
        ap.error("run under torchrun: torchrun --standalone --nproc-per-node=2 benchmarks/bench_fsdp2.py")
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.every_step:
        mx_optimizer.STEP_COUNT_INTERVAL_S = 0.0
        mx_schedule.RECORD_INTERVAL_S, mx_schedule.RECORD_EVERY = 0.0, 1
    job = build(args.batch, args.seq)
    for _ in range(5):  # warm-up: allocator, optimizer state, oneDNN kernels, gloo connections
        job.step()
    if rank == 0:
        print(
            f"torch {torch.__version__}, FSDP2 fully_shard per block, {world} ranks, gloo, cpu, "
            f"{args.threads} thread(s) per rank, {args.clock} clock, {args.rounds} rounds x {args.block} steps per variant, "
            f"batch {args.batch} x seq {args.seq} per rank"
            + (", memexporter counting every step" if args.every_step else ", memexporter defaults"),
            flush=True,
        )
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    times = interleaved(job, {name: VARIANTS[name] for name in NAMES}, args.rounds, args.block, clock)
    if rank == 0:
        base, base_mean = statistics.median(times["plain"]), statistics.fmean(times["plain"])
        for name, ts in times.items():
            blocks = [
                statistics.median(ts[i : i + args.block]) / statistics.median(times["plain"][i : i + args.block])
                for i in range(0, len(ts), args.block)
            ]
            print(
                f"  {name:12s} median step {statistics.median(ts) * 1e3:8.2f} ms  p90 {pct(ts, 0.9) * 1e3:8.2f} ms  "
                f"ratio {statistics.median(ts) / base:.4f}  paired ratio {statistics.median(blocks):.4f}  "
                f"step rate x{base_mean / statistics.fmean(ts):.4f}",
                flush=True,
            )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
