"""Cost of OTLP push: an export cycle's own time, and the training step with and without it.

The same small GPT on CPU as bench_overhead.py. Variants alternate block by block (the order
reversed every other round): ``start`` (the exporter serving /metrics, no OpenTelemetry) and
``start+otlp`` (the same, plus ``otel=True`` pushing over OTLP/HTTP every ``--interval-ms``, far
more often than the SDK's 60 s default, to magnify the cost). The OTLP receiver runs in another
process (tests/support/otlp.py), so decoding there does not compete for this process' GIL.
A third variant, ``start again``, repeats ``start``: its ratio shows the machine's noise.
Reports the median step time of each, the ratio to ``start`` (plain and paired per round), the
pushes received, and the p50/p99 of one export cycle (``force_flush``: a registry walk, the
encoding and the HTTP POST) timed on its own.

    python benchmarks/bench_otel.py [--rounds 10] [--block 30] [--interval-ms 100] [--threads 1]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
from bench_overhead import GPT, Job, interleaved, pct

import memexporter


def _receiver(endpoint: Any, done: Any, count: Any) -> None:
    from tests.support.otlp import OtlpHttpReceiver

    with OtlpHttpReceiver() as rx:
        endpoint.put(rx.endpoint)
        done.wait()
        count.put(len(rx.snapshot()))


def _start(job: Job) -> None:
    job.state["exporter"] = memexporter.start(port=0, addr="127.0.0.1")


def _start_otlp(job: Job) -> None:
    job.state["exporter"] = memexporter.start(port=0, addr="127.0.0.1", otel=True)


def _stop(job: Job) -> None:
    job.state.pop("exporter").stop()


# "start again" is the same as "start": its ratio is the noise of this machine (an A/A control).
VARIANTS = {"start": (_start, _stop), "start+otlp": (_start_otlp, _stop), "start again": (_start, _stop)}


def bench_cycle(repeat: int) -> list[float]:
    """Seconds per export cycle, forced back to back (collect, encode, POST, answer)."""
    exp = memexporter.start(port=0, addr="127.0.0.1", otel=True)
    assert exp.otel is not None and exp.otel.push is not None, "OTLP push did not start"
    provider = exp.otel.push.provider
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        provider.force_flush()
        out.append(time.perf_counter() - t0)
    exp.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--block", type=int, default=30, help="steps per variant per round (several intervals)")
    ap.add_argument("--interval-ms", type=int, default=100)
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: the training thread's CPU time (leaves out waits for the GIL and for a busy machine)",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ctx = mp.get_context("spawn")
    endpoint, count, done = ctx.Queue(), ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_receiver, args=(endpoint, done, count), daemon=True)
    proc.start()
    os.environ.update(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint.get(timeout=60), "OTEL_METRIC_EXPORT_INTERVAL": str(args.interval_ms)}
    )
    torch.manual_seed(0)
    model = GPT()
    job = Job(
        model,
        torch.optim.AdamW(model.parameters(), lr=1e-3),
        torch.randint(0, 512, (8, 64)),
        torch.randint(0, 512, (8, 64)),
    )
    for _ in range(5):
        job.step()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.clock} clock, {args.rounds} rounds x "
        f"{args.block} steps per variant, push every {args.interval_ms} ms"
    )
    times = interleaved(
        job, VARIANTS, args.rounds, args.block, time.thread_time if args.clock == "cpu" else time.perf_counter
    )
    cycle = bench_cycle(args.cycles)
    done.set()
    pushes = count.get(timeout=60)
    proc.join(timeout=30)
    base = statistics.median(times["start"])
    for name, ts in times.items():
        blocks = [
            statistics.median(ts[i : i + args.block]) / statistics.median(times["start"][i : i + args.block])
            for i in range(0, len(ts), args.block)
        ]
        print(
            f"  {name:12s} median step {statistics.median(ts) * 1e3:8.2f} ms  p90 {pct(ts, 0.9) * 1e3:8.2f} ms  "
            f"ratio {statistics.median(ts) / base:.4f}  paired ratio {statistics.median(blocks):.4f}"
        )
    print(
        f"  export cycle: p50 {pct(cycle, 0.5) * 1e3:.2f} ms  p99 {pct(cycle, 0.99) * 1e3:.2f} ms "
        f"({len(cycle)} cycles); {pushes} pushes received in all"
    )


if __name__ == "__main__":
    main()
